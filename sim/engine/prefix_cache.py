"""A replica's prefix cache: KV blocks identified by the content they hold, as vLLM's block pool.

vLLM caches every full block of every request (prompt and output) under the identity of all
content up to its end; a request reuses the leading blocks it shares with anything cached and
nothing after the first block that differs. The simulator has lengths, not token ids: a request
names its shared content as a chain of nested prefixes, `((key, end_tokens), ...)` with
ascending ends, where a key stands for all content up to its end (a ToT state's text, a path's
reasoning so far); block i (tokens up to `(i + 1) * block_size`) is then `(key of the first
link ending at or after it, its end)`. A request without a chain has one link, `(group,
prefix_tokens)`, if it is in a prefix group, else none. Past its chain, a request's content is
its own: only the request itself can find those blocks again (recomputing after a preemption).

A cached block is referenced by the running requests that hold it; one no request references
stays cached (counted in `evictable`) until a KV allocation needs the room. vLLM's free queue
hands out uncached blocks first, then cached ones in the order they were freed (a request frees
its last block first). A request's own blocks are freed together, so they sit in that order as
one run, `(OWN, idx)`, evicted from its end, as one entry: the cost is per request, not per
block.
"""

from __future__ import annotations

from sim.engine.request_state import Req

OWN = "\0own"
"""the first element of an own-blocks run's key (no chain key is this string)"""


def chain_blocks(r: Req, block_size: int) -> int:
    """Full blocks of the request's shared content (its chain's, or its prefix group's)."""
    if r.chain:
        return r.chain[-1][1] // block_size
    return r.prefix_tokens // block_size if r.group >= 0 else 0


class PrefixCache:
    """Block identity -> reference count, in eviction order, with the unreferenced counted."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.refs: dict[tuple, int] = {}
        self.runs: dict[int, list[int]] = {}  # request idx -> [first, end) of its own blocks
        self.evictable = 0

    def block_ids(self, r: Req, start: int, stop: int) -> list[tuple]:
        """Identities of the request's shared content blocks start..stop-1."""
        bs = self.block_size
        chain = r.chain or ((r.group, r.prefix_tokens),)
        out, j = [], 0
        for i in range(start, stop):
            end = (i + 1) * bs
            while chain[j][1] < end:
                j += 1
            out.append((chain[j][0], end))
        return out

    def lookup(self, r: Req) -> tuple[list[tuple], int, int]:
        """The cache hit of a request about to be scheduled (never its last token: the engine
        computes it to sample): its leading shared blocks cached, how many of its own blocks
        follow them, and how many of those blocks no request holds (they leave the free pool)."""
        if not r.reads_cache:
            return [], 0, 0
        limit = (r.target - 1) // self.block_size
        shared = chain_blocks(r, self.block_size)
        refs, hit, free = self.refs, [], 0
        for b in self.block_ids(r, 0, min(shared, limit)):
            ref = refs.get(b)
            if ref is None:
                return hit, 0, free
            hit.append(b)
            free += ref == 0
        run = self.runs.get(r.idx)
        own = 0
        if run is not None and len(hit) == shared and run[0] == shared:
            own = max(0, min(run[1], limit) - shared)
        return hit, own, free + own

    def take(self, r: Req, hit: list[tuple], own: int) -> int:
        """The request holds the blocks `lookup` found. A scoring request whose hit reaches the
        prompt positions it needs log-probabilities for is marked `rescore`: vLLM returns none
        for cached positions, so the live engine runs it with the cache, then again without
        (`Cluster` re-submits it when it ends). The request's own blocks it did not take are
        dropped from the cache: the blocks freed."""
        refs = self.refs
        for b in hit:
            if refs[b] == 0:
                self.evictable -= 1
            refs[b] += 1
        freed = self.drop_run(r.idx) - own if own else 0
        n = len(hit)
        r.held, r.shared, r.blocks = (hit if n else None), n, r.blocks + own
        r.computed = (n + own) * self.block_size
        r.rescore = bool(r.score_from) and r.computed >= r.score_from
        return freed

    def drop_run(self, idx: int) -> int:
        """Take a request's own cached blocks out of the cache; how many there were."""
        run = self.runs.pop(idx, None)
        if run is None:
            return 0
        del self.refs[(OWN, idx)]
        self.evictable -= run[1] - run[0]
        return run[1] - run[0]

    def evict(self, gain: int) -> int:
        """Drop unreferenced blocks, least recently freed first, until `gain` blocks are free (or
        none is left); the blocks freed."""
        victims, got, runs = [], 0, self.runs
        for b, ref in self.refs.items():
            if got >= gain:
                break
            if ref:
                continue
            if b[0] == OWN:
                run = runs[b[1]]
                m = min(gain - got, run[1] - run[0])
                run[1] -= m  # a request's last block was freed first
                got += m
                if run[0] < run[1]:
                    continue
                del runs[b[1]]
            else:
                got += 1
            victims.append(b)
        for b in victims:
            del self.refs[b]
        self.evictable -= got
        return got

    def demote(self, owned) -> int:
        """Queue the unreferenced blocks `owned(key)` picks first for eviction, keeping their
        order (Dynasor's idle-program hint: `engines.vllm_engine.VllmEngine.demote` does the
        same to vLLM's free queue); how many entries moved. Costs a pass over the cache."""
        first = [b for b, ref in self.refs.items() if ref == 0 and owned(b)]
        if first:
            order = dict.fromkeys(first, 0)
            order.update(self.refs)  # the rest after them, in their order
            self.refs = order
        return len(first)

    def release(self, r: Req) -> None:
        """A request frees its blocks: its full blocks stay cached by content (its own ones as
        one run, queued before its shared ones: vLLM frees a request's last block first); the
        caller frees the rest (`r.blocks`)."""
        self.store(r, r.computed)
        shared = chain_blocks(r, self.block_size)
        full = r.computed // self.block_size
        if full > shared:
            freed = self.drop_run(r.idx)  # an older run it could not reach again
            r.blocks += freed - (full - shared)
            self.refs[(OWN, r.idx)] = 0
            self.runs[r.idx] = [shared, full]
            self.evictable += full - shared
        if r.shared:
            self.unref(r)

    def unref(self, r: Req) -> None:
        """A request stops holding its shared cached blocks. Blocks no one holds any more queue
        for eviction in the order they were freed, a request's last block first."""
        refs = self.refs
        for b in reversed(r.held):
            ref = refs.pop(b) - 1
            refs[b] = ref  # re-inserted: the end of the queue
            if ref == 0:
                self.evictable += 1
        r.held = None
        r.shared = 0

    def store(self, r: Req, computed_tokens: int) -> None:
        """Tokens up to `computed_tokens` are scheduled: the newly full blocks of its shared
        content join the cache now, held by the request, as vLLM caches blocks when it
        allocates them (a request admitted later in the same step reads them: its attention
        runs after the step writes them). A block already cached beside it stays private."""
        full = min(chain_blocks(r, self.block_size), computed_tokens // self.block_size)
        if full <= r.shared:
            return
        refs = self.refs
        held = r.held if r.held is not None else []
        for b in self.block_ids(r, r.shared, full):
            if b in refs:
                break
            refs[b] = 1
            held.append(b)
            r.blocks -= 1
            r.shared += 1
        r.held = held

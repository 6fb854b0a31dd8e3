"""A replica's prefix cache: KV blocks identified by the prompt content they hold.

As in vLLM, a full block of a prompt is cached under the identity of everything up to its end,
so a request reuses the leading blocks it shares with any earlier prompt and nothing after the
first block that differs. The simulator has lengths, not token ids: a request names its prompt's
content as a chain of nested prefixes, `((key, end_tokens), ...)` with ascending ends, where a
key stands for all content up to its end (a ToT state's text, a path's reasoning so far); block
i (tokens up to `(i + 1) * block_size`) is then `(key of the first link ending at or after it,
its end)`. A request without a chain has one link, `(group, prefix_tokens)`: requests of a
prefix group share it up to their own prefix length.

A cached block is referenced by the running requests that hold it; a block no request
references stays cached (counted in `evictable`) until a KV allocation needs the room, in the
order blocks were freed.
"""

from __future__ import annotations

from sim.engine.request_state import Req


class PrefixCache:
    """Block identity -> reference count, in eviction order, with the unreferenced counted."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.refs: dict[tuple, int] = {}
        self.evictable = 0

    def block_ids(self, r: Req, start: int, stop: int) -> list[tuple]:
        """Identities of the request's full prompt blocks start..stop-1."""
        bs = self.block_size
        chain = r.chain or ((r.group, r.prefix_tokens),)
        out, j = [], 0
        for i in range(start, stop):
            end = (i + 1) * bs
            while chain[j][1] < end:
                j += 1
            out.append((chain[j][0], end))
        return out

    def evict(self, gain: int) -> int:
        """Drop unreferenced blocks, least recently used first, until `gain` blocks are free (or
        none is left); the blocks freed."""
        victims = []
        for b, ref in self.refs.items():
            if len(victims) >= gain:
                break
            if ref == 0:
                victims.append(b)
        for b in victims:
            del self.refs[b]
        self.evictable -= len(victims)
        return len(victims)

    def unref(self, r: Req) -> None:
        """A request stops holding its cached blocks. Blocks no one holds any more queue for
        eviction in the order they were freed, a request's last block first (vLLM's free
        queue: a prefix's tail goes before its head, which other prompts are likelier to
        share)."""
        refs = self.refs
        for b in reversed(r.held):
            ref = refs.pop(b) - 1
            refs[b] = ref  # re-inserted: the end of the queue
            if ref == 0:
                self.evictable += 1
        r.held = None
        r.shared = 0

    def hit(self, r: Req) -> None:
        """A request about to prefill takes the leading blocks of its prompt that are cached
        (never its last token: the engine computes it to sample). A scoring request whose hit
        reaches the prompt positions it needs log-probabilities for is marked `rescore`: vLLM
        returns none for cached positions, so the live engine runs it with the cache, then
        again without (`Cluster` re-submits it when it ends)."""
        bs = self.block_size
        refs = self.refs
        ids = self.block_ids(r, 0, min(r.prefix_tokens, r.target - 1) // bs)
        n = 0
        for b in ids:
            if b not in refs:
                break
            n += 1
        r.rescore = bool(r.score_from) and n * bs >= r.score_from
        if not n:
            return
        held = ids[:n]
        for b in held:
            if refs[b] == 0:
                self.evictable -= 1
            refs[b] += 1
        r.held = held
        r.shared = n
        r.computed = n * bs

    def store(self, r: Req, computed_tokens: int) -> None:
        """A prefill chunk is scheduled to compute the prompt up to `computed_tokens`: its newly
        full prompt blocks join the cache now, held by the request, as vLLM caches blocks when
        it allocates them (a request admitted later in the same step reads them: its attention
        runs after the step writes them). A block already cached beside it stays private."""
        full = min(r.prefix_tokens, computed_tokens) // self.block_size
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

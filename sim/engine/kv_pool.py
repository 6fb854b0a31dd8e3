"""A replica's KV pool: blocks allocated per request, whole-prompt admission, preemption.

The block accounting of vLLM v1's KV cache manager, as the replica (`sim.engine.replica`) and
its lazy variant use it: a request holds the blocks its computed tokens need (beyond those it
borrows from the prefix cache); a waiting request is admitted only where its whole prompt fits
(`scheduler_reserve_full_isl`); a preempted request frees its blocks and recomputes from the
start. Mixed into `Replica`, whose `cfg`, `free_blocks`, `prefix_cache`, `running`, `waiting`,
`width` and `res` it reads.
"""

from __future__ import annotations

from sim.engine.request_state import PREEMPTED, Req


class KvPool:
    """KV block methods of a replica."""

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _alloc(self, r: Req, tokens_after: int) -> bool:
        need = self._blocks_for(tokens_after) - r.shared - r.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            self.free_blocks += self.prefix_cache.evict(need - self.free_blocks)
            if need > self.free_blocks:
                return False
        self.free_blocks -= need
        r.blocks += need
        return True

    def _fits_whole(self, r: Req) -> bool:
        """Whether the blocks of the request's whole prompt (and output so far, after a
        preemption) fit in the free and evictable blocks."""
        need = self._blocks_for(r.target) - r.shared - r.blocks
        return need <= self.free_blocks + self.prefix_cache.evictable

    def _release(self, r: Req) -> None:
        if self._caching:  # its full blocks stay cached by content
            self.prefix_cache.release(r)
        self.free_blocks, r.blocks = self.free_blocks + r.blocks, 0

    def _take_hit(self, r: Req, budget: int, lookahead: int) -> bool:
        """Admit a waiting request's cache hit and first chunk where its whole prompt fits
        (the hit's unreferenced blocks leave the free pool); False, nothing changed, where not."""
        cache = self.prefix_cache
        hit, own, unheld = cache.lookup(r)
        held = len(hit) + own
        need = self._blocks_for(r.target) - held - r.blocks
        computed = held * self.cfg.block_size
        first = self._blocks_for(computed + min(r.target - computed, budget) + lookahead) \
            - held - r.blocks
        if max(need, first) + unheld > self.free_blocks + cache.evictable:
            return False
        self.free_blocks += cache.take(r, hit, own)
        return self._alloc(r, r.computed + min(r.target - r.computed, budget) + lookahead)

    def _preempt(self, victim: Req) -> None:
        self.running.remove(victim)
        self._release(victim)
        victim.computed = 0
        victim.target = victim.prompt + victim.generated
        victim.status = PREEMPTED
        self.res.preemptions[victim.idx] += 1
        self.waiting.appendleft(victim)  # priority mode: re-sorted by (priority, arrival)

    def _unschedule(self, sched: list, victim: Req) -> int:
        """Take a request about to be preempted out of the step it was scheduled into, as
        vLLM does; the tokens it was charged."""
        at = next(m for m, (q, _) in enumerate(sched) if q is victim)
        n = sched.pop(at)[1]
        return self.width if victim.computed >= victim.target else n

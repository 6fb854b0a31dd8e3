"""A replica's decoding requests advanced together by one iteration clock (lazy accounting).

Every running request in decode gains one token an iteration (no speculation), so its computed
and generated tokens are its values at the clock it joined plus the iterations since: a run of k
iterations costs one clock addition, not a write per request. The aggregates a step needs are
kept as the cohort changes: members, their context, new KV blocks they need (counted by their
context's residue modulo the block size, so the blocks of j more iterations cost at most a
block size of additions), and who finishes first (a heap on the clock a member finishes at).
"""

from __future__ import annotations

import heapq


class DecodeCohort:
    """The decoding requests of one replica without per-request work per iteration."""

    def __init__(self, block_size: int):
        self.bs = block_size
        self.clock = 0           # decode iterations the replica has run
        self.n = 0               # members
        self.off_sum = 0         # sum of (computed - clock) over members
        self.seeded = 0          # members that sample with a seed (`sim.step_time.sampling_cost`)
        self.residues = [0] * block_size  # members by (computed - clock) mod block size
        # (finish clock, pos, req): a request joins a cohort once (re-prefilling after a
        # preemption rebuilds the cohort), so pos breaks every tie
        self._heap: list[tuple[int, int, object]] = []

    def add(self, r) -> None:
        """A running request starts decoding (its computed/generated are current)."""
        r.clock0 = self.clock
        off = r.computed - self.clock
        self.n += 1
        self.seeded += r.seeded
        self.off_sum += off
        self.residues[off % self.bs] += 1
        heapq.heappush(self._heap, (self.clock + r.output - r.generated, r.pos, r))

    def sync(self, r) -> None:
        """Bring a member's computed/generated/blocks up to the clock (blocks: those of its
        computed tokens, as after every iteration)."""
        d = self.clock - r.clock0
        r.computed += d
        r.generated += d
        r.blocks = -(-r.computed // self.bs) - r.shared
        r.clock0 = self.clock

    def remove(self, r) -> None:
        """A member leaves (finished, aborted): synced first."""
        self.sync(r)
        off = r.computed - self.clock
        self.n -= 1
        self.seeded -= r.seeded
        self.off_sum -= off
        self.residues[off % self.bs] -= 1
        r.clock0 = -1  # its heap entry, if still there, is stale from now on

    def context(self) -> int:
        """Members' context after one more iteration (vLLM's count: computed + 1)."""
        return self.off_sum + self.n * (self.clock + 1)

    def blocks_between(self, a: int, b: int) -> int:
        """New KV blocks members need going from clock a to clock b (a <= b): one each time a
        member's computed tokens fill a block."""
        n_cycles, rest = divmod(b - a, self.bs)
        need = n_cycles * self.n
        res, bs = self.residues, self.bs
        for t in range(a + n_cycles * self.bs, b):
            need += res[-t % bs]
        return need

    def remaining(self) -> int:
        """Iterations until the first member finishes."""
        heap = self._heap
        while heap[0][2].clock0 < 0:  # aborted since it joined
            heapq.heappop(heap)
        return heap[0][0] - self.clock

    def finished(self) -> list:
        """Members whose output is complete at the clock (popped from the heap, unsynced)."""
        out, heap, clock = [], self._heap, self.clock
        while heap and heap[0][0] <= clock:
            r = heapq.heappop(heap)[2]
            if r.clock0 >= 0:
                out.append(r)
        return out

    def run_length(self, free_blocks: int) -> int:
        """Iterations (>= 1) the cohort can run before a member finishes or the blocks it needs
        beyond the planned iteration exceed `free_blocks` (`sim.engine.run_length`, in closed
        form)."""
        k_max = self.remaining()
        if k_max <= 1:
            return 1
        bs, res, t0 = self.bs, self.residues, self.clock
        # j iterations need the blocks filled at clocks t0+1 .. t0+j-1: whole cycles of a block
        # size add one per member, then step one clock at a time (at most a block size).
        cycles = min((k_max - 1) // bs, free_blocks // self.n)
        j, used = 1 + cycles * bs, cycles * self.n
        if used + self.n <= free_blocks:  # fewer than a block size left: each needs <= 1 more
            return k_max
        while j < k_max:
            add = res[-(t0 + j) % bs]
            if used + add > free_blocks:
                break
            used += add
            j += 1
        return j

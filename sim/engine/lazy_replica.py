"""The replica's fast path: decoding requests accounted lazily, so an event costs what changes.

`Replica` touches every running request at every step boundary (its decode tokens, its KV
blocks, whether it finished), so a simulation's cost grows with the batch, hence with output
length. `LazyReplica` keeps the decoding requests in a `DecodeCohort` (one clock for all; KV
blocks and the context by aggregate; the next finish from a heap) and touches a request only
when it is admitted, prefills, finishes, is aborted or preempted. Where a step could preempt,
would run out of token budget among running requests, or a feature needs per-request work
(speculative decoding, a shared device, engine-state or log-probability costs), it syncs the
cohort and composes that step as `Replica` does. `Replica` is the reference: simulations with
`fast_forward=False` use it alone, and the tests require equal results, step for step
(`tests/test_lazy_replica.py`, `tests/test_sim.py`).
"""

from __future__ import annotations

from operator import attrgetter

from sim.engine.decode_cohort import DecodeCohort
from sim.engine.replica import Replica
from sim.engine.request_state import FINISHED, Req
from sim.step_time.plan import StepPlan

_POS = attrgetter("pos")


class LazyReplica(Replica):
    """A `Replica` whose decoding requests advance by one clock (`sim.engine.decode_cohort`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        plain = self.spec is None and self.device is None and self.engine is None \
            and self.fast_forward
        self.cohort = DecodeCohort(self.cfg.block_size) if plain else None
        self.prefilling: list[Req] = []  # running requests not decoding yet, in running order
        self._stale = False       # the cohort was synced out for a reference step: rebuild
        self._lazy_step = False   # the step in flight was composed lazily
        self._aborted: list[Req] = []  # members aborted while their iteration was in flight
        self._to_reference = False  # a request with log-probability costs came: per request

    def submit(self, req: Req) -> None:
        """A request arrives at this replica."""
        if self.cohort is not None and (req.lp_prompt_ms or req.lp_sample_ms):
            # float sums in the reference's order: switch at the next step boundary
            self._to_reference = True
        super().submit(req)

    def abort(self, r: Req) -> None:
        """Stop a request at the next iteration boundary (vLLM aborts between steps)."""
        co = self.cohort
        if co is None or r.status is FINISHED or r.aborted or r.clock0 < 0:
            super().abort(r)
            if r.status is FINISHED and r in self.prefilling:
                self.prefilling.remove(r)
            return
        if self._lazy_step and self.busy and not self._ending:  # its iteration is in flight
            r.aborted = True
            self.res.aborted[r.idx] = True
            self._aborted.append(r)
            if self.run is not None:
                self._truncate()
            return
        co.remove(r)
        super().abort(r)

    # ------------------------------------------------------------------ cohort upkeep
    def _sync_out(self) -> None:
        """Bring every member up to date and leave the requests to the reference step."""
        co = self.cohort
        for r in self.running:
            if r.clock0 >= 0:
                co.sync(r)
                r.clock0 = -1
        self._stale = True

    def _rebuild(self) -> None:
        self.cohort = co = DecodeCohort(self.cfg.block_size)
        self.prefilling = []
        for r in self.running:
            if r.computed >= r.target:
                co.add(r)
            else:
                self.prefilling.append(r)
        self._stale = False

    # ------------------------------------------------------------------ scheduling
    def _plan(self) -> None:
        """Decide the next iteration (or run of iterations) at an iteration boundary."""
        if self.cohort is None:
            return super()._plan()
        if self._to_reference:
            if not self._stale:
                self._sync_out()
            self.cohort, self._lazy_step = None, False
            return super()._plan()
        if self._stale:
            self._rebuild()
        if not self._plan_lazy(self.env.now + self._host_s):
            self._sync_out()
            self._lazy_step = False
            super()._plan()

    def _plan_lazy(self, now: float) -> bool:
        """Compose the step with the cohort untouched but its clock; False (nothing changed)
        where the reference must: a preemption, or running requests short of token budget."""
        co, cfg = self.cohort, self.cfg
        bs, budget, pre = cfg.block_size, cfg.max_num_batched_tokens, self.prefilling
        if co.n > budget:
            return False
        budget -= co.n
        if pre and self.running[-len(pre)] is not pre[0] and \
                sum(r.target - r.computed for r in pre) > budget:
            return False  # decoders after a prefill chunk: who gets the budget is by order
        need = co.residues[-co.clock % bs]  # members whose next token starts a block
        sched: list[tuple[Req, int]] = []
        for r in pre:
            if budget <= 0:
                break
            n = min(r.target - r.computed, budget)
            budget -= n
            sched.append((r, n))
            need += max(0, self._blocks_for(r.computed + n) - r.shared - r.blocks)
        if need > self.free_blocks:
            return False  # the reference preempts
        self.free_blocks -= co.residues[-co.clock % bs]
        prefill_tokens = context = 0
        seeded = co.seeded  # every member samples a token
        for r, n in sched:
            self._alloc(r, r.computed + n)
            if self._caching:
                self.prefix_cache.store(r, r.computed + n)
            prefill_tokens += n
            context += r.computed + n
            if r.computed + n >= r.target:  # the prompt's last chunk samples a token
                seeded += r.seeded
        self._host_s, self._added = 0.0, False
        first = len(sched)
        budget, _, seeded, c, p, n_new = self._admit(now, budget, sched, 0.0, seeded)
        self.prefilling.extend(r for r, _ in sched[first:])
        if not sched and not co.n:
            self.busy, self.run, self._lazy_step = False, None, False
            return True
        self._lazy_step = True
        self._launch(now, StepPlan(sched, prefill_tokens + p, first + n_new, co.n,
                                   context + c + co.context(), 0.0, seeded))
        return True

    def _stable_run_length(self) -> int:
        """Iterations the current all-decode batch can run unchanged (>= 1)."""
        if not self._lazy_step:
            return super()._stable_run_length()
        return 1 if self._head_admissible() else self.cohort.run_length(self.free_blocks)

    def _advance(self, k: int, t_end: float) -> list[Req]:
        """Apply the step's k finished iterations to its requests; those now done, in order."""
        if not self._lazy_step:
            return super()._advance(k, t_end)
        co = self.cohort
        co.clock += k
        if k > 1:  # the blocks of iterations 2..k (the planned one allocated its own)
            self.free_blocks -= co.blocks_between(co.clock - k + 1, co.clock)
        done = co.finished()
        if self._aborted:
            done += [r for r in self._aborted if r not in done]
            self._aborted = []
        for r in done:
            co.remove(r)
        first_token_s = self.res.first_token_s
        for r, n in self._sched:  # prefill chunks (a step with one is a single iteration)
            r.computed += n
            if r.computed >= r.target:
                r.generated += 1  # the prefill's last chunk samples a token
                if r.generated == 1:  # first token (a re-prefill after preemption has more)
                    first_token_s[r.idx] = t_end
                self.prefilling.remove(r)
                if r.generated < r.output and not r.aborted:
                    co.add(r)
            if r.generated >= r.output or r.aborted:
                done.append(r)
                if r.computed < r.target:
                    self.prefilling.remove(r)
        if len(done) > 1:
            done.sort(key=_POS)  # the reference's order: the running list's
        self._lazy_step = False
        return done

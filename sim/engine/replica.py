"""One serving replica: vLLM-v1-like continuous batching over a paged KV cache, fast-forwarded.

Each scheduling decision mirrors vLLM v1: running requests first (decode 1 token, or the next
prefill chunk), then waiting requests in queue order while there is a sequence slot, token budget
and KV room; a running request that cannot get a KV block preempts the newest running request
(recompute: its blocks are freed, it re-prefills prompt + generated tokens later).

Speed: when an iteration is decode-only and admission is blocked (nothing waiting, no free
sequence slot, or no KV room), the batch cannot change until a request finishes or a KV block
runs out, so the replica schedules ONE event for the whole run of iterations (closed form from
the latency model). An arrival that could be admitted truncates the run at the iteration
boundary after it (solved in closed form), so results equal a per-iteration simulation.
With `spec` (in-engine speculative decoding, `sim.engine.spec_decode`) a decode iteration holds
1 + K tokens, yields 1 + accepted. The reference: `lazy_replica` is its faster equal where it can.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from functools import partial

import numpy as np

from sim.step_time.calibration import Calibration
from sim.step_time.latency import iterations_within, run_ms
from sim.step_time.plan import StepPlan, StepPricer
from sim.engine.kv_pool import KvPool
from sim.engine.prefix_cache import PrefixCache
from sim.engine.request_state import (FINISHED, RUNNING, WAITING, PriorityWaiting,
                                      Req, Results, entry_totals, priority_key, step_totals)
from sim.engine.engine_state import EngineState
from sim.step_time.spells import prefill_noise, speed_levels, step_noise
from sim.engine.replica_config import ReplicaConfig
from sim.engine.run_length import decode_run_length
from sim.engine.spec_decode import spec_tokens


class Replica(KvPool):
    """A replica driven by SimPy timeouts: one event per run of iterations."""

    def __init__(self, env, replica_id: int, cal: Calibration, cfg: ReplicaConfig,
                 results: Results, rng: np.random.Generator | None, on_finish=None,
                 fast_forward: bool = True, device=None,
                 spec_rng: np.random.Generator | None = None):
        self.env, self.id = env, replica_id
        self.pricer = StepPricer(cal, cfg.enable_prefix_caching)  # a step plan priced whole
        self.lat = self.pricer.model  # the loop's gap between two steps included
        self._mean_ms = self.pricer.mean_ms  # bound once: called every step
        self.cfg = cfg
        self.res = results
        self.rng = rng  # None = deterministic (mean latency)
        # The fit minimises relative error, so its prediction sits below the mean duration: the
        # residual ratio's mean (a smearing estimate) restores it in mean mode; sampled latency
        # draws each step's own noise beside the levels below (`step_time.spells.step_noise`).
        self._noise_q, self.noise_mean, self.noise_std = step_noise(self.lat, rng is not None)
        self._prefill_q = prefill_noise(self.lat, rng is not None)
        # Sampled latency: the machine's speed for the run and its spells per window of time
        # (`step_time.spells`), where the model has measured them; they multiply each residual.
        self.drift, self.spells = speed_levels(self.lat, rng)
        self.run_factor = self.drift
        self.on_finish = on_finish
        # False: an event per iteration (reference; a shared device's replicas take turns)
        self.fast_forward = fast_forward and device is None
        self.device = device
        # The loop's host time (`sim.step_time.host_time`): adding requests delays the next step (on
        # a shared device, the device's), the first most; an idle loop wakes first (`submit`).
        self.add_s, self.add_more_s = cal.add_request_ms / 1e3, cal.add_more_ms / 1e3
        self.wake_s, self._host_s = cal.wake_ms / 1e3, 0.0
        self._added = False  # a request added since the last step (the next one costs less)
        self.waiting = PriorityWaiting() if cfg.priority_scheduling else deque()
        self._arrivals = itertools.count()
        self._positions = itertools.count()  # admissions: the running list's order
        self._ending = False  # inside _on_end: no iteration is in flight
        self.running: list[Req] = []
        self.free_blocks = cfg.usable_blocks
        self.prefix_cache = PrefixCache(cfg.block_size)
        # prefix caching applies to requests of a prefix group (>= 0) when enabled
        self._caching = cfg.enable_prefix_caching
        self.busy, self.gen = False, 0  # gen: invalidates a truncated run's end event
        self.run: tuple | None = None  # (start, a_ms, b_ms, factor, k) of a decode run
        self.outstanding_tokens = 0
        self.busy_s = 0.0
        self.engine = EngineState(self.lat.echoes) if getattr(self.lat, "engine_state", False) \
            else None  # what some step-time models charge for (sim/step_time/serving_latency.py)
        # Speculation: an iteration schedules 1 + K tokens, holds KV for K more (the draft's:
        # vLLM's num_lookahead_tokens), yields 1 + accepted (drawn from its own generator).
        self.spec = cfg.spec
        self.width, self.lookahead = (1 + cfg.spec.k, cfg.spec.k) if cfg.spec else (1, 0)
        self.spec_rng = spec_rng if spec_rng is not None else np.random.default_rng(replica_id)

    # ------------------------------------------------------------------ public
    def submit(self, req: Req) -> None:
        """A request arrives at this replica."""
        req.seq = next(self._arrivals)
        if self.device is None:
            self._host_s += self.add_more_s if self._added else self.add_s
            self._added = True
        elif self.add_s or self.add_more_s:
            self.device.add(self.env.now, self.add_s, self.add_more_s)
        self.waiting.append(req)
        self.outstanding_tokens += req.prompt + req.output
        if not self.busy and self.device is None and not self.wake_s:
            self._plan()
        elif not self.busy:  # compose once every request of this instant (of an idle loop's
            self.busy, self._sched = True, []  # wake) is in, as the live loop's step does
            self.env.timeout(self.wake_s if self.device is None else 0).callbacks.append(
                lambda _e: self._plan())
        elif self.run is not None and len(self.running) < self.cfg.max_num_seqs:
            self._truncate()

    def abort(self, r: Req) -> None:
        """Stop a request at the next iteration boundary (vLLM aborts between steps)."""
        if r.status is FINISHED or r.aborted:
            return
        r.aborted = True
        self.res.aborted[r.idx] = True
        if r in self.waiting:
            self.waiting.remove(r)
            self._finish(r)
            return
        in_flight = not self._ending and self.busy and any(q is r for q, _ in self._sched)
        if not in_flight:
            self.running.remove(r)
            self._finish(r)
            return
        if self.run is not None:  # end the run of iterations at the boundary after now
            self._truncate()
        # _on_end finishes it once the iteration in flight completes

    def _finish(self, r: Req) -> None:
        r.status = FINISHED
        self._release(r)
        self.res.finish_s[r.idx] = self.env.now
        self.res.output_tokens[r.idx] = r.generated
        self.outstanding_tokens -= r.prompt + r.output
        if self.on_finish is not None:
            self.on_finish(r)

    # ------------------------------------------------------------------ scheduling
    def _plan(self) -> None:
        """Decide the next iteration (or run of iterations) at an iteration boundary."""
        if self.device is not None and not self.device.take(self):
            self.busy, self._sched = True, []  # waiting for its turn: submissions only queue
            return
        if self.device is None:  # the loop's host time first (a run truncated meanwhile: 1 step)
            now, self._host_s, self._added = self.env.now + self._host_s, 0.0, False
        else:
            now = max(self.env.now, self.device.busy_until)
        cfg, budget = self.cfg, self.cfg.max_num_batched_tokens
        sched: list[tuple[Req, int]] = []
        prefill_tokens = prefill_seqs = context = preempted = 0
        bs, w, la, running = cfg.block_size, self.width, self.lookahead, self.running
        lp_ms, seeded = 0.0, 0  # log-probabilities the step returns, sequences seeded
        # Totals summed as entries are scheduled (`step_totals` again after a preemption)
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            if r.computed >= r.target and -(-(r.computed + w + la) // bs) <= r.shared + r.blocks:
                sched.append((r, 1))  # a decode iteration within the blocks it holds: usual
                budget -= w
                i += 1
                context += r.computed + w
                lp_ms, seeded = lp_ms + r.lp_sample_ms, seeded + r.seeded
                continue
            prefill = r.computed < r.target
            n = min(r.target - r.computed, budget) if prefill else 1
            while not self._alloc(r, r.computed + (n if prefill else w) + la):
                victim = self.running[-1] if not cfg.priority_scheduling else \
                    max(self.running, key=priority_key)
                if self.running.index(victim) < i:  # scheduled already (priority mode only)
                    i -= 1
                    budget += self._unschedule(sched, victim)
                self._preempt(victim)
                preempted += 1
                if victim is r:
                    break
            else:
                sched.append((r, n))
                if self._caching and prefill:
                    self.prefix_cache.store(r, r.computed + n)
                budget -= n if prefill else w
                i += 1
                c, p, lp_ms, seeded = entry_totals(r, n, w, lp_ms, seeded)
                context, prefill_tokens, prefill_seqs = context + c, prefill_tokens + p, \
                    prefill_seqs + (p > 0)
                continue
            break  # r itself was preempted: as vLLM's, the step schedules no later request
        if not preempted:  # as vLLM's: a step that preempted admits no waiting request
            budget, lp_ms, seeded, c, p, n = self._admit(now, budget, sched, lp_ms, seeded)
            context, prefill_tokens, prefill_seqs = context + c, prefill_tokens + p, \
                prefill_seqs + n
        if not sched and preempted:  # its one candidate preempted itself (priority mode):
            return self._plan()        # compose anew at once, as vLLM's next step does
        if not sched:
            self.busy, self.run = False, None
            self._release_device()
            return
        if preempted:
            prefill_tokens, prefill_seqs, context, lp_ms, seeded = step_totals(sched, w)
        self._launch(now, StepPlan(sched, prefill_tokens, prefill_seqs, len(sched) - prefill_seqs,
                                   context, lp_ms, seeded, preempted))

    def _admit(self, now: float, budget: int, sched: list, lp_ms: float, seeded: int,
               ) -> tuple[int, float, int, int, int, int]:
        """Admit waiting requests while a slot, budget and KV room last: (budget left, lp ms and
        seeded sequences so far, and the context, prefill tokens and sequences they add)."""
        la, w = self.lookahead, self.width
        context = prefill_tokens = prefill_seqs = 0
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            r = self.waiting[0]
            # vLLM admits a request only where its whole prompt fits (`scheduler_reserve_full_isl`)
            # though it allocates the first chunk alone
            if self._caching and not r.computed:
                if not self._take_hit(r, budget, la):
                    break
                n = min(r.target - r.computed, budget)
            else:
                n = min(r.target - r.computed, budget)
                if not self._fits_whole(r) or not self._alloc(r, r.computed + n + la):
                    break
            self.waiting.popleft()
            r.pos = next(self._positions)  # running order, kept as an attribute
            self.running.append(r)
            if r.status is WAITING:  # first scheduled
                self.res.scheduled_s[r.idx] = now
                # As vLLM reports it: the prompt tokens found cached when the request is first
                # scheduled; re-prefills after a preemption do not add to it.
                self.res.cached_tokens[r.idx] = r.computed
            r.status = RUNNING
            sched.append((r, n))
            if self._caching:
                self.prefix_cache.store(r, r.computed + n)
            budget -= n
            c, p, lp_ms, seeded = entry_totals(r, n, w, lp_ms, seeded)
            context, prefill_tokens, prefill_seqs = context + c, prefill_tokens + p, \
                prefill_seqs + (p > 0)
        return budget, lp_ms, seeded, context, prefill_tokens, prefill_seqs

    def _launch(self, now: float, plan: StepPlan) -> None:
        """Price the composed step (a run of decode iterations where it may fast-forward),
        record it and schedule its end."""
        step_ms, plain = self._mean_ms(plan, self.engine, now)
        prefill_tokens, decode_seqs, context, preempted = \
            plan.prefill_tokens, plan.decode_seqs, plan.context_tokens, plan.preempted
        if self.spells is not None:
            self.run_factor = self.drift * self.spells.at(now)
        factor = self._noise(1, prefill_tokens > 0)
        k, echo_ms, echo_at = 1, 0.0, 0
        a_ms, b_ms = step_ms, 0.0
        closed = None
        if self.fast_forward and plain and prefill_tokens == 0 and preempted == 0 \
                and decode_seqs == len(self.running):
            head = self.pricer.echo_head(self.engine)  # the run's first iterations carry it
            # sampled latency draws an echo step's own noise (its draws as before runs took it)
            if not head[1] or self.rng is None:
                # None: the step-time model has no closed form; step one event per iteration.
                closed = self.lat.decode_run(decode_seqs, context - decode_seqs)
        if closed is not None:
            k = self._stable_run_length()
            if k > 1 and self.spells is not None:  # a run ends at its speed level's window edge
                k = min(k, max(1, iterations_within(*closed[:2], (self.spells.end_s() - now)
                                                    * 1e3 / (self.run_factor * self.noise_mean),
                                                    *head)))
            if k > 1:
                echo_ms, echo_at = head
                # speculative: the context grows by the mean tokens an iteration yields
                a_ms, b_ms = closed[0], closed[1] * (self.spec.tokens_per_iteration
                                                     if self.spec else 1.0)
                factor = self._noise(k)
        # The log-probability and seeded-sampling terms were fitted beyond the mean step
        # (`step_time.logprob_cost`, `step_time.sampling_cost`): they take no residual factor.
        if plan.logprob_ms > 0.0 or plan.seeded_seqs:
            a_ms += self.pricer.extra_ms(plan) / factor
        self.busy, self._seg_start = True, now
        self._seg_index = self.res.add_segment((
            self.id, now, k, a_ms, b_ms, factor, prefill_tokens, plan.prefill_seqs,
            decode_seqs, context, len(self.running), len(self.waiting),
            # used as vLLM counts them: cached blocks no request holds are free
            self.cfg.kv_blocks - self.free_blocks - self.prefix_cache.evictable,
            self.cfg.kv_blocks, preempted, echo_ms, echo_at))
        # Only multi-iteration runs can be truncated; a single iteration always completes.
        self.run = (now, a_ms, b_ms, factor, k, echo_ms, echo_at) if k > 1 else None
        self._sched = plan.scheduled
        self.gen += 1
        t_end = now + run_ms(a_ms, b_ms, k, echo_ms, echo_at) * factor / 1e3
        if self.device is not None:
            self.device.busy_until, self.device.added = t_end, False
        self._schedule_end(t_end, k)

    def _stable_run_length(self) -> int:
        """Iterations the current all-decode batch can run unchanged (>= 1)."""
        return 1 if self._head_admissible() else decode_run_length(
            self.running, self.free_blocks, self.cfg.block_size, self.spec is not None)

    def _head_admissible(self) -> bool:
        """Whether the head of the queue could be admitted next iteration (its whole prompt
        fits: `_fits_whole`, before any prefix-cache hit)."""
        if not self.waiting or len(self.running) >= self.cfg.max_num_seqs:
            return False
        need = self._blocks_for(self.waiting[0].target)
        return need <= self.free_blocks + self.prefix_cache.evictable

    def _noise(self, k: int, prefill: bool = False) -> float:
        if self.rng is None:
            return self.noise_mean
        # Sum of k iid multiplicative residuals ~ normal (CLT); exact for k == 1 via resampling.
        if k == 1:
            q = self._prefill_q if prefill else self._noise_q
            return self.run_factor * math.exp(q[int(self.rng.integers(len(q)))])
        return self.run_factor * max(0.05, self.noise_mean + self.noise_std / math.sqrt(k)
                                     * self.rng.standard_normal())

    def _schedule_end(self, t_end: float, k: int) -> None:
        self.env.timeout(t_end - self.env.now).callbacks.append(
            partial(self._on_end, self.gen, k, t_end))
        self.res.events += 1

    def _truncate(self) -> None:
        start, a_ms, b_ms, factor, k, echo_ms, echo_at = self.run
        k_new = iterations_within(a_ms, b_ms, (self.env.now - start) * 1e3 / factor, echo_ms,
                                  echo_at)
        if k_new < k:
            self._truncate_to(k_new)

    def _truncate_to(self, k_new: int) -> None:
        start, a_ms, b_ms, factor, _, echo_ms, echo_at = self.run
        self.gen += 1
        self.run = (start, a_ms, b_ms, factor, k_new, echo_ms, echo_at)
        self.res.truncate_segment(self._seg_index, k_new)
        self._schedule_end(start + run_ms(a_ms, b_ms, k_new, echo_ms, echo_at) * factor / 1e3,
                           k_new)

    def _on_end(self, gen: int, k: int, t_end: float, _event) -> None:
        if gen != self.gen:
            return  # superseded by a truncation
        self.busy_s += t_end - self._seg_start
        if self.engine is not None:
            self.engine.last_end_s = t_end
            if k > 1:
                self.engine.ran(k)
        self._ending = True
        self._retire(self._advance(k, t_end))
        self.run, self._ending = None, False
        self._release_device()
        self._plan()

    def _advance(self, k: int, t_end: float) -> list[Req]:
        """Apply the step's k finished iterations to its requests; those now done, in order."""
        done, bs, first_token_s, spec = [], self.cfg.block_size, self.res.first_token_s, self.spec
        # Per request in the batch: the reference's hot loop, kept to plain attribute work
        for r, n in self._sched:
            if k > 1 or r.computed >= r.target:  # decode iterations
                d = spec_tokens(r, k) if spec else k
                if spec:
                    r.spec_it += k
                r.computed += d
                r.generated += d
                if -(-r.computed // bs) > r.shared + r.blocks:
                    self._alloc(r, r.computed)  # accounted in decode_run_length: always fits
            else:  # a prefill chunk
                r.computed += n
                if r.computed >= r.target:
                    r.generated += 1  # the prefill's last chunk samples a token
                    if spec:  # its decode's accepted lengths, drawn at once
                        r.spec_cum = spec.cumulative_tokens(self.spec_rng, r.output - r.generated)
                        r.spec_it = 0
                    if r.generated == 1:  # first token (a re-prefill after preemption has more)
                        first_token_s[r.idx] = t_end
            if r.generated >= r.output or r.aborted:
                done.append(r)
        return done

    def _retire(self, done: list[Req]) -> None:
        for r in done:
            r.status = FINISHED
            self.running.remove(r)
        for r in done:  # callbacks may submit or abort requests: state is consistent here
            self._finish(r)

    def _release_device(self) -> None:
        # The next replica composes its iteration once this event's callbacks are done.
        nxt = self.device.release() if self.device is not None else None
        if nxt is not None:
            self.env.timeout(0).callbacks.append(lambda _e: nxt._plan())


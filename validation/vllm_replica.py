"""A replica whose steps vLLM's own scheduler composes: `scheduler: vllm` on a replica group.

The simulator's replica (`sim.engine.replica`) keeps the clock, the arrivals, the aborts and
the step-time model; each step's composition (the requests, tokens each, preemptions, prompt
tokens found cached) comes from a `vllm.v1` `Scheduler` built from the replica's limits
(`engines.vllm_scheduler.VllmPlanner`). It is fed the simulated requests as token ids with the
workload's prefix structure (`content_ids`: a prefix group's or a program's shared content, then
the request's own), and each step's sampled tokens continue that content, so a later prompt that
extends an earlier output finds its blocks cached as it would live. One event per iteration:
exact to the installed vLLM, slower than the fast paths (`benchmarks/conformance.py --speed`).
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from engines.vllm_scheduler import VllmPlanner, content_ids
from sim.engine.replica import Replica
from sim.engine.request_state import FINISHED, PREEMPTED, RUNNING, WAITING, Req, step_totals
from sim.step_time.plan import StepPlan

MODEL = Path(__file__).resolve().parent.parent / "models" / "testbed" / "target-large"
"""a `config.json` for vLLM's model configuration: the step composition reads none of it"""
MAX_MODEL_LEN = 1 << 20
"""tokens a request may hold: any simulated length (vLLM checks it against the model's)"""


class VllmReplica(Replica):
    """A replica scheduled step by step by the installed vLLM's `Scheduler`."""

    def __init__(self, *args, **kw):
        kw["fast_forward"] = False  # vLLM composes every iteration
        super().__init__(*args, **kw)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a config line per scheduler
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        self.planner = VllmPlanner(self.cfg, MODEL, MAX_MODEL_LEN)
        self.waiting = deque()  # vLLM's unscheduled requests, mirrored for counts and aborts
        self._caching = False  # vLLM caches the blocks; the replica's own cache stays empty
        self._by_id: dict[str, Req] = {}
        self._aborts: list[str] = []  # asked since the last step: vLLM takes them before it
        self._out = None  # the step in flight, as vLLM scheduled it

    def submit(self, req: Req) -> None:
        """A request arrives: vLLM queues it with its content's token ids."""
        rid = str(req.idx)
        self._by_id[rid] = req
        chain = req.chain or (((req.group, req.prefix_tokens),)
                              if req.group >= 0 and req.prefix_tokens else ())
        ids = content_ids(req.idx, req.prompt + req.output, chain)
        # a scoring request re-run uncached (`Req.rerun_uncached`) reads no cached block
        self.planner.add(rid, ids[:req.prompt], req.output, req.priority,
                         output_ids=ids[req.prompt:], read_cache=req.reads_cache)
        super().submit(req)

    def abort(self, r: Req) -> None:
        """Stop a request; vLLM finishes it as aborted before its next step."""
        if r.status is FINISHED or r.aborted:
            return
        self._aborts.append(str(r.idx))
        super().abort(r)

    def _finish(self, r: Req) -> None:
        self._by_id.pop(str(r.idx), None)
        super()._finish(r)

    def _alloc(self, r: Req, tokens_after: int) -> bool:
        return True  # vLLM's KV manager allocates

    def _plan(self) -> None:
        """vLLM's next step, priced and launched (or the replica idles)."""
        if self.device is not None and not self.device.take(self):
            self.busy, self._sched = True, []  # waiting for its turn: submissions only queue
            return
        if self.device is None:
            now, self._host_s = self.env.now + self._host_s, 0.0
        else:
            now = max(self.env.now, self.device.busy_until)
        if self._aborts:
            self.planner.abort(self._aborts)
            self._aborts = []
        while True:
            out = self.planner.schedule()
            preempted = self._take_preempted(out.preempted_req_ids or ())
            sched = self._take_scheduled(out.num_scheduled_tokens, now)
            if sched or not preempted:
                break
            self.planner.complete(out)  # its one candidate preempted itself (priority):
            # vLLM's next step composes at once, an empty step between
        if not sched:
            self.planner.complete(out)  # an empty step: the engine runs no model
            self.busy, self.run = False, None
            self._release_device()
            return
        self._out = out
        self.free_blocks = self.planner.free_blocks()
        prefill_tokens, prefill_seqs, context, lp_ms, seeded = step_totals(sched, self.width)
        self._launch(now, StepPlan(sched, prefill_tokens, prefill_seqs, len(sched) - prefill_seqs,
                                   context, lp_ms, seeded, preempted))

    def _take_preempted(self, ids) -> int:
        """Requests vLLM preempted this step: back to the queue, to recompute."""
        for rid in sorted(ids):
            r = self._by_id[rid]
            self.running.remove(r)
            r.computed, r.target, r.status = 0, r.prompt + r.generated, PREEMPTED
            self.res.preemptions[r.idx] += 1
            self.waiting.append(r)
        return len(ids)

    def _take_scheduled(self, tokens: dict[str, int], now: float) -> list[tuple[Req, int]]:
        """The step's (request, tokens) entries; requests it admits join the running ones with
        the prompt tokens vLLM found cached."""
        sched, requests = [], self.planner.scheduler.requests
        for rid, n in tokens.items():
            r = self._by_id[rid]
            computed = requests[rid].num_computed_tokens - n  # vLLM counts the step in
            if r.status is not RUNNING:
                self.waiting.remove(r)
                r.pos = next(self._positions)
                self.running.append(r)
                if r.status is WAITING:  # first scheduled: as vLLM reports cached tokens
                    self.res.scheduled_s[r.idx] = now
                    self.res.cached_tokens[r.idx] = computed
                r.computed, r.status = computed, RUNNING
                r.rescore = bool(r.score_from) and computed >= r.score_from
            elif computed != r.computed:
                raise RuntimeError(f"request {rid}: vLLM has {computed} tokens computed, the "
                                   f"replica {r.computed}")
            sched.append((r, n))
        return sched

    def _advance(self, k: int, t_end: float) -> list[Req]:
        finished = self.planner.complete(self._out)
        done = super()._advance(k, t_end)
        ours = {str(r.idx) for r in done if not r.aborted}
        aborted = {str(r.idx) for r in done if r.aborted}
        if ours != set(finished) - aborted:
            raise RuntimeError(f"step finished {sorted(ours)} here, {sorted(finished)} in vLLM")
        return done


def register() -> None:
    """Make `scheduler: vllm` available to simulations in this process."""
    from sim.engine.replica_kinds import register as register_kind

    register_kind("vllm", VllmReplica)

"""Records an in-process engine's step loop into steps, requests and token_times rows."""

from __future__ import annotations

import time
from dataclasses import dataclass

from traces.store import TraceWriter
from engines.host_cpu import SAMPLE_S, cpu_ticks
from engines.vllm_engine import Engine


@dataclass
class _Req:
    arrival_s: float
    prompt_tokens: int
    priority: int
    cell_id: str | None
    program_id: str | None
    role: str | None
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    finish_reason: str | None = None


class StepRecorder:
    """Drives `Engine.step` and writes one steps row per iteration and one requests row per request.

    Times are seconds since `t0` (a perf_counter reading shared by the whole run). With
    `host_cpu` (a live run's, not a resumable grid's), about once a second at a step's end it
    samples the host's CPU ticks (`engines.host_cpu`) into `host_cpu` rows.
    """

    def __init__(self, engine: Engine, writer: TraceWriter, t0: float, replica_id: int = 0,
                 record_tokens: bool = True, host_cpu: bool = False):
        self.engine = engine
        self.writer = writer
        self.t0 = t0
        self.replica_id = replica_id
        self.record_tokens = record_tokens
        self.step_id = 0
        self.last_duration_ms = 0.0
        self.reqs: dict[str, _Req] = {}
        self.finished: list[str] = []
        self.host_samples = 0
        self._next_host_s = 0.0 if host_cpu else float("inf")

    def sample_host(self) -> None:
        """A `host_cpu` row now (the step loop takes one about every SAMPLE_S; a tracer takes
        one more as its run ends, so the run's last second counts); none without `host_cpu`."""
        if self._next_host_s == float("inf"):
            return
        at_s = self.now_s()
        ticks = cpu_ticks()
        if ticks is None:  # a kernel without the counts: never sampled again
            self._next_host_s = float("inf")
            return
        self._next_host_s = at_s + SAMPLE_S
        self.writer.add("host_cpu", replica_id=self.replica_id, sample_index=self.host_samples,
                        at_s=at_s, steal_ticks=ticks[0], cpu_ticks=ticks[1])
        self.host_samples += 1

    def now_s(self) -> float:
        """Seconds since the run's t0."""
        return time.perf_counter() - self.t0

    def add(self, request_id: str, prompt_token_ids: list[int], params, priority: int = 0,
            cell_id: str | None = None, program_id: str | None = None,
            role: str | None = None, arrival_s: float | None = None) -> None:
        """Submit a request now and start tracking it (arrival_s: planned arrival, if earlier)."""
        now = self.now_s()
        arrival = now if arrival_s is None else min(arrival_s, now)
        self.reqs[request_id] = _Req(arrival, len(prompt_token_ids), priority, cell_id,
                                     program_id, role)
        self.engine.add(request_id, prompt_token_ids, params, priority=priority,
                        program_id=program_id)

    def step(self, cell_id: str | None = None, warmup=None) -> list:
        """Run one iteration, record it, and return the engine's request outputs.

        `warmup` is an optional callable deciding from the scheduler summary whether the
        iteration is a warm-up iteration.
        """
        outputs, t_start, dt, sched = self.engine.step()
        self.last_duration_ms = dt * 1e3
        start_s, end_s = t_start - self.t0, t_start - self.t0 + dt
        if sched is not None:  # an iteration that scheduled nothing is not an iteration
            self.writer.add("steps", replica_id=self.replica_id, step_id=self.step_id,
                            cell_id=cell_id, start_s=start_s, duration_ms=dt * 1e3,
                            kv_blocks_used=self.engine.kv_blocks_used(),
                            kv_blocks_total=self.engine.kv_blocks_total,
                            is_warmup=bool(warmup(sched)) if warmup else False,
                            **sched)
            lp_tokens, lp_top_k = self.engine.last_logprobs
            if lp_tokens:
                self.writer.add("step_logprobs", replica_id=self.replica_id,
                                step_id=self.step_id, logprob_tokens=lp_tokens,
                                logprob_top_k=lp_top_k)
            seeded = self.engine.last_seeded
            if seeded:
                self.writer.add("step_seeded", replica_id=self.replica_id,
                                step_id=self.step_id, seeded_seqs=seeded)
            if sched["prefill_tokens"]:
                context, pairs, span_pairs = self.engine.last_prefill
                self.writer.add("step_prefill", replica_id=self.replica_id,
                                step_id=self.step_id, prefill_context_tokens=context,
                                prefill_pair_tokens=pairs, prefill_span_pair_tokens=span_pairs)
            self.step_id += 1
            if end_s >= self._next_host_s:
                self.sample_host()
            for req_id in self.engine.scheduler_last_ids():
                r = self.reqs.get(req_id)
                if r is not None and r.scheduled_s is None:
                    r.scheduled_s = start_s
        for out in outputs:
            r = self.reqs.get(out.request_id)
            if r is None:
                continue
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            if n > r.output_tokens:
                if r.first_token_s is None:
                    r.first_token_s = end_s
                if self.record_tokens:
                    for i in range(r.output_tokens, n):
                        self.writer.add("token_times", request_id=out.request_id,
                                        token_index=i, time_s=end_s)
                r.output_tokens = n
            if out.num_cached_tokens:
                r.cached_prompt_tokens = int(out.num_cached_tokens)
            if out.finished:
                r.finish_s = end_s
                r.finish_reason = out.outputs[0].finish_reason if out.outputs else "abort"
                self._emit(out.request_id)
        return outputs

    def abort(self, request_id: str) -> None:
        """Abort a request now and record it finished with reason 'abort'."""
        self.engine.engine.abort_request([request_id])
        r = self.reqs.get(request_id)
        if r is not None and r.finish_s is None:
            r.finish_s = self.now_s()
            r.finish_reason = "abort"
            self._emit(request_id)

    def _emit(self, request_id: str) -> None:
        r = self.reqs.pop(request_id)
        self.engine.forget(request_id)
        self.writer.add("requests", request_id=request_id, replica_id=self.replica_id,
                        cell_id=r.cell_id, program_id=r.program_id, role=r.role,
                        priority=r.priority, arrival_s=r.arrival_s, scheduled_s=r.scheduled_s,
                        first_token_s=r.first_token_s, finish_s=r.finish_s,
                        prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                        cached_prompt_tokens=r.cached_prompt_tokens,
                        finish_reason=r.finish_reason)
        self.finished.append(request_id)

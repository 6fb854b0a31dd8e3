"""Trace rows of the PyTorch engine: one `steps` row (with its `layer_times`) per iteration and
one `requests` row per finished (or aborted) request, shared by the tracers and the live engine
that drive it."""

from __future__ import annotations

import time

from engines.pytorch.engine import TorchEngine
from engines.pytorch.requests import Seq
from engines.pytorch.spec import StepResult
from traces.store import TraceWriter

BLOCK_SIZE = 16
"""tokens per reported KV block (the engine's cache is slot-based; blocks are for the steps table)"""


def kv_blocks_total(engine: TorchEngine) -> int:
    """The slot cache's size in reported blocks."""
    return engine.spec.max_num_seqs * engine.spec.max_model_len // BLOCK_SIZE


class TorchStepWriter:
    """Writes what each engine step did and each request's life, on one clock (`t0`)."""

    def __init__(self, engine: TorchEngine, writer: TraceWriter, t0: float, step_id: int = 0,
                 record_tokens: bool = False):
        self.engine, self.writer, self.t0 = engine, writer, t0
        self.step_id = step_id
        self.record_tokens = record_tokens  # a `token_times` row per generated token
        self.meta: dict[str, dict] = {}
        self.done: dict[str, Seq] = {}
        """the requests the last step finished, with their outputs"""

    def now_s(self) -> float:
        """Seconds since the run's t0."""
        return time.perf_counter() - self.t0

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int, cell_id: str | None,
            stop_at_eos: bool = True, arrival_s: float | None = None, program_id: str | None = None,
            role: str = "main", **sampling) -> None:
        """Queue a request on the engine (`sampling`: `TorchEngine.add`'s temperature, seed,
        top_p, priority, logprobs) and remember its arrival (`arrival_s`: its planned arrival,
        if earlier than now)."""
        self.engine.add(request_id, prompt_ids, max_tokens, stop_at_eos=stop_at_eos, **sampling)
        now = self.now_s()
        self.meta[request_id] = {"cell_id": cell_id, "prompt_tokens": len(prompt_ids),
                                 "arrival_s": now if arrival_s is None else min(arrival_s, now),
                                 "program_id": program_id, "role": role,
                                 "priority": sampling.get("priority", 0)}

    def end(self, request_id: str, reason: str) -> list[int]:
        """Take a request out of the engine now (`reason`: abort, or stop for a stop string the
        caller found) and write its row; its output ids so far."""
        out = self.engine.abort(request_id)
        self._request_row(request_id, out, self.now_s(), reason)
        return out

    def step(self, cell_id: str, is_warmup: bool | None = None, warmup=None) -> StepResult:
        """Run one engine step and write its rows; `warmup` flags it from its shape."""
        eng = self.engine
        res = eng.step()
        start_s = eng.t0 + res.start_s - self.t0  # the engine's clock started before ours
        end_s = start_s + res.duration_ms / 1e3
        shape = {"prefill_tokens": res.prefill_tokens, "prefill_seqs": res.prefill_seqs,
                 "decode_seqs": res.decode_seqs}
        flag = warmup(shape) if warmup is not None else bool(is_warmup)
        self.writer.add("steps", replica_id=0, step_id=self.step_id, cell_id=cell_id,
                        start_s=start_s, duration_ms=res.duration_ms, **shape,
                        num_running=len(eng.running), num_waiting=len(eng.waiting),
                        context_tokens=res.context_tokens,
                        kv_blocks_used=sum(-(-s.length // BLOCK_SIZE)
                                           for s in eng.running.values()),
                        kv_blocks_total=kv_blocks_total(eng), preemptions=0, is_warmup=flag)
        for layer, ms in enumerate(res.layer_ms):
            self.writer.add("layer_times", replica_id=0, step_id=self.step_id, layer=layer + 1,
                            duration_ms=ms)
        for rid in res.scheduled:  # serving mode: scheduled before its first token
            self.meta[rid].setdefault("scheduled_s", start_s)
        for t in res.tokens:
            m = self.meta[t.request_id]
            m.setdefault("scheduled_s", start_s)
            m.setdefault("first_token_s", end_s)
            if self.record_tokens:
                self.writer.add("token_times", request_id=t.request_id,
                                token_index=t.token_index, time_s=end_s)
        self.done = {rid: eng.finished_seq(rid) for rid in res.finished}
        for rid, seq in self.done.items():
            out = seq.output_ids
            self._request_row(rid, out, end_s, "stop" if seq.stop_at_eos and
                              out[-1] == eng.config.eos_token_id else "length")
        self.step_id += 1
        return res

    def _request_row(self, rid: str, out: list[int], finish_s: float, reason: str) -> None:
        m = self.meta.pop(rid)
        self.writer.add("requests", request_id=rid, replica_id=0, cell_id=m["cell_id"],
                        program_id=m["program_id"], role=m["role"], priority=m["priority"],
                        arrival_s=m["arrival_s"], scheduled_s=m.get("scheduled_s"),
                        first_token_s=m.get("first_token_s"), finish_s=finish_s,
                        prompt_tokens=m["prompt_tokens"], output_tokens=len(out),
                        cached_prompt_tokens=0, finish_reason=reason)

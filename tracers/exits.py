"""`reasonsim trace exits`: every exit's view of every token, per-layer times, load times, memory.

On the PyTorch engine at full depth, greedy, for a stream of held-out testbed prompts in phases
whose task mix shifts (HELIOS relies on prompt locality and on task change): for each output token
the max softmax probability and argmax token at every exit (`exits`), each step's per-layer time
(`layer_times`), and per layer its weight bytes, KV bytes per token and measured load time
(`layers`). With it any exit threshold and loaded depth can be replayed counterfactually: the
exit under threshold t is the first layer whose max probability reaches t.

For the EE-full baseline (whole model loaded, one sequence, a decode step stops at its exit and
the next recomputes the skipped layers' KV) the stream is also served with layer skipping at each
of `ee_thresholds`: those steps (cell `ee<threshold>`, `layer_times` rows = layers run,
`prefill_tokens` = prompt or recomputed tokens) time what the simulator's EE-full step model
needs; their tokens are the full-depth stream's up to the first early token that differs from the
final one, so they add no `exits` rows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engines.vllm_engine import device_info
from testbed import lm, tasks
from testbed.streams import ExitsWorkload
from engines.pytorch.engine import TorchEngine, TorchSpec
from engines.pytorch.rows import BLOCK_SIZE, TorchStepWriter
from traces.provenance import config_hash, run_row
from traces.store import TraceWriter, check_out_dir

WAVE_EVERY_STEPS = 6
"""steps between waves (a wave also comes at once when the engine runs dry)"""


def measure_load_ms(model: str, load_format: str, repeats: int) -> list[float]:
    """Median wall ms to load each layer (layer 1 from an engine at depth 1, deeper one by one;
    a one-layer model's layer from an engine holding none)."""
    per_layer: list[list[float]] = []
    for _ in range(repeats):
        eng = TorchEngine(TorchSpec(model=model, load_format=load_format, loaded_layers=1,
                                    max_num_seqs=1, max_model_len=64))
        one = eng.num_layers == 1  # no deeper layer to time: the one layer, loaded again
        if one:
            eng.unload_layers(0)
        per_layer.append([eng.load_layers(d) for d in range(1 if one else 2,
                                                             eng.num_layers + 1)])
    medians = [statistics.median(times) for times in zip(*per_layer)]
    return medians if one else [medians[0]] + medians  # layer 1 costs about what layer 2 does


def trace_exits(model: str, out_dir: str | Path, workload: ExitsWorkload,
                load_format: str = "auto", progress: bool = True,
                ee_thresholds: tuple[float, ...] = (0.9,)) -> dict:
    """Trace one model's exits over the prompt stream at every loaded depth; return a summary.

    The stream is run once per loaded depth D (1..L): with D layers loaded every token comes
    from exit D, so the stream after the first differing token is D's own, and a simulator
    replaying depth D replays exactly what the engine generates at D.
    """
    return trace_exits_together([ExitsJob(model, out_dir, workload, load_format,
                                           ee_thresholds)], progress)[0]


@dataclass(frozen=True)
class ExitsJob:
    """One model's exits trace: where it goes, its stream, load format and EE thresholds."""

    model: str
    out_dir: str | Path
    workload: ExitsWorkload
    load_format: str = "auto"
    ee_thresholds: tuple[float, ...] = (0.9,)


def trace_exits_together(jobs: list[ExitsJob], progress: bool = True) -> list[dict]:
    """Trace several models' exits with their phases interleaved (phase k of every model before
    phase k + 1 of any); a summary per model.

    The models of one HELIOS stream are compared with each other within a run, so their traces
    must see the same machine: traced one after another, a slow spell of a shared machine lands
    on whichever model ran during it and the simulator prices one model's rounds off against
    the other's. Each model's trace is what `trace_exits` writes of it alone.
    """
    traces = [_ModelTrace(job) for job in jobs]
    t0 = time.perf_counter()  # one clock: the models' rows tell which ran when
    phases = max(len(t.phases) for t in traces)
    for k in range(phases):
        for t in traces:
            if k < len(t.phases):
                t.phase(k, t0)
        if progress:
            print(f"exits: phase {k + 1}/{phases}: " + ", ".join(f"{t.job.model} {t.tokens} tokens"
                                                        for t in traces), flush=True)
    return [t.seal() for t in traces]


class _ModelTrace:
    """One model's trace in progress: its writer, its engine per depth and EE threshold."""

    def __init__(self, job: ExitsJob):
        model, wl, ee_thresholds = job.model, job.workload, tuple(job.ee_thresholds)
        if any(not 0 < t <= 1 for t in ee_thresholds):
            raise ValueError(f"ee_thresholds {ee_thresholds}: each must be in (0, 1]")
        out_dir = check_out_dir(job.out_dir, resume=False, can_resume=False)
        probe = TorchEngine(TorchSpec(model=model, load_format=job.load_format, max_num_seqs=1,
                                      max_model_len=64))
        layers, dtype = probe.num_layers, str(probe.dtype).removeprefix("torch.")
        weight_bytes, kv_bytes = probe.layer_weight_bytes(), probe.kv_bytes_per_token_layer()
        del probe
        base = TorchSpec(model=model, load_format=job.load_format, record_exits=True,
                         max_num_seqs=wl.max_num_seqs, max_model_len=1024, seed=wl.seed)
        params = {"workload": asdict(wl), "engine": {**asdict(base), "block_size": BLOCK_SIZE},
                  "depths": list(range(1, layers + 1)), "ee_thresholds": list(ee_thresholds)}
        device, count = device_info()
        self.job, self.out_dir, self.layers, self.device = job, out_dir, layers, device
        self.writer = TraceWriter(out_dir, run_row(
            "exits", "torch", _torch_version(), device, count, model, config_hash(model), dtype,
            job.load_format, wl.seed, params))
        self.load_ms = measure_load_ms(model, job.load_format, wl.load_repeats)
        for i in range(layers):
            self.writer.add("layers", model_id=model, layer=i + 1, weight_bytes=weight_bytes,
                            kv_bytes_per_token=kv_bytes, load_ms=self.load_ms[i])
        self.writer.flush("layers")
        # One engine per depth, phases interleaved across depths: a slow spell of a shared
        # machine then lands on every depth alike instead of on whichever depth ran during it.
        self.engines = {f"depth{d}": TorchEngine(replace(base, loaded_layers=d))
                        for d in range(1, layers + 1)}
        self.engines |= {f"ee{t:g}": TorchEngine(replace(base, max_num_seqs=1, exit_threshold=t,
                                                         skip_layers=True))
                         for t in ee_thresholds}
        for engine in self.engines.values():
            _warm_up(engine)
        self.phases = wl.phase_prompts()
        self.step_id = self.tokens = self.first = 0

    def phase(self, k: int, t0: float) -> None:
        """Serve phase k on every engine, writing its rows (times in seconds since `t0`)."""
        wl = self.job.workload
        chunk = [(self.first + j, cell, item) for j, (cell, item) in enumerate(self.phases[k])]
        self.first += len(chunk)
        for label, engine in self.engines.items():
            self.step_id, n = _run_stream(engine, self.writer, chunk, self.job.model, label,
                                          self.step_id, t0, wl.max_tokens, wl.waves)
            self.tokens += n
            self.writer.flush(f"phase{k}-{label}")

    def seal(self) -> dict:
        """Seal the trace; its summary."""
        self.writer.seal()
        return {"out": str(self.out_dir), "model": self.job.model,
                "requests": self.first * len(self.engines), "tokens": self.tokens,
                "steps": self.step_id, "layers": self.layers, "device": self.device,
                "load_ms": [round(x, 3) for x in self.load_ms]}


def _run_stream(engine: TorchEngine, writer: TraceWriter, chunk: list, model: str,
                label: str, step_id: int, t0: float, max_tokens: int,
                waves: tuple[int, ...]) -> tuple[int, int]:
    """Serve (index, cell, item) prompts on one engine (`depth<D>`: D layers loaded;
    `ee<t>`: layer skipping at t), arriving in waves of the cycled sizes `waves` (so steps
    prefill 1 to max(waves) prompts beside varying decode batches: the step model sees both);
    write their rows (exits only at a loaded depth); (next step id, tokens)."""
    depth = int(label.removeprefix("depth")) if label.startswith("depth") else None
    prefix = f"d{depth}" if depth is not None else label
    rows = TorchStepWriter(engine, writer, t0, step_id)
    pending, w, k = list(chunk), 0, 0
    tokens = 0
    while pending or engine.has_unfinished():
        if pending and _wave_due(engine, k, waves[w % len(waves)]):
            wave, w = waves[w % len(waves)], w + 1
            for n, cell, item in pending[:wave]:
                rows.add(f"{prefix}-q{n}", lm.encode(item.prompt), max_tokens, cell)
            pending = pending[wave:]
        k += 1
        res = rows.step(label, is_warmup=False)
        for t in res.tokens if depth is not None else ():
            for layer, (p, tok) in enumerate(zip(t.max_probs, t.argmax_ids)):
                writer.add("exits", model_id=model, loaded_layers=depth,
                           request_id=t.request_id, token_index=t.token_index, layer=layer + 1,
                           max_prob=p, token_id=tok)
        tokens += len(res.tokens)
    return rows.step_id, tokens


def _wave_due(engine: TorchEngine, k: int, wave: int) -> bool:
    """Whether the next wave arrives before step k: every WAVE_EVERY_STEPS steps, or at once when
    the engine runs dry; a wave an empty engine can admit whole also waits for a free slot per
    prompt, so it is prefilled in one step (the rounds HELIOS plans admit their prompts so)."""
    if not engine.has_unfinished():
        return True
    if k % WAVE_EVERY_STEPS:
        return False
    slots = engine.spec.max_num_seqs
    return wave > slots or len(engine.running) + len(engine.waiting) + wave <= slots


def _warm_up(engine: TorchEngine) -> None:
    """Throw-away requests: the first iterations of a fresh engine pay one-off setup."""
    for i, item in enumerate(tasks.items(10_000, 4)):
        engine.add(f"warmup-{i}", lm.encode(item.prompt), 8)
    while engine.has_unfinished():
        for rid in engine.step().finished:
            engine.output_ids(rid)


def _torch_version() -> str:
    import torch

    return torch.__version__

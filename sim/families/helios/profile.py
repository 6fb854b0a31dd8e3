"""An early-exit model as the HELIOS simulator knows it, all from its exits trace.

A model's profile comes from its exits trace (`reasonsim trace exits`): the token stream the
engine generated at every loaded depth (each token's max probability and token at every loaded
exit), the
per-layer step-time model fitted on the same run's steps, and the measured weight, KV and load
figures per layer. Memory sets the batch a depth allows: the weights of the loaded layers plus,
per sequence, the KV of the loaded layers for its longest length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from policies.helios import Candidate
from sim.families.helios.attended import attended_tokens
from sim.families.helios.blocks import (DepthStream, RoundBlock, Served, served_at_depth,
                                        served_with_exits)
from sim.families.helios.exits import load_exits
from sim.step_time.layered import LayeredModel, fit_layered
from traces.store import read_run, read_table


@dataclass
class ModelProfile:
    """One candidate model as the simulator knows it, all from its exits trace."""

    name: str
    model_dir: str
    layers: int
    prompt_tokens: list[int]
    """per stream prompt"""
    streams: dict[int, DepthStream]
    """loaded depth -> the stream generated with it loaded (per token, max probability and
    token at exits 1..depth)"""
    step: LayeredModel
    weight_bytes: int
    """per layer"""
    kv_bytes_per_token: int
    """per layer"""
    load_ms_per_layer: float
    device: str
    workload: dict = field(default_factory=dict)
    """the trace's prompt-stream parameters (live replay regenerates the prompts from them)"""
    resident_bytes: int = 0
    """weights outside the decoder layers (embedding, head): always in memory"""
    ee_step: LayeredModel | None = None
    """step time with layer skipping (EE-full), from the trace's `ee<t>` steps; None: untraced"""
    reference: list[list[int]] = field(default_factory=list)
    """per prompt, the full model's greedy tokens (the full-depth stream's last exit): what the
    served tokens are checked against, position by position (a reference-free quality proxy)"""
    served: dict = field(default_factory=dict, repr=False, compare=False)
    """(depth, prompt, exit threshold) -> what serving one with exits gives (`served_with`):
    kept, every policy and run that serves it so reads it once"""
    step_gap_ms: float = 0.0
    """the serving loop's host time after each step, before the next (`fit_step_gap`); 0: none
    measured (a what-if profile)"""
    padded_decode: bool = False
    """a decode step attends over its batch padded to the longest sequence, as the PyTorch
    engine's (`sim.families.helios.attended`, which its step model was fitted on); False: over
    each sequence's own context (a what-if profile: a serving engine's paged attention)"""

    def served_at(self, block: RoundBlock) -> Served:
        """A round's prompts (`block`, of one of this profile's streams) served at the stream's
        depth, every token leaving there (`served_at_depth`)."""
        ref = self.streams[self.layers] if self.reference else None
        return served_at_depth(block, ref)

    def served_with(self, depth: int, prompt: int, threshold: float) -> tuple:
        """One prompt served at `depth`, each token leaving at its first exit reaching
        `threshold`: (its exits, the summed -log probability at them, the tokens agreeing with
        the full model's: `served_with_exits`)."""
        key = (depth, prompt, threshold)
        out = self.served.get(key)
        if out is None:
            stream = self.streams[depth]
            tokens = slice(int(stream.starts[prompt]), int(stream.starts[prompt + 1]))
            ids = stream.argmax[tokens] if stream.argmax is not None else None
            ref = np.asarray(self.reference[prompt]) if self.reference else None
            out = self.served[key] = served_with_exits(stream.rows(tokens), stream.neglog(tokens),
                                                       ids, threshold, ref)
        return out


def load_profile(trace_dir: str | Path, name: str | None = None) -> ModelProfile:
    """A model profile from an exits trace; errors name the directory."""
    run = read_run(trace_dir)
    if run["kind"] != "exits":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace; expected an exits trace")
    params = json.loads(run["params_json"])
    layers_df = read_table(trace_dir, "layers").to_pandas().sort_values("layer")
    layers = int(layers_df.layer.max())
    streams, prompt_tokens = {}, None
    reqs = read_table(trace_dir, "requests").to_pandas()
    for depth in range(1, layers + 1):
        m = load_exits(trace_dir, depth)
        ids = m.request_ids  # grouped by request, in stream order
        starts = np.r_[0, np.flatnonzero(ids[1:] != ids[:-1]) + 1, len(ids)]
        streams[depth] = DepthStream(m.max_prob, m.argmax, starts)
        order = ids[starts[:-1]]
        lengths = reqs.set_index("request_id").loc[order, "prompt_tokens"].astype(int).tolist()
        if prompt_tokens is None:
            prompt_tokens = lengths
        elif lengths != prompt_tokens:
            raise ValueError(f"{trace_dir}: depth {depth} served another prompt stream")
    steps = traced_steps(trace_dir)
    step = fit_steps(steps, layers)
    ee_step = fit_steps(steps, layers, cells="ee") if params.get("ee_thresholds") else None
    return ModelProfile(name=name or Path(str(run["model_id"])).name,
                        model_dir=_model_dir(str(run["model_id"]), trace_dir), layers=layers,
                        prompt_tokens=prompt_tokens, streams=streams, step=step,
                        weight_bytes=int(layers_df.weight_bytes.iloc[0]),
                        kv_bytes_per_token=int(layers_df.kv_bytes_per_token.iloc[0]),
                        load_ms_per_layer=float(layers_df.load_ms.median()),
                        device=str(run["device"]), workload=params.get("workload", {}),
                        ee_step=ee_step, padded_decode=True,
                        reference=reference_tokens(streams[layers]),
                        step_gap_ms=fit_step_gap(steps))


def reference_tokens(full: DepthStream) -> list[list[int]]:
    """Per prompt, the full-depth stream's tokens at its last exit (the full model's greedy
    tokens)."""
    return [x.tolist() for x in np.split(full.argmax[:, -1], full.starts[1:-1])]


def _model_dir(model_id: str, trace_dir: str | Path) -> str:
    """The traced model's directory: as recorded, or (a relative path recorded from a checkout's
    root) found from the trace directory upwards, so live replay works from any directory."""
    p = Path(model_id)
    if p.is_absolute() or p.exists():
        return str(p)
    for parent in Path(trace_dir).resolve().parents:
        if (parent / p).is_dir():
            return str(parent / p)
    return str(p)


def traced_steps(trace_dir: str | Path) -> pd.DataFrame:
    """A trace's measured steps (warm-up ones dropped) in run order, each with its depth (the
    layers it ran: its layer_times rows), the host time after it (`gap_ms`: to the next
    step of its cell; none after a cell's last) and the tokens it attended over
    (`attended_tokens`: `sim.families.helios.attended`; its context where no request rows
    name its engine, as the layer-skipping cells' single sequences)."""
    steps = read_table(trace_dir, "steps").to_pandas().sort_values(
        ["run_id", "replica_id", "step_id"], kind="stable")
    depth = read_table(trace_dir, "layer_times").to_pandas().groupby("step_id").layer.count()
    steps["depth"] = steps.step_id.map(depth)
    following = steps.groupby(["run_id", "replica_id", "cell_id"]).start_s.shift(-1)
    steps["gap_ms"] = (following - steps.start_s) * 1e3 - steps.duration_ms
    steps["attended_tokens"] = steps.context_tokens.astype(float)
    requests = read_table(trace_dir, "requests").to_pandas()
    # a loaded depth's engine (cell depth<D>) names its requests d<D>-q<n> (`tracers.exits`)
    engine = "depth" + requests.request_id.str.extract(r"^d(\d+)-", expand=False)
    for (run, cell), s in steps.groupby(["run_id", "cell_id"], sort=False):
        mine = requests[(requests.run_id == run) & (engine == cell)]
        if len(mine):
            try:
                steps.loc[s.index, "attended_tokens"] = attended_tokens(s, mine)
            except ValueError as e:
                raise ValueError(f"{trace_dir}: cell {cell}: {e}") from None
    return steps[~steps.is_warmup & steps.depth.notna()]


def fit_steps(steps: pd.DataFrame, layers: int, cells: str = "depth") -> LayeredModel:
    """The per-layer step-time model from a trace's steps (`traced_steps`) of the cells named
    `cells<...>` (`depth`: at a loaded depth; `ee`: layer skipping)."""
    steps = steps[steps.cell_id.str.startswith(cells)]
    return fit_layered(steps.prefill_tokens, steps.decode_seqs, steps.attended_tokens,
                       steps.depth, steps.duration_ms, layers, prefill_seqs=steps.prefill_seqs)


def fit_step_gap(steps: pd.DataFrame) -> float:
    """The serving loop's host time between two steps (ms): the intercept of the trace's gaps
    fitted as a + b x sequences x layers run (least squares, the slowest 1% of gaps left out).
    The slope is the tracer's own per-layer recording, which the live loop does not do: live
    runs measure a flat gap of about the intercept whatever the batch and depth."""
    s = steps[steps.gap_ms.notna()]
    s = s[s.gap_ms <= s.gap_ms.quantile(0.99)]
    if len(s) < 2:
        return 0.0
    work = ((s.prefill_seqs + s.decode_seqs) * s.depth).to_numpy(float)
    (a, _b), *_ = np.linalg.lstsq(np.c_[np.ones_like(work), work], s.gap_ms.to_numpy(float),
                                  rcond=None)
    return max(float(a), 0.0)


@dataclass(frozen=True)
class Memory:
    """Device memory for one model's weights and KV, and the sequence length reserved."""

    memory_mb: float
    seq_tokens: int
    """KV reserved per sequence (longest prompt + max output)"""
    max_num_seqs: int = 256

    def batch(self, p: ModelProfile, depth: int) -> int:
        """Largest batch that fits with `depth` layers of `p` loaded (0: the weights do not)."""
        free = self.memory_mb * 2**20 - p.resident_bytes - depth * p.weight_bytes
        per_seq = depth * p.kv_bytes_per_token * self.seq_tokens
        return max(0, min(self.max_num_seqs, int(free // per_seq)))


def candidate(p: ModelProfile, mem: Memory) -> Candidate:
    """The policy's view of a profile: per-layer and fixed step cost at the full-depth batch."""
    b = max(1, mem.batch(p, p.layers))
    context = b * (int(np.mean(p.prompt_tokens)) + 32)
    one, two = (p.step.at_depth(d).step_ms(0, b, context) for d in (1, min(2, p.layers)))
    layer_ms = two - one if p.layers > 1 else p.step.at_depth(1).step_ms(0, b, context)
    return Candidate(name=p.name, layers=p.layers, layer_ms=layer_ms,
                     fixed_ms=max(one - layer_ms, 0.0), load_ms_per_layer=p.load_ms_per_layer,
                     batch_at_depth=tuple(mem.batch(p, d) for d in range(1, p.layers + 1)))

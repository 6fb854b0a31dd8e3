"""Early-exit serving in simulation: HELIOS and its baselines over a traced prompt stream.

A model's profile comes from its exits trace (`reasonsim trace exits`): the token stream the
engine generated at every loaded depth (each token's max probability at every loaded exit), the
per-layer step-time model fitted on the same run's steps, and the measured weight, KV and load
figures per layer. Memory sets the batch a depth allows: the weights of the loaded layers plus,
per sequence, the KV of the loaded layers for its longest length.

The program (`programs.helios.HeliosProgram`) plans rounds; this module serves them in SimPy
time: a layer load or model switch is a timed event (layers x measured load time), then the
round's prefill step and its decode steps, fast-forwarded between sequence finishes with the
step-time model's closed form (events grow with rounds and finishes, not tokens).

The EE-full baseline (whole model loaded, one sequence, per-token exits at a threshold, EE-LLM's
layer skipping with KV recomputation as `engines/pytorch/engine.py` runs it) serves each prompt
alone: the tokens are the full-depth stream's, each exits at the first layer whose max
probability reaches the threshold, and each decode step runs layers 1..its exit over the new
token plus the pending ones (those fed since the last step that ran every layer). Its step time
is a second layered model fitted on the trace's layer-skipping steps (`ee<t>` cells).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from policies.helios import Candidate, Serve
from programs.helios import HeliosProgram
from sim.families.helios.exits import load_exits
from sim.step_time.latency import feature_matrix, run_ms
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
    streams: dict[int, list[list[list[float]]]]
    """loaded depth -> per prompt -> per token -> max probability at exits 1..depth"""
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
        order = list(dict.fromkeys(m.request_ids))  # stream order
        per_req: dict[str, list] = {r: [] for r in order}
        for rid, probs in zip(m.request_ids, m.max_prob):
            per_req[rid].append(probs.tolist())
        streams[depth] = [per_req[r] for r in order]
        lengths = reqs.set_index("request_id").loc[order, "prompt_tokens"].astype(int).tolist()
        if prompt_tokens is None:
            prompt_tokens = lengths
        elif lengths != prompt_tokens:
            raise ValueError(f"{trace_dir}: depth {depth} served another prompt stream")
    step = fit_steps(trace_dir, layers)
    ee_step = fit_steps(trace_dir, layers, cells="ee") if params.get("ee_thresholds") else None
    return ModelProfile(name=name or Path(str(run["model_id"])).name,
                        model_dir=_model_dir(str(run["model_id"]), trace_dir), layers=layers,
                        prompt_tokens=prompt_tokens, streams=streams, step=step,
                        weight_bytes=int(layers_df.weight_bytes.iloc[0]),
                        kv_bytes_per_token=int(layers_df.kv_bytes_per_token.iloc[0]),
                        load_ms_per_layer=float(layers_df.load_ms.median()),
                        device=str(run["device"]), workload=params.get("workload", {}),
                        ee_step=ee_step)



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


def fit_steps(trace_dir: str | Path, layers: int, cells: str = "depth") -> LayeredModel:
    """The per-layer step-time model from a trace's steps of the cells named `cells<...>`
    (`depth`: at a loaded depth; `ee`: layer skipping), a step's depth = its layer_times rows."""
    steps = read_table(trace_dir, "steps").to_pandas()
    depth = read_table(trace_dir, "layer_times").to_pandas().groupby("step_id").layer.count()
    steps["depth"] = steps.step_id.map(depth)
    steps = steps[~steps.is_warmup & steps.depth.notna() & steps.cell_id.str.startswith(cells)]
    return fit_layered(steps.prefill_tokens, steps.decode_seqs, steps.context_tokens,
                       steps.depth, steps.duration_ms, layers, prefill_seqs=steps.prefill_seqs)


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


@dataclass
class HeliosResult:
    """Per-prompt rows, per-round rows and the policy's events."""

    requests: pd.DataFrame
    rounds: pd.DataFrame
    events: list[tuple[int, Serve]]
    candidates: list[str] = field(default_factory=list)
    """the models the policy chose among"""

    def summary(self) -> dict:
        """Throughput, latencies, batch, perplexity, energy proxy, events, candidates."""
        return {**summarise(self.requests, self.rounds, self.events),
                "candidates": list(self.candidates)}


def summarise(requests: pd.DataFrame, rounds: pd.DataFrame, events: list) -> dict:
    """The figures a HELIOS run is judged by (sim and live alike)."""
    r = requests
    span_s = float(r.finish_s.max()) if len(r) else 0.0  # the stream starts at 0
    tokens = int(r.output_tokens.sum())
    tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1).clip(lower=1)
    return {"prompts": int(len(r)), "tokens": tokens, "span_s": span_s,
            "throughput_tok_s": tokens / span_s if span_s > 0 else math.nan,
            "ttft_p50_s": float((r.first_token_s - r.arrival_s).median()),
            "tpot_p50_s": float(tpot.median()),
            "mean_batch": float(np.average(rounds.batch, weights=rounds.steps)),
            "perplexity": float(math.exp(r.nll_sum.sum() / max(tokens, 1))),
            "layer_token_executions": int(rounds.layer_tokens.sum()),
            "events": [f"{i}:{s.event}:{s.model}@{s.depth}" for i, s in events]}


def simulate_stream(program: HeliosProgram, profiles: dict[str, ModelProfile], mem: Memory
                    ) -> HeliosResult:
    """Serve the program's rounds in SimPy time; per-prompt and per-round rows."""
    env = simpy.Environment()
    req_rows: list[dict] = []
    round_rows: list[dict] = []

    def serve():
        loaded: tuple[str, int] | None = None
        while (rnd := program.next_round()) is not None:
            s = rnd.serve
            p = profiles[s.model]
            load_ms = reload_ms(loaded, (s.model, s.depth), profiles)
            if load_ms:
                yield env.timeout(load_ms / 1e3)
            loaded = (s.model, s.depth)
            start = env.now
            toks = [p.streams[s.depth][i] for i in rnd.prompts]
            prompts = [p.prompt_tokens[i] for i in rnd.prompts]
            if s.exit_threshold is None:
                exits = [[s.depth] * len(t) for t in toks]
                times = round_times(p.step.at_depth(s.depth), prompts, [len(t) for t in toks],
                                    scale=p.step.residual_sampler()[0],
                                    per_seq_ms=p.step.prefill_seqs_ms(s.depth, 1))
                # tokens each layer processed: the prompts, and every output but the last
                layer_tokens = s.depth * (sum(prompts) + sum(len(t) - 1 for t in toks))
            else:
                if len(rnd.prompts) != 1:
                    raise ValueError("layer skipping (an exit threshold) serves one sequence at "
                                     f"a time; the program planned {len(rnd.prompts)}")
                exits = [[exit_layer(x, s.exit_threshold) for x in t] for t in toks]
                times = ee_times(_ee_step(p), prompts[0], exits[0], s.depth)
                layer_tokens = times["layer_tokens"]
            yield env.timeout(times["end_s"])
            for k, i in enumerate(rnd.prompts):
                req_rows.append({"prompt": i, "model": s.model, "depth": s.depth,
                                 "arrival_s": start, "first_token_s": start + times["first_s"],
                                 "finish_s": start + times["finish_s"][k],
                                 "prompt_tokens": p.prompt_tokens[i],
                                 "output_tokens": len(toks[k]), "exit_layers": exits[k],
                                 "nll_sum": float(-sum(math.log(max(t[e - 1], 1e-12))
                                                       for t, e in zip(toks[k], exits[k])))})
            round_rows.append({"start_s": start, "model": s.model, "depth": s.depth,
                               "batch": len(rnd.prompts), "steps": times["steps"],
                               "busy_ms": times["end_s"] * 1e3,
                               "load_ms": load_ms, "event": s.event or "",
                               "layer_tokens": layer_tokens})
            program.finish_round(toks)

    env.process(serve())
    env.run()
    return HeliosResult(pd.DataFrame(req_rows), pd.DataFrame(round_rows),
                        list(program.policy.events), candidates_of(program.policy))


def candidates_of(policy) -> list[str]:
    """The models a policy chooses among (HELIOS: its shortlist; a baseline: its one model)."""
    return list(getattr(policy, "order", None) or [policy.candidate.name])


def reload_ms(loaded: tuple[str, int] | None, want: tuple[str, int],
              profiles: dict[str, ModelProfile]) -> float:
    """Time to go from the loaded (model, depth) to the wanted one: deeper layers of the same
    model, or the whole wanted depth of another (dropping layers is free; a switched-out model
    keeps only its embedding and head)."""
    if loaded == want:
        return 0.0
    model, depth = want
    have = loaded[1] if loaded is not None and loaded[0] == model else 0
    return max(depth - have, 0) * profiles[model].load_ms_per_layer


def exit_layer(max_probs: list[float], threshold: float) -> int:
    """1-based exit of a token: the first exit whose max probability reaches the threshold."""
    return next((d + 1 for d, p in enumerate(max_probs) if p >= threshold), len(max_probs))


def _ee_step(p: ModelProfile) -> LayeredModel:
    if p.ee_step is None:
        raise ValueError(f"{p.name}: the EE-full baseline needs an exits trace with layer-skipping "
                         "steps (reasonsim trace exits --ee-thresholds 0.9)")
    return p.ee_step


def ee_times(model: LayeredModel, prompt_tokens: int, exits: list[int], layers: int) -> dict:
    """One sequence with layer skipping: the prefill runs every layer; the decode step giving
    token j runs layers 1..exits[j] over the new token and the pending ones (fed since the last
    step that ran all `layers`), and leaves them pending unless it ran every layer."""
    n = len(exits)
    pending = np.zeros(n, dtype=float)  # pending tokens each decode step recomputes
    for j in range(2, n):
        pending[j] = 0 if exits[j - 1] == layers else pending[j - 1] + 1
    depth = np.asarray(exits, dtype=float)
    context = prompt_tokens + np.arange(n, dtype=float)  # computed tokens after step j
    x = feature_matrix(pending[1:], np.ones(n - 1), context[1:])
    decode_ms = x @ np.asarray(model.fixed_ms) + depth[1:] * (x @ np.asarray(model.layer_ms))
    first_ms = model.at_depth(layers).step_ms(prompt_tokens, 0, prompt_tokens) \
        + model.prefill_seqs_ms(layers, 1)
    scale = model.residual_sampler()[0]
    end_s = (first_ms + float(decode_ms.sum())) * scale / 1e3
    return {"first_s": first_ms * scale / 1e3, "finish_s": [end_s], "end_s": end_s, "steps": n,
            "layer_tokens": int(layers * prompt_tokens + (depth[1:] * (pending[1:] + 1)).sum())}


def round_times(model, prompt_tokens: list[int], output_tokens: list[int],
                scale: float = 1.0, per_seq_ms: float = 0.0) -> dict:
    """A round's timing: one prefill step for all prompts, then decode steps until each sequence
    has its tokens (batch shrinking as they finish); closed form between finishes. `scale` is
    the mean multiplicative residual (the relative-error fit predicts below the mean)."""
    first_s = (model.step_ms(sum(prompt_tokens), 0, sum(prompt_tokens))
               + per_seq_ms * len(prompt_tokens)) / 1e3
    finish = np.zeros(len(output_tokens))
    order = np.argsort(output_tokens, kind="stable")
    t_ms, done_steps, steps = first_s * 1e3, 1, 1
    running = list(order)
    lengths = np.asarray(prompt_tokens, dtype=float)
    for idx in order:
        target = output_tokens[idx]
        k = target - done_steps  # decode steps until this sequence has its tokens
        if k > 0:
            n = len(running)
            context0 = int(sum(lengths[j] for j in running)) + n * (done_steps - 1)
            a, b = model.decode_run(n, context0)
            t_ms += run_ms(a, b, k)
            done_steps += k
            steps += k
        finish[idx] = t_ms / 1e3
        running.remove(idx)
    return {"first_s": first_s * scale, "finish_s": (finish * scale).tolist(),
            "end_s": t_ms * scale / 1e3, "steps": steps}

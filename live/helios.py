"""HELIOS and its baselines live on the PyTorch engine, with the simulator's program and policy.

The same `programs.helios.HeliosProgram` plans the rounds and the same policy objects decide;
here each round runs on a real `TorchEngine` per model. Loading deeper layers is
`load_layers` (timed); a switch empties the current model to its embedding and head and loads
the other model's layers (timed), as the simulator charges it. The prompt stream is regenerated
from the exits trace's workload parameters, so live and simulated serve the same prompts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd

from programs.helios import HeliosProgram
from testbed.streams import ExitsWorkload
from testbed import lm
from engines.pytorch.engine import TorchEngine, TorchSpec


def stream_prompts(workload: dict, prompt_tokens: list[int]) -> list[list[int]]:
    """The traced prompt stream's token ids, regenerated from the trace's workload parameters."""
    wl = ExitsWorkload(**{k: tuple(v) if isinstance(v, list) else v for k, v in workload.items()})
    ids = [lm.encode(item.prompt) for _, item in wl.prompts()]
    if [len(x) for x in ids] != prompt_tokens:
        raise ValueError("the regenerated prompt stream differs from the traced one (another "
                         "task generator version?)")
    return ids


class LiveModels:
    """One engine per candidate model; at most one holds layers at a time."""

    def __init__(self, model_dirs: dict[str, str], seq_tokens: int, seed: int = 0):
        self.engines = {name: TorchEngine(TorchSpec(model=path, loaded_layers=1,
                                                    max_num_seqs=1, seed=seed,
                                                    max_model_len=seq_tokens,
                                                    record_exits=True))
                        for name, path in model_dirs.items()}
        for eng in self.engines.values():
            _warm_up(eng)
            eng.unload_layers(0)  # the repository holds every model's embedding and head only
        self.loaded: tuple[str, int] | None = None

    def configure(self, model: str, depth: int, batch: int, exit_threshold: float | None = None
                  ) -> tuple[TorchEngine, float]:
        """The engine for `model` at `depth` with `batch` slots (with an exit threshold: layer
        skipping, one slot); the load time it took (ms)."""
        eng = self.engines[model]
        load_ms = 0.0
        if self.loaded is not None and self.loaded[0] != model:
            self.engines[self.loaded[0]].unload_layers(0)
        if eng.loaded_layers < depth:
            load_ms = eng.load_layers(depth)
        elif eng.loaded_layers > depth:
            eng.unload_layers(depth)
        eng.set_exits(None)
        if eng.spec.max_num_seqs != batch:
            eng.set_max_num_seqs(batch)
        if exit_threshold is not None:
            eng.set_exits(exit_threshold, skip_layers=True)
        self.loaded = (model, depth)
        return eng, load_ms


def run_live(program: HeliosProgram, model_dirs: dict[str, str], prompts: list[list[int]],
             seq_tokens: int, max_tokens: int, seed: int = 0,
             references: dict[str, list[list[int]]] | None = None, steps: list | None = None
             ) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """Serve the program's rounds on real engines: (requests, rounds, events), the same rows as
    the simulator's `simulate_stream` (`references`: per model, each prompt's full-model greedy
    tokens as traced, which the served tokens are counted against; None: not counted; `steps`:
    a list that gets one row per engine step, its round, shape and duration)."""
    models = LiveModels(model_dirs, seq_tokens, seed)
    req_rows: list[dict] = []
    round_rows: list[dict] = []
    t0 = time.perf_counter()
    while (rnd := program.next_round()) is not None:
        s = rnd.serve
        eng, load_ms = models.configure(s.model, s.depth, len(rnd.prompts), s.exit_threshold)
        start = time.perf_counter() - t0
        r = _serve_round(eng, rnd.prompts, prompts, max_tokens, t0, steps,
                         {"round": len(round_rows), "model": s.model, "depth": s.depth})
        for i in rnd.prompts:
            req_rows.append({"prompt": i, "model": s.model, "depth": s.depth,
                             "arrival_s": start, "first_token_s": r.first[i],
                             "finish_s": r.finish[i], "prompt_tokens": len(prompts[i]),
                             "output_tokens": len(r.probs[i]),
                             "exit_layers": [e for e, _ in r.exits[i]],
                             "nll_sum": float(-sum(_log(q) for _, q in r.exits[i])),
                             "reference_agree_tokens": None if references is None else sum(
                                 a == b for a, b in zip(r.ids[i], references[s.model][i]))})
        round_rows.append({"start_s": start, "model": s.model, "depth": s.depth,
                           "batch": len(rnd.prompts), "steps": r.steps, "load_ms": load_ms,
                           "busy_ms": r.busy_ms, "first_step_ms": r.first_step_ms,
                           "event": s.event or "", "layer_tokens": r.layer_tokens})
        program.finish_round([r.probs[i] for i in rnd.prompts])
    return pd.DataFrame(req_rows), pd.DataFrame(round_rows), list(program.policy.events)


@dataclass
class _Round:
    """What one round's prompts produced (per stream index) and what its steps cost."""

    probs: dict
    """per token, the max probability at each loaded exit"""
    exits: dict
    """per token, (exit layer, its probability)"""
    ids: dict
    first: dict
    finish: dict
    steps: int = 0
    busy_ms: float = 0.0
    first_step_ms: float = 0.0
    """the round's prefill step (its prompts' first tokens)"""
    layer_tokens: int = 0


def _serve_round(eng: TorchEngine, served: tuple, prompts: list[list[int]], max_tokens: int,
                 t0: float, steps: list | None = None, tag: dict | None = None) -> _Round:
    """Admit a round's prompts together and step the engine until they finish (`steps`: a list
    that gets each step's shape and duration, with `tag`'s fields)."""
    index = {f"q{i}": i for i in served}
    for rid, i in index.items():
        eng.add(rid, prompts[i], max_tokens=max_tokens)
    r = _Round(probs={i: [] for i in served}, exits={i: [] for i in served},
               ids={i: [] for i in served}, first={}, finish={})
    while eng.has_unfinished():
        res = eng.step()
        now = time.perf_counter() - t0
        r.steps += 1
        r.busy_ms += res.duration_ms
        if r.steps == 1:
            r.first_step_ms = res.duration_ms
        if steps is not None:
            steps.append({**(tag or {}), "step": r.steps, "prefill_tokens": res.prefill_tokens,
                          "prefill_seqs": res.prefill_seqs, "decode_seqs": res.decode_seqs,
                          "context_tokens": res.context_tokens,
                          "attended_tokens": res.attended_tokens, "duration_ms": res.duration_ms})
        r.layer_tokens += len(res.layer_ms) * (res.prefill_tokens + res.decode_seqs)
        for t in res.tokens:
            i = index[t.request_id]
            r.probs[i].append(t.max_probs)
            r.exits[i].append((t.exit_layer, t.exit_prob))
            r.ids[i].append(t.token_id)
            r.first.setdefault(i, now)
        for rid in res.finished:
            r.finish[index[rid]] = now
            eng.output_ids(rid)
    return r


def _warm_up(engine: TorchEngine) -> None:
    """Throw-away requests at full depth: a fresh engine's first iterations pay one-off setup."""
    if engine.loaded_layers < engine.num_layers:
        engine.load_layers(engine.num_layers)
    engine.set_max_num_seqs(4)
    for i in range(4):
        length = max(1, min(16 + 8 * i, engine.spec.max_model_len - 8))
        engine.add(f"warmup-{i}", [5 + i] * length, max_tokens=8, stop_at_eos=False)
    while engine.has_unfinished():
        for rid in engine.step().finished:
            engine.output_ids(rid)


def _log(p: float) -> float:
    return math.log(max(p, 1e-12))

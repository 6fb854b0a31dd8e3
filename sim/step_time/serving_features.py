"""The `serving` step-time model's features: what it reads of each step, traced or simulated.

`engine_features` gives a trace's steps what the engine knew before each (idle time, first step
of a shape, the after-prefill echo); `attach_spans` what its prefill chunks attended to (from
`step_prefill`); `feature_matrix` lays them out in FEATURES order. The model and its fit are
`sim.step_time.serving_latency`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.step_time.latency import ECHO_WEIGHTS
from traces import read_table

FEATURES = ("const", "prefill_tokens", "decode_seqs", "context_tokens", "prefill_x_context_k",
            "prefill_step", "new_shape", "new_shape_x_tokens_100", "idle_100ms", "idle_short",
            "prefill_sq_per_seq_k", "echo", "echo_idle_100ms", "echo_prefill_k",
            "spanning_prefill_tokens", "span_context_k", "hit_pairs_m")
FEATURES_V1 = FEATURES[:9]
"""the features of calibrations fitted before `idle_short` (read with its coefficient 0)"""
FEATURES_V2 = FEATURES[:10]
"""... and before `prefill_sq_per_seq_k` (read with its coefficient 0: same predictions)"""
FEATURES_V3 = FEATURES[:11]
"""... and before the after-prefill echo (read with its coefficients 0)"""
FEATURES_V4 = FEATURES[:14]
"""... and before the spanning-prefill term (read with its coefficient 0)"""
FEATURES_V5 = FEATURES[:15]
"""... and before the spanned-context term (read with its coefficient 0)"""
FEATURES_V6 = FEATURES[:16]
"""... and before the prefix-cache hit term (read with its coefficient 0)"""
HIT = FEATURES.index("hit_pairs_m")
NO_ECHO = (0.0, 0.0, 0.0)
LINEAR = 5
"""the first LINEAR features are the `linear` model's"""
NEW_SHAPE_TOKENS_CAP = 256.0
"""the first-of-shape term's per-token part counts at most this many tokens: per token without
a cap, fits charged live long prompts' new shapes (600-1500 tokens) 2.5-4 ms and they ran at
0.87-0.94x of the model; re-judged offline with the cap, four full fidelity runs' mean |error|
at live decode speed went 2.94 -> 2.66, 2.77 -> 2.41, 2.85 -> 2.77 and 2.81 -> 2.42%"""
IDLE_CAP_MS = 200.0
"""idle time beyond this adds nothing more (measured: flat from ~100 ms)"""
IDLE_SHORT_MS = 10.0
"""the saturating idle term is full after this much idle time"""
PREFILL_FEATURES = ("prefill_tokens", "prefill_x_context_k", "prefill_step",
                    "prefill_sq_per_seq_k", "spanning_prefill_tokens", "span_context_k",
                    "hit_pairs_m")
"""the features that are 0 on every decode-only step: a prefill's own work"""
SPAN_TERMS = ("spanning_prefill_tokens", "span_context_k")
MIN_SPAN_SHAPES = 4
"""the spanning terms are fitted (else 0) only over steps of this many (prefill tokens, earlier
context) shapes: a quick grid's four identical 8-token chunks over 248 cached tokens once set
0.19 ms per prefill token, and the quick suite's shared-prefix prefills ran at 0.26x of it"""
RUN_WARMUP_STEPS = 3
"""first steps of every traced run left out of a fit: engine start-up, not serving"""


def feature_matrix(steps: pd.DataFrame, idle_seen_ms: float = IDLE_CAP_MS,
                   new_shape_cap_tokens: float = NEW_SHAPE_TOKENS_CAP,
                   pairs: bool = True) -> np.ndarray:
    """Design matrix in FEATURES order from steps with `new_shape` and `idle_ms` columns (and
    the echo's, `spanning_prefill_tokens`, `span_context_tokens` and `prefill_pair_tokens`, 0
    where absent); `pairs`: attention pairs where recorded (else tokens squared per sequence)."""
    p = steps.prefill_tokens.to_numpy(float)
    seqs = np.maximum(steps.prefill_seqs.to_numpy(float), 1.0)
    d = steps.decode_seqs.to_numpy(float)
    c = steps.context_tokens.to_numpy(float)
    new = steps.new_shape.to_numpy(float)
    idle_ms = np.minimum(steps.idle_ms.to_numpy(float), idle_seen_ms)
    idle = np.minimum(idle_ms, IDLE_CAP_MS) / 100.0
    short = np.minimum(idle_ms, IDLE_SHORT_MS) / IDLE_SHORT_MS
    def col(name):  # an echo or span column the steps lack (not from `engine_features`,
        # not recorded in `step_prefill`): none
        return steps[name].to_numpy(float) if name in steps else np.zeros_like(p)

    w = col("echo_w")
    echo_idle = np.minimum(np.minimum(col("echo_idle_ms"), idle_seen_ms), IDLE_CAP_MS) / 100.0
    echo_k = col("echo_prefill_tokens") / 1e3
    span = col("spanning_prefill_tokens")
    span_ctx_k = col("span_context_tokens") / 1e3
    hit_m = col("hit_pair_tokens") / 1e6
    # A prompt's attention grows with its own length squared: prefill tokens squared over the
    # step's prefill sequences (exact for equal prompts). One 1536-token prompt took 38 ms where
    # two of 768 took 28 ms (`benchmarks/prefill_batch_error.py --exact`); tokens x the step's
    # summed context could not tell them apart (decode contexts swamp it in mixed steps). A
    # chunk over earlier context does more: its recorded pairs, where the trace has them.
    recorded = col("prefill_pair_tokens") if pairs else np.zeros_like(p)
    attention_k = np.where(recorded > 0, recorded, p * p / seqs) / 1e3
    new_tokens = new * np.minimum(p + d, new_shape_cap_tokens) / 100.0
    return np.column_stack([np.ones_like(p), p, d, c, p * c / 1e3, (p > 0).astype(float),
                            new, new_tokens, idle, short, attention_k,
                            w, w * echo_idle, w * echo_k, span, span_ctx_k, hit_m])


PROFILED_KINDS = ("steps",)
"""trace run kinds whose steps are a profiled grid's (`trace steps`, the PyTorch engine's
grid): cells of one shape in a tight loop, faster than serving steps of their shape"""


def with_profiled(steps: pd.DataFrame, run_kind: str) -> pd.DataFrame:
    """The steps of a trace whose run is of `run_kind`, marked `profiled` or not."""
    return steps.assign(profiled=run_kind in PROFILED_KINDS)


def profiled(steps: pd.DataFrame) -> np.ndarray:
    """1.0 for each step of a profiled grid (its `profiled` column, `with_profiled`), else 0.0:
    a serving step's, as every simulated one."""
    if "profiled" not in steps:
        return np.zeros(len(steps))
    return steps.profiled.fillna(False).to_numpy(float)


def engine_features(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps with `idle_ms` (since the previous step ended), `new_shape` (first step of the
    engine's life with this many scheduled tokens) and the after-prefill echo (`echo_w`, and the
    idle before and tokens of the prefill step it follows), per run and replica in step order;
    the first RUN_WARMUP_STEPS of each are dropped (their features are known, their cost is
    start-up)."""
    out = []
    for _, s in steps.sort_values(["run_id", "replica_id", "step_id"]).groupby(
            ["run_id", "replica_id"], sort=False):
        end_s = s.start_s + s.duration_ms / 1e3
        s = s.assign(idle_ms=((s.start_s - end_s.shift(1)).fillna(0.0) * 1e3).clip(lower=0.0),
                     new_shape=(~(s.prefill_tokens + s.decode_seqs).duplicated()).astype(float))
        out.append(with_echo(s).iloc[RUN_WARMUP_STEPS:])
    return pd.concat(out) if out else steps.assign(idle_ms=[], new_shape=[], echo_w=[],
                                                   echo_idle_ms=[], echo_prefill_tokens=[])


def attach_spans(steps: pd.DataFrame, trace_dirs: list) -> pd.DataFrame:
    """The steps with `spanning_prefill_tokens` (a prefill step's tokens where a chunk of it
    attends to earlier context: its `step_prefill` span beyond its own tokens),
    `span_context_tokens` (that earlier context, summed over the chunks),
    `prefill_pair_tokens` (the chunks' attention pairs) and `hit_pair_tokens` (each chunk's new
    tokens x its earlier context, summed, where the run's engine caches prefixes; a trace
    recorded before `prefill_span_pair_tokens` gives the step's prefill tokens x its summed
    earlier context, exact for one chunk); 0 elsewhere, and for traces recorded before that
    table."""
    frames = [read_table(d, "step_prefill").to_pandas() for d in trace_dirs
              if (Path(d) / "step_prefill").is_dir()]
    keys = ["run_id", "replica_id", "step_id"]
    if not frames:
        return steps.assign(spanning_prefill_tokens=0.0, span_context_tokens=0.0,
                            prefill_pair_tokens=0.0, hit_pair_tokens=0.0)
    cols = ["prefill_context_tokens", "prefill_pair_tokens", "prefill_span_pair_tokens"]
    out = steps.merge(pd.concat(frames)[keys + cols], on=keys, how="left")
    ctx = out.pop("prefill_context_tokens").fillna(0.0).to_numpy()
    recorded = out.pop("prefill_span_pair_tokens").to_numpy(float)  # NaN: not recorded
    p = out.prefill_tokens.to_numpy(float)
    span = np.where(ctx > p, ctx - p, 0.0)
    hits = out.run_id.isin(caching_runs(trace_dirs)).to_numpy()
    hit_pairs = np.where(np.isnan(recorded), p * span, recorded)
    return out.assign(spanning_prefill_tokens=np.where(ctx > p, p, 0.0), span_context_tokens=span,
                      prefill_pair_tokens=out.prefill_pair_tokens.fillna(0.0).astype(float),
                      hit_pair_tokens=np.where(hits & (span > 0), hit_pairs, 0.0))


def caching_runs(trace_dirs: list) -> set[str]:
    """The run ids of the traces whose engine ran with prefix caching."""
    out = set()
    for d in trace_dirs:
        if not (Path(d) / "runs").is_dir():
            continue
        runs = read_table(d, "runs").select(["run_id", "params_json"]).to_pylist()
        out.update(r["run_id"] for r in runs if json.loads(r["params_json"] or "{}").get(
            "engine", {}).get("enable_prefix_caching"))
    return out


def with_echo(s: pd.DataFrame) -> pd.DataFrame:
    """One engine's steps (in order, with `idle_ms`) with the echo features: the weight of a
    decode-only step 1, 2 or 3 steps after the last step that prefilled, that step's idle and
    prefill tokens (0 elsewhere, and before the first prefill)."""
    pre = s.prefill_tokens.gt(0)
    since = s.groupby(pre.cumsum().to_numpy()).cumcount().to_numpy()
    weights = np.asarray((0.0,) + ECHO_WEIGHTS)
    echo = (~pre & pre.cummax()).to_numpy() & (since <= len(ECHO_WEIGHTS))
    w = np.where(echo, weights[np.minimum(since, len(ECHO_WEIGHTS))], 0.0)
    return s.assign(echo_w=w,
                    echo_idle_ms=np.where(echo, s.idle_ms.where(pre).ffill().fillna(0.0), 0.0),
                    echo_prefill_tokens=np.where(
                        echo, s.prefill_tokens.where(pre).ffill().fillna(0.0), 0.0))

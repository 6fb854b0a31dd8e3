"""The `serving` step-time model: the linear model plus what a live engine adds to a step.

step_ms = linear terms (const, prefill tokens, decode sequences, context, prefill x context)
          + c_prefill_step * [the step prefills]
          + new_shape * (c_new + c_new_tok * min(tokens, NEW_SHAPE_TOKENS_CAP) / 100)
          + c_idle * min(idle_ms, IDLE_CAP_MS) / 100
          + c_idle_short * min(idle_ms, IDLE_SHORT_MS) / IDLE_SHORT_MS
          + w_k * (c_echo + c_echo_idle * min(idle before the prefill, IDLE_CAP_MS) / 100
                   + c_echo_tok * tokens of the prefill / 1000)   [k-th decode step after it]
          + c_span * prefill tokens   [a step with a chunk that attends to earlier context]
          + c_span_ctx * earlier context tokens those chunks attend to / 1000
          + c_hit * prefill tokens x that earlier context / 1e6   [an engine with prefix caching]
and prefill_sq_per_seq_k = the step's attention pairs / 1000: over its prefill chunks, new tokens
x the tokens each attends to (`step_prefill.prefill_pair_tokens`; a calibration fitted before
that column was used counts prefill tokens squared over prefill sequences, which it equals for
fresh prompts of one length).

Why each term (what it measured and where: docs/measurements/serving_model_terms.md):
- new shape: the first step that schedules a given number of tokens builds and caches kernels
  for it; a grid repeats its few shapes, live traffic keeps meeting new ones. `tokens` =
  prefill tokens + decode sequences of the step.
- idle: a step after the engine sat idle finds caches and cores cold; capped at IDLE_CAP_MS.
  The saturating short-idle term (full after IDLE_SHORT_MS) carries the cost of two engines
  taking turns on one CPU; calibrations fitted before it have its coefficient 0.
- echo: the first decode steps after a prefill step are slower still, more after a longer idle
  before the prefill and after larger prefills; the k-th is weighed by ECHO_WEIGHTS[k-1].
- span: a prefill whose chunk attends to context computed before it (a prefix-cache hit, an
  earlier chunk of its prompt) costs more per token than a fresh one, and more the more earlier
  context its chunks attend to, beyond their attention pairs: one term per prefill token of
  such a step, one per 1000 earlier tokens summed over its chunks.
- hit: in an engine with prefix caching, where such a step is a prefix-cache hit, its new
  tokens attend to the cached context at a cost the chunks of a long fresh prompt (most of the
  grid's spanning steps) do not show: on four fidelity runs' live prefills over 257-1024 cached
  tokens, the median of each band of cached tokens lay 0.97-1.13x of their run's decode level
  without it (median distance from 1: 7%) and 0.88-1.03x with it (2%)
  (`benchmarks/prefix_hit_terms.py`). Traces do not say which chunk was a hit, so
  the term counts every spanning step of a prefix-caching engine, in the fit and in the
  simulator alike (a replica without prefix caching never pays it).
The extra terms are zero inside a run of decode-only steps (same shape, no idle, past the echo),
so decode runs keep the linear model's closed form and fast-forwarding is unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from pydantic import Field

from sim.step_time.latency import LatencyModel, midpoints
from sim.step_time.schema import LogResiduals, ModelJson, coefs
from sim.step_time.spells import SPELL_S, fit_speed_levels
from sim.step_time.registry import register
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
ECHO_WEIGHTS = (1.0, 0.4, 0.16)
"""the echo's weight on the 1st, 2nd and 3rd decode step after a prefill step (measured: the
extra time falls ~0.4x a step; beyond the third it is within the noise)"""
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
    `prefill_pair_tokens` (the chunks' attention pairs) and `hit_pair_tokens` (prefill tokens x
    earlier context, where the run's engine caches prefixes); 0 elsewhere, and for traces
    recorded before that table."""
    frames = [read_table(d, "step_prefill").to_pandas() for d in trace_dirs
              if (Path(d) / "step_prefill").is_dir()]
    keys = ["run_id", "replica_id", "step_id"]
    if not frames:
        return steps.assign(spanning_prefill_tokens=0.0, span_context_tokens=0.0,
                            prefill_pair_tokens=0.0, hit_pair_tokens=0.0)
    cols = ["prefill_context_tokens", "prefill_pair_tokens"]
    out = steps.merge(pd.concat(frames)[keys + cols], on=keys, how="left")
    ctx = out.pop("prefill_context_tokens").fillna(0.0).to_numpy()
    p = out.prefill_tokens.to_numpy(float)
    span = np.where(ctx > p, ctx - p, 0.0)
    hits = out.run_id.isin(caching_runs(trace_dirs)).to_numpy()
    return out.assign(spanning_prefill_tokens=np.where(ctx > p, p, 0.0), span_context_tokens=span,
                      prefill_pair_tokens=out.prefill_pair_tokens.fillna(0.0).astype(float),
                      hit_pair_tokens=np.where(hits, p * span, 0.0))


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


class ServingJson(ModelJson):
    """A serving model's parameters (older versions wrote fewer features and optional terms)."""

    coef_ms: coefs(len(FEATURES), at_least=len(FEATURES_V1))
    idle_cap_ms: float
    idle_seen_ms: Annotated[float, Field(ge=0, le=IDLE_CAP_MS)] = IDLE_CAP_MS
    """fitted before it was recorded: the cap"""
    run_log_quantiles: LogResiduals = [0.0]
    spell_log_quantiles: LogResiduals = [0.0]
    new_shape_cap_tokens: Annotated[float, Field(gt=0)] | None = None
    """fitted before the cap: none"""
    prefill_pairs: bool = False
    """fitted before pairs were used: tokens squared"""


@register
@dataclass(frozen=True)
class ServingModel:
    """Coefficients (ms per unit of each of FEATURES) and residual quantiles."""

    kind: ClassVar[str] = "serving"
    version: ClassVar[int] = 1
    schema: ClassVar[type] = ServingJson
    engine_state: ClassVar[bool] = True
    """step_ms uses new_shape and idle_ms: the replica tracks shapes seen and idle time"""
    not_compiled: ClassVar[str] = ""
    """the kernels price it as written: its engine state is `sim.kernels.serving`'s"""
    coef_ms: tuple[float, ...]
    residual_log_quantiles: tuple[float, ...] = (0.0,)
    """quantiles of log(actual / predicted) at midpoint probabilities (`midpoints`)"""
    run_log_quantiles: tuple[float, ...] = (0.0,)
    """quantiles of log(median residual in a SPELL_S window / overall median): how far the
    traced machine's speed moved. Sampled latency draws one per replica as its level for the
    whole run: the machine's speed when the simulated run happens, which no calibration can
    measure, taken to move as far as it moved while tracing."""
    idle_seen_ms: float = IDLE_CAP_MS
    """the longest idle the fit saw (<= IDLE_CAP_MS): longer idles count as this long. A trace
    with no idle (a step grid) only has host gaps of a few ms, and its idle coefficients must
    not be extrapolated to the seconds between live arrivals (that made every TTFT +30 ms)."""
    spell_log_quantiles: tuple[float, ...] = (0.0,)
    """quantiles of log(a SPELL_S window's median residual / its run's): the shared machine's
    spells within a run (1.4-1.9x for about a second). Sampled latency draws one per replica and
    window (`sim.step_time.spells`), so bands include what they do to the per-request TPOT tail."""
    new_shape_cap_tokens: float = float("inf")
    """the tokens the first-of-shape term's per-token part counts at most (NEW_SHAPE_TOKENS_CAP
    when fitted; a calibration fitted before the cap counts every token)"""
    pairs: bool = False
    """fitted on recorded attention pairs (`prefill_sq_per_seq_k`): the simulator passes each
    step's; a calibration fitted before counts prefill tokens squared per sequence"""

    def step_ms(self, prefill_tokens: float, decode_seqs: float, context_tokens: float,
                new_shape: bool = False, idle_ms: float = 0.0, prefill_seqs: int = 1,
                echo: tuple[float, float, float] = NO_ECHO, span_context_tokens: int = 0,
                prefill_pair_tokens: int = 0) -> float:
        """Predicted duration of one iteration (`echo`: `EngineState.before_step`'s;
        `span_context_tokens`: the earlier context the step's prefill chunks attend to,
        `prefill_pair_tokens` their attention pairs, `sim.step_time.plan.prefill_spans`)."""
        c = self.coef_ms
        ms = c[0] + c[1] * prefill_tokens + c[2] * decode_seqs + c[3] * context_tokens \
            + c[4] * prefill_tokens * context_tokens / 1e3
        if prefill_tokens:
            pairs = prefill_pair_tokens if self.pairs and prefill_pair_tokens else \
                prefill_tokens * prefill_tokens / max(prefill_seqs, 1)
            ms += c[5] + c[10] * pairs / 1e3 \
                + (c[14] * prefill_tokens + c[15] * span_context_tokens / 1e3
                   + c[16] * prefill_tokens * span_context_tokens / 1e6
                   if span_context_tokens > 0 else 0.0)
        if new_shape:
            ms += c[6] + c[7] * min(prefill_tokens + decode_seqs,
                                    self.new_shape_cap_tokens) / 100.0
        if idle_ms > 0.0:
            idle_ms = min(idle_ms, self.idle_seen_ms)
            ms += c[8] * min(idle_ms, IDLE_CAP_MS) / 100.0 + \
                c[9] * min(idle_ms, IDLE_SHORT_MS) / IDLE_SHORT_MS
        if echo[0]:
            w, echo_idle_ms, tokens = echo
            ms += w * (c[11] + c[12] * min(echo_idle_ms, self.idle_seen_ms, IDLE_CAP_MS) / 100.0
                       + c[13] * tokens / 1e3)
        return ms

    def without_hits(self) -> "ServingModel":
        """The model for an engine without prefix caching: no prefix-cache hit term."""
        c = self.coef_ms
        return self if not c[HIT] else replace(self, coef_ms=(*c[:HIT], 0.0, *c[HIT + 1:]))

    @property
    def echoes(self) -> bool:
        """Whether the model prices the after-prefill echo (fitted with it, not before)."""
        return any(self.coef_ms[11:14])

    def predict_ms(self, steps: pd.DataFrame) -> np.ndarray:
        """Vectorised step_ms over steps with engine features."""
        return feature_matrix(steps, self.idle_seen_ms, self.new_shape_cap_tokens, self.pairs) \
            @ np.asarray(self.coef_ms)

    def prefill_split_ms(self, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """`predict_ms` in two parts: (the rest, the PREFILL_FEATURES' terms)."""
        x, c = feature_matrix(steps, self.idle_seen_ms, self.new_shape_cap_tokens,
                              self.pairs), np.asarray(self.coef_ms)
        own = np.isin(FEATURES, PREFILL_FEATURES)
        return x[:, ~own] @ c[~own], x[:, own] @ c[own]

    @staticmethod
    def usable_steps(steps: pd.DataFrame, trace_dirs: list) -> pd.DataFrame:
        """The traced steps with engine features; first-of-shape steps are data here."""
        steps = engine_features(attach_spans(steps, trace_dirs))
        return steps[steps.duration_ms > 0]

    @classmethod
    def fit_steps(cls, steps: pd.DataFrame, without: tuple[str, ...] = ()) -> "ServingModel":
        """`fit_serving` on usable steps (`calibrate`)."""
        return fit_serving(steps, without=without)

    def predict_steps(self, steps: pd.DataFrame) -> np.ndarray:
        """`predict_ms` over usable steps."""
        return self.predict_ms(steps)

    def step_errors(self, steps: pd.DataFrame) -> dict:
        """`serving_errors` over usable steps."""
        return serving_errors(self, steps)

    def linear(self) -> LatencyModel:
        """The linear part: what a decode run (same shape, no idle, no echo) costs per step."""
        return LatencyModel(self.coef_ms[:LINEAR], self.residual_log_quantiles)

    def decode_run(self, n_seqs: int, context0: int) -> tuple[float, float]:
        """Closed-form run of decode-only steps (extra terms are zero inside a run)."""
        return self.linear().decode_run(n_seqs, context0)

    def residual_sampler(self) -> tuple[float, float]:
        """(mean, std) of the multiplicative residual."""
        return self.linear().residual_sampler()

    def to_json(self) -> dict:
        """Features, coefficients, idle cap, first-of-shape token cap (where there is one),
        whether fitted on attention pairs (where so) and residual quantiles."""
        cap = {"new_shape_cap_tokens": self.new_shape_cap_tokens} \
            if np.isfinite(self.new_shape_cap_tokens) else {}
        pairs = {"prefill_pairs": True} if self.pairs else {}
        return {"features": list(FEATURES), "coef_ms": list(self.coef_ms),
                "idle_cap_ms": IDLE_CAP_MS, "idle_seen_ms": self.idle_seen_ms, **cap, **pairs,
                "residual_log_quantiles": list(self.residual_log_quantiles),
                "run_log_quantiles": list(self.run_log_quantiles),
                "spell_log_quantiles": list(self.spell_log_quantiles)}

    @classmethod
    def from_json(cls, d: dict) -> "ServingModel":
        """The model from `to_json`'s mapping, as `ServingJson` checked it (older versions'
        coefficients padded with zeros for the terms they predate)."""
        v, features = d["coef_ms"], d["features"]
        if features not in [list(f) for f in (FEATURES_V1, FEATURES_V2, FEATURES_V3, FEATURES_V4,
                                               FEATURES_V5, FEATURES_V6, FEATURES)]:
            raise ValueError(f"serving model features {features} differ from {list(FEATURES)}")
        if len(v) != len(features):
            raise ValueError(f"coef_ms: {len(v)} coefficients for {len(features)} features")
        v = v + [0.0] * (len(FEATURES) - len(features))  # before later terms: none
        if d["idle_cap_ms"] != IDLE_CAP_MS:
            raise ValueError(f"idle_cap_ms: {d['idle_cap_ms']!r} is not this version's "
                             f"{IDLE_CAP_MS}")
        if not any(v[:3]):
            raise ValueError(f"coef_ms: {v!r} makes iterations free (all leading coefficients 0)")
        cap = d.get("new_shape_cap_tokens")
        return cls(tuple(v), tuple(d["residual_log_quantiles"]),
                   tuple(d.get("run_log_quantiles", (0.0,))), d.get("idle_seen_ms", IDLE_CAP_MS),
                   tuple(d.get("spell_log_quantiles", (0.0,))),
                   float("inf") if cap is None else cap, d.get("prefill_pairs", False))


def fit_serving(steps: pd.DataFrame, quantiles: int = 100,
                without: tuple[str, ...] = ()) -> ServingModel:
    """NNLS on relative error over steps with engine features (`engine_features`); the
    FEATURES named in `without` are fitted at 0 (an ablation)."""
    unknown = sorted(set(without) - set(FEATURES))
    if unknown:
        raise ValueError(f"without: {unknown} are not serving-model features {list(FEATURES)}")
    y = steps.duration_ms.to_numpy(float)
    x = feature_matrix(steps)
    span = x[:, FEATURES.index("spanning_prefill_tokens")] > 0
    shapes = x[span][:, [FEATURES.index("prefill_tokens"), FEATURES.index("span_context_k")]]
    if len(np.unique(shapes, axis=0)) < MIN_SPAN_SHAPES:
        without = tuple(without) + SPAN_TERMS  # too few to tell the terms from a one-off
    hit = x[:, HIT] > 0
    if len(np.unique(x[hit][:, [FEATURES.index("prefill_tokens"), HIT]], axis=0)) \
            < MIN_SPAN_SHAPES:
        without = tuple(without) + ("hit_pairs_m",)
    x[:, [FEATURES.index(f) for f in without]] = 0.0
    # a step per feature the steps exercise (one never nonzero, e.g. the echo of a grid without
    # decode after prefills, gets 0 and asks for no step)
    need = int((x != 0).any(axis=0).sum()) if len(x) else len(FEATURES)
    if y.size < need or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need >= {need} finite positive step durations, got {y.size}")
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    coef = coef / scale
    ratio = y / np.maximum(x @ coef, 1e-9)
    q = np.quantile(np.log(ratio), midpoints(quantiles))
    runs, spells = fit_speed_levels(steps.run_id.astype(str).to_numpy(),
                                    steps.start_s.to_numpy(), ratio)
    return ServingModel(tuple(float(c) for c in coef), tuple(float(v) for v in q), runs,
                        float(min(IDLE_CAP_MS, steps.idle_ms.max())), spells,
                        NEW_SHAPE_TOKENS_CAP, True)


def serving_errors(model: ServingModel, steps: pd.DataFrame) -> dict:
    """MAPE, median and P90 absolute percentage error (fractions) on rows with engine features."""
    y = steps.duration_ms.to_numpy(float)
    ape = np.abs(model.predict_ms(steps) - y) / y
    return {"mape": float(ape.mean()), "p50_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9)), "rows": int(y.size)}

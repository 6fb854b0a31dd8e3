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
          + c_hit * each chunk's new tokens x its earlier context / 1e6   [prefix caching on]
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
  the term counts every spanning chunk of a prefix-caching engine, in the fit and in the
  simulator alike (a replica without prefix caching never pays it); it is per chunk, new
  tokens x that chunk's earlier context (`step_prefill.prefill_span_pair_tokens`), as a step's
  prefill tokens x its summed earlier context would count k chunks' cross terms k times over.
- profiled: a step of a profiled grid (`tracers.step_profile`: cells of one shape in a tight
  loop) runs faster than a serving step of the same shape (a live replay's): on two fidelity
  runs' decode steps the grid's single sequences ran 3% below the calibration traffic's. The
  fit prices a serving step and carries what a profiled one costs less as `profiled_ms` (on the
  traced steps, read from their run's kind); the simulator serves, so it never subtracts it.
The extra terms are zero inside a run of decode-only steps (same shape, no idle, past the echo),
so decode runs keep the linear model's closed form and fast-forwarding is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, ClassVar

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from pydantic import Field

from sim.step_time.latency import LatencyModel, check_prices_steps, midpoints
from sim.step_time.schema import Coef, LogResiduals, ModelJson, coefs
from sim.step_time.spells import part_quantiles, window_parts
from sim.step_time.registry import register
from sim.step_time.serving_features import (FEATURES, FEATURES_V1, FEATURES_V2, FEATURES_V3,
                                            FEATURES_V4, FEATURES_V5, FEATURES_V6, HIT,
                                            IDLE_CAP_MS, IDLE_SHORT_MS, LINEAR, MIN_SPAN_SHAPES,
                                            NEW_SHAPE_TOKENS_CAP, NO_ECHO, PREFILL_FEATURES,
                                            SPAN_TERMS, attach_spans, engine_features,
                                            feature_matrix, profiled)

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
    step_log_quantiles: LogResiduals | None = None
    """fitted before a step's residual was split into its window's level and its own noise:
    none (sampled latency draws the whole residual)"""
    profiled_ms: Coef = 0.0
    """fitted before the profiled-grid term: none"""
    prefill_log_quantiles: LogResiduals | None = None
    """fitted before prefill steps' own noise was taken apart: none (they draw every step's)"""


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
    """a calibration fitted before `step_log_quantiles`: quantiles of log(median residual in a
    SPELL_S window / overall median), drawn once per replica as its level for the run; (0.0,)
    since (the window levels are the spells')"""
    idle_seen_ms: float = IDLE_CAP_MS
    """the longest idle the fit saw (<= IDLE_CAP_MS): longer idles count as this long. A trace
    with no idle (a step grid) only has host gaps of a few ms, and its idle coefficients must
    not be extrapolated to the seconds between live arrivals (that made every TTFT +30 ms)."""
    spell_log_quantiles: tuple[float, ...] = (0.0,)
    """quantiles of log(a SPELL_S window's median residual / all steps' median): the shared
    machine's level per window, spells (1.4-1.9x for about a second) and drift alike (before
    `step_log_quantiles`: over its own run's median). Sampled latency draws one per replica and
    window (`sim.step_time.spells`), so bands include what they do to the per-request TPOT tail."""
    new_shape_cap_tokens: float = float("inf")
    """the tokens the first-of-shape term's per-token part counts at most (NEW_SHAPE_TOKENS_CAP
    when fitted; a calibration fitted before the cap counts every token)"""
    pairs: bool = False
    """fitted on recorded attention pairs (`prefill_sq_per_seq_k`): the simulator passes each
    step's; a calibration fitted before counts prefill tokens squared per sequence"""
    step_log_quantiles: tuple[float, ...] = ()
    """quantiles of log(a step's residual / its SPELL_S window's median) + log(all steps'
    median): the step's own noise, which sampled latency draws per step beside the window's
    level (`sim.step_time.spells.step_noise`); () for a calibration fitted before"""
    profiled_ms: float = 0.0
    """what a step of a profiled grid takes less than a serving step of its shape (`const`
    prices the serving step); 0 for a calibration fitted before the term or without both"""
    prefill_log_quantiles: tuple[float, ...] = ()
    """quantiles of a serving prefill step's own noise as `step_log_quantiles` takes it (its
    residual over its window's level, times all steps'), which sampled latency draws for a
    step that prefills (`sim.step_time.spells.prefill_noise`); () for a calibration fitted
    before or on fewer than MIN_PREFILL_NOISE_STEPS such steps"""

    def step_ms(self, prefill_tokens: float, decode_seqs: float, context_tokens: float,
                new_shape: bool = False, idle_ms: float = 0.0, prefill_seqs: int = 1,
                echo: tuple[float, float, float] = NO_ECHO, span_context_tokens: int = 0,
                prefill_pair_tokens: int = 0, span_pair_tokens: int = 0) -> float:
        """Predicted duration of one iteration (`echo`: `EngineState.before_step`'s;
        `span_context_tokens`: the earlier context the step's prefill chunks attend to,
        `prefill_pair_tokens` their attention pairs, `span_pair_tokens` their new tokens x
        that earlier context, `sim.step_time.plan.prefill_spans`)."""
        c = self.coef_ms
        ms = c[0] + c[1] * prefill_tokens + c[2] * decode_seqs + c[3] * context_tokens \
            + c[4] * prefill_tokens * context_tokens / 1e3
        if prefill_tokens:
            pairs = prefill_pair_tokens if self.pairs and prefill_pair_tokens else \
                prefill_tokens * prefill_tokens / max(prefill_seqs, 1)
            ms += c[5] + c[10] * pairs / 1e3 \
                + (c[14] * prefill_tokens + c[15] * span_context_tokens / 1e3
                   + c[16] * span_pair_tokens / 1e6
                   if span_context_tokens > 0 else 0.0)
        if new_shape:
            ms += c[6] + c[7] * min(prefill_tokens + decode_seqs,
                                    self.new_shape_cap_tokens) / 100.0
        if idle_ms > 0.0:
            idle_ms = min(idle_ms, self.idle_seen_ms)
            ms += c[8] * min(idle_ms, IDLE_CAP_MS) / 100.0 + \
                c[9] * min(idle_ms, IDLE_SHORT_MS) / IDLE_SHORT_MS
        if echo[0]:
            ms += echo[0] * self.echo_ms(echo[1], echo[2])
        return ms

    def echo_ms(self, echo_idle_ms: float, tokens: float) -> float:
        """The after-prefill echo at weight 1 (ECHO_WEIGHTS scale it per step) of a prefill
        step of `tokens` after `echo_idle_ms` of idle."""
        c = self.coef_ms
        return c[11] + c[12] * min(echo_idle_ms, self.idle_seen_ms, IDLE_CAP_MS) / 100.0 \
            + c[13] * tokens / 1e3

    def without_hits(self) -> "ServingModel":
        """The model for an engine without prefix caching: no prefix-cache hit term."""
        c = self.coef_ms
        return self if not c[HIT] else replace(self, coef_ms=(*c[:HIT], 0.0, *c[HIT + 1:]))

    @property
    def echoes(self) -> bool:
        """Whether the model prices the after-prefill echo (fitted with it, not before)."""
        return any(self.coef_ms[11:14])

    def predict_ms(self, steps: pd.DataFrame) -> np.ndarray:
        """Vectorised step_ms over steps with engine features (less `profiled_ms` where a
        `profiled` column marks a profiled grid's steps)."""
        ms = feature_matrix(steps, self.idle_seen_ms, self.new_shape_cap_tokens, self.pairs) \
            @ np.asarray(self.coef_ms)
        return ms - self.profiled_ms * profiled(steps)

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
        whether fitted on attention pairs (where so), residual, level and own-noise quantiles."""
        cap = {"new_shape_cap_tokens": self.new_shape_cap_tokens} \
            if np.isfinite(self.new_shape_cap_tokens) else {}
        pairs = {"prefill_pairs": True} if self.pairs else {}
        own = {"step_log_quantiles": list(self.step_log_quantiles)} \
            if self.step_log_quantiles else {}
        if self.profiled_ms:
            own["profiled_ms"] = self.profiled_ms
        if self.prefill_log_quantiles:
            own["prefill_log_quantiles"] = list(self.prefill_log_quantiles)
        return {"features": list(FEATURES), "coef_ms": list(self.coef_ms),
                "idle_cap_ms": IDLE_CAP_MS, "idle_seen_ms": self.idle_seen_ms, **cap, **pairs,
                "residual_log_quantiles": list(self.residual_log_quantiles),
                "run_log_quantiles": list(self.run_log_quantiles),
                "spell_log_quantiles": list(self.spell_log_quantiles), **own}

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
        check_prices_steps(v)
        cap = d.get("new_shape_cap_tokens")
        return cls(tuple(v), tuple(d["residual_log_quantiles"]),
                   tuple(d.get("run_log_quantiles", (0.0,))), d.get("idle_seen_ms", IDLE_CAP_MS),
                   tuple(d.get("spell_log_quantiles", (0.0,))),
                   float("inf") if cap is None else cap, d.get("prefill_pairs", False),
                   tuple(d.get("step_log_quantiles") or ()), d.get("profiled_ms", 0.0),
                   tuple(d.get("prefill_log_quantiles") or ()))


MIN_PREFILL_NOISE_STEPS = 30
"""serving prefill steps a fit needs to draw their own noise apart from every step's"""

GAP_TERMS = ("new_shape", "new_shape_x_tokens_100", "idle_100ms", "idle_short", "echo",
             "echo_idle_100ms", "echo_prefill_k")
"""the terms a step pays for what came before it (a gap, a new shape, a prefill just before):
dropped from a fit in which they priced every step and a steady decode step at 0"""


def _relative_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative squared error of x @ coef on y."""
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    return coef / scale


def fit_serving(steps: pd.DataFrame, quantiles: int = 100,
                without: tuple[str, ...] = ()) -> ServingModel:
    """NNLS on relative error over steps with engine features (`engine_features`); the
    FEATURES named in `without` are fitted at 0 (an ablation); GAP_TERMS too where the fit
    would price a steady decode step at 0. Where the steps are of profiled grids and of
    serving runs both, a serving-step term beside `const` (folded into it) is `profiled_ms`."""
    unknown = sorted(set(without) - set(FEATURES))
    if unknown:
        raise ValueError(f"without: {unknown} are not serving-model features {list(FEATURES)}")
    y = steps.duration_ms.to_numpy(float)
    serving = 1.0 - profiled(steps)
    both = bool(serving.any() and not serving.all())
    # the serving-step column last, where both kinds are there to tell it from `const`
    x = np.column_stack([feature_matrix(steps), serving if both else np.zeros_like(y)])
    without = tuple(without) + _untold_terms(x)
    x[:, [FEATURES.index(f) for f in without]] = 0.0
    # a step per feature the steps exercise (one never nonzero, e.g. the echo of a grid without
    # decode after prefills, gets 0 and asks for no step)
    need = int((x != 0).any(axis=0).sum()) if len(x) else len(FEATURES)
    if y.size < need or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need >= {need} finite positive step durations, got {y.size}")
    coef = _relative_nnls(x, y)
    try:
        check_prices_steps(_served(coef))
    except ValueError:
        # Every step followed a gap or was a new shape (a pool that serves in bursts, on a busy
        # machine): the gap terms stood in for the constant, and a steady step would be free.
        # Those terms cannot be told from a steady step's cost on such steps: fit without them.
        x[:, [FEATURES.index(f) for f in GAP_TERMS]] = 0.0
        coef = _relative_nnls(x, y)
        check_prices_steps(_served(coef))  # refused here, not by the loader after it was written
    ratio = y / np.maximum(x @ coef, 1e-9)
    q = np.quantile(np.log(ratio), midpoints(quantiles))
    parts = window_parts(steps.run_id.astype(str).to_numpy(), steps.start_s.to_numpy(), ratio)
    levels, own = part_quantiles(*parts, quantiles)
    return ServingModel(_served(coef), tuple(float(v) for v in q), (0.0,),
                        float(min(IDLE_CAP_MS, steps.idle_ms.max())), levels,
                        NEW_SHAPE_TOKENS_CAP, True, own, float(coef[-1]),
                        prefill_noise_quantiles(steps, parts[1], quantiles))


def prefill_noise_quantiles(steps: pd.DataFrame, own: np.ndarray, quantiles: int,
                            ) -> tuple[float, ...]:
    """Log quantiles of the serving prefill steps' own noise (`own`: every step's, its window's
    level taken out, `spells.window_parts`), or () on fewer than MIN_PREFILL_NOISE_STEPS."""
    serving = (steps.prefill_tokens.to_numpy() > 0) & (profiled(steps) == 0)
    if serving.sum() < MIN_PREFILL_NOISE_STEPS:
        return ()
    return tuple(float(v) for v in np.quantile(own[serving], midpoints(quantiles)))


def _served(coef: np.ndarray) -> tuple[float, ...]:
    """FEATURES' coefficients of a fit with the serving-step column last, folded into `const`:
    a serving step's (every simulated step is one)."""
    return (float(coef[0] + coef[-1]), *(float(c) for c in coef[1:-1]))


def _untold_terms(x: np.ndarray) -> tuple[str, ...]:
    """Terms the steps cannot tell from a one-off: the spanning terms over fewer than
    MIN_SPAN_SHAPES shapes of spanning steps, the hit term over fewer of hit steps."""
    span = x[:, FEATURES.index("spanning_prefill_tokens")] > 0
    shapes = x[span][:, [FEATURES.index("prefill_tokens"), FEATURES.index("span_context_k")]]
    untold = SPAN_TERMS if len(np.unique(shapes, axis=0)) < MIN_SPAN_SHAPES else ()
    hit = x[:, HIT] > 0
    if len(np.unique(x[hit][:, [FEATURES.index("prefill_tokens"), HIT]], axis=0)) \
            < MIN_SPAN_SHAPES:
        untold += ("hit_pairs_m",)
    return untold


def serving_errors(model: ServingModel, steps: pd.DataFrame) -> dict:
    """MAPE, median and P90 absolute percentage error (fractions) on rows with engine features."""
    y = steps.duration_ms.to_numpy(float)
    ape = np.abs(model.predict_ms(steps) - y) / y
    return {"mape": float(ape.mean()), "p50_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9)), "rows": int(y.size)}

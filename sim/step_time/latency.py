"""Per-iteration latency model: linear in batch features, fitted with non-negative least squares.

step_ms = c0 + c_prefill * prefill_tokens + c_decode * decode_seqs + c_context * context_tokens
          + c_attn * prefill_tokens * context_tokens / 1e3

Linear in the decode terms on purpose: over a run of decode-only iterations the context grows by
one token per sequence per step, so the time of k iterations is a closed-form quadratic in k and
the simulator can fast-forward over them (and solve for the iteration an arrival lands in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from scipy.optimize import nnls

from sim.step_time.registry import register
from sim.step_time.schema import ModelJson, coefs

if TYPE_CHECKING:
    import pandas as pd

FEATURES = ("const", "prefill_tokens", "decode_seqs", "context_tokens", "prefill_x_context_k")
STEP_COLUMNS = ("prefill_tokens", "decode_seqs", "context_tokens")
"""the steps table's columns the linear model reads"""
ECHO_WEIGHTS = (1.0, 0.4, 0.16)
"""the `serving` model's after-prefill echo: its weight on the 1st, 2nd and 3rd decode step after
a prefill step (measured: the extra time falls ~0.4x a step; beyond the third it is within the
noise). A decode run may start at an echo step: its first iterations carry it (`run_ms`)."""


def feature_matrix(prefill_tokens, decode_seqs, context_tokens) -> np.ndarray:
    """Design matrix (rows = iterations) in FEATURES order."""
    p = np.asarray(prefill_tokens, dtype=float)
    d = np.asarray(decode_seqs, dtype=float)
    c = np.asarray(context_tokens, dtype=float)
    return np.column_stack([np.ones_like(p), p, d, c, p * c / 1e3])


class LinearJson(ModelJson):
    """A linear model's parameters: one coefficient per feature."""

    coef_ms: coefs(len(FEATURES))


@register
@dataclass(frozen=True)
class LatencyModel:
    """Fitted coefficients (milliseconds per unit of each feature) and residual quantiles.

    The `linear` step-time model (`sim.step_time.registry.StepTimeModel`), with a closed-form
    decode run.
    """

    kind: ClassVar[str] = "linear"
    version: ClassVar[int] = 1
    schema: ClassVar[type] = LinearJson
    coef_ms: tuple[float, ...]
    """coefficients in FEATURES order"""
    residual_log_quantiles: tuple[float, ...] = (0.0,)
    """quantiles (evenly spaced probabilities) of log(actual / predicted) on the training split"""

    def step_ms(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        """Predicted mean duration of one iteration."""
        c0, cp, cd, cc, cx = self.coef_ms
        return c0 + cp * prefill_tokens + cd * decode_seqs + cc * context_tokens \
            + cx * prefill_tokens * context_tokens / 1e3

    def predict_ms(self, prefill_tokens, decode_seqs, context_tokens) -> np.ndarray:
        """Vectorised step_ms."""
        return feature_matrix(prefill_tokens, decode_seqs, context_tokens) @ np.asarray(self.coef_ms)

    def decode_run(self, n_seqs: int, context0: int) -> tuple[float, float]:
        """(a_ms, b_ms): iteration k (0-based) of a decode-only run lasts a_ms + b_ms * k.

        `context0` is the summed context of the n sequences before the run; after iteration k it
        is context0 + n * (k + 1).
        """
        c0, _, cd, cc, _ = self.coef_ms
        return c0 + cd * n_seqs + cc * (context0 + n_seqs), cc * n_seqs

    def to_json(self) -> dict:
        """Features, coefficients and residual quantiles."""
        return {"features": list(FEATURES), "coef_ms": list(self.coef_ms),
                "residual_log_quantiles": list(self.residual_log_quantiles)}

    @classmethod
    def from_json(cls, d: dict) -> "LatencyModel":
        """The model from `to_json`'s mapping."""
        if d.get("features") != list(FEATURES):
            raise ValueError(f"linear model features {d.get('features')} differ from "
                             f"{list(FEATURES)}")
        coef = tuple(d["coef_ms"])
        check_prices_steps(coef)
        return cls(coef, tuple(d["residual_log_quantiles"]))

    def residual_sampler(self) -> tuple[float, float]:
        """(mean, std) of the multiplicative residual exp(log ratio)."""
        q = np.exp(np.asarray(self.residual_log_quantiles))
        return float(q.mean()), float(q.std())

    @staticmethod
    def usable_steps(steps, trace_dirs: list) -> pd.DataFrame:
        """The traced steps this kind fits: warm-up steps dropped (first of their shape)."""
        return steps[~steps.is_warmup & (steps.duration_ms > 0)]

    @classmethod
    def fit_steps(cls, steps, without: tuple[str, ...] = ()) -> "LatencyModel":
        """Fitted on usable steps (`calibrate`); the linear model has no term to leave out."""
        if without:
            raise ValueError(f"without: {list(without)}: the linear model has no optional terms")
        return fit(*(steps[c] for c in STEP_COLUMNS), steps.duration_ms)

    def predict_steps(self, steps) -> np.ndarray:
        """`predict_ms` over a steps table."""
        return self.predict_ms(*(steps[c] for c in STEP_COLUMNS))

    def step_errors(self, steps) -> dict:
        """`errors` over a steps table."""
        return errors(self, *(steps[c] for c in STEP_COLUMNS), steps.duration_ms)


def run_ms(a_ms: float, b_ms: float, k: int, echo_ms: float = 0.0, echo_at: int = 0) -> float:
    """Total duration of the first k iterations of a decode run. `echo_at` > 0: the run's first
    iteration is decode step `echo_at` after a prefill, and each iteration up to the third adds
    its ECHO_WEIGHTS share of `echo_ms` (`ServingModel.echo_ms`)."""
    ms = k * a_ms + b_ms * k * (k - 1) / 2.0
    if echo_at:
        for w in ECHO_WEIGHTS[echo_at - 1:echo_at - 1 + k]:
            ms += w * echo_ms
    return ms


def iterations_within(a_ms: float, b_ms: float, dt_ms: float, echo_ms: float = 0.0,
                      echo_at: int = 0) -> int:
    """Smallest k such that the first k iterations (`run_ms`'s) end at or after dt_ms (k >= 1)."""
    if dt_ms <= 0:
        return 1
    if b_ms <= 1e-12:
        k = math.ceil(dt_ms / a_ms)
    else:  # b/2 k^2 + (a - b/2) k - dt = 0
        h = a_ms - b_ms / 2.0
        k = math.ceil((-h + math.sqrt(h * h + 2.0 * b_ms * dt_ms)) / b_ms)
    k = max(k, 1)
    # guard float rounding both ways (and the echo, which the guess leaves out)
    while k > 1 and run_ms(a_ms, b_ms, k - 1, echo_ms, echo_at) >= dt_ms:
        k -= 1
    while run_ms(a_ms, b_ms, k, echo_ms, echo_at) < dt_ms:
        k += 1
    return k


def midpoints(n: int) -> np.ndarray:
    """Probabilities (i + 0.5) / n: n quantiles that each stand for 1/n of the mass. Evenly
    spaced ones from 0 to 1 would give the single slowest step (a 78x stall was seen) the weight
    of 1% of all steps in the mean residual, and in every sampled draw."""
    return (np.arange(n) + 0.5) / n


FREE_STEP_MS = 1e-6
"""a decode step priced under this (a nanosecond) is free: a model that prices one so is refused"""


def check_prices_steps(coef_ms) -> None:
    """Raise unless step-time coefficients (const, prefill, decode and context first, as both
    model kinds lead) price a decode step of one sequence over one context token: a fit on noisy
    steps may put const and decode at 0 and the context term above 0, which still prices it."""
    const, _prefill, decode, context = coef_ms[:4]
    if const + decode + context < FREE_STEP_MS:
        raise ValueError(f"coef_ms: {list(coef_ms)!r} makes iterations free (a decode step "
                         f"priced under {FREE_STEP_MS} ms: const, decode and context "
                         "coefficients all 0)")


def fit(prefill_tokens, decode_seqs, context_tokens, duration_ms, quantiles: int = 100,
        ) -> LatencyModel:
    """Fit coefficients minimising relative squared error (NNLS on rows scaled by 1/y)."""
    y = np.asarray(duration_ms, dtype=float)
    if y.size < len(FEATURES) or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need >= {len(FEATURES)} finite positive step durations, got {y.size}")
    x = feature_matrix(prefill_tokens, decode_seqs, context_tokens)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / y[:, None], np.ones_like(y))
    coef = coef / scale
    check_prices_steps(coef)  # refused here, not by the loader after it was written
    pred = x @ coef
    log_ratio = np.log(y / np.maximum(pred, 1e-9))
    q = np.quantile(log_ratio, midpoints(quantiles))
    return LatencyModel(tuple(float(c) for c in coef), tuple(float(v) for v in q))


def errors(model: LatencyModel, prefill_tokens, decode_seqs, context_tokens, duration_ms) -> dict:
    """MAPE, median and P90 absolute percentage error (fractions) of the model on rows."""
    y = np.asarray(duration_ms, dtype=float)
    ape = np.abs(model.predict_ms(prefill_tokens, decode_seqs, context_tokens) - y) / y
    return {"mape": float(ape.mean()), "p50_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9)), "rows": int(y.size)}

"""Step time of a partially loaded (early-exit) model: a fixed part plus a part per loaded layer.

step_ms(depth) = fixed(x) + depth * per_layer(x) + prefill_seqs * (a + depth * b), with x the
`linear` model's features (prefill tokens, decode sequences, context tokens, prefill x context).
The decoder layers are identical, so one per-layer term serves every depth; at a given depth the
model is an ordinary `linear` model (`at_depth`), with its closed-form decode runs, plus a cost
per prefilled sequence (`prefill_seq_ms`: the PyTorch engine prefills each admitted prompt in its
own forward, so a step that admits many short prompts costs more than one long prompt of the same
tokens). Fitted on the PyTorch engine's steps at every loaded depth (`reasonsim trace exits`),
where a step's depth is its number of `layer_times` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from scipy.optimize import nnls

from pydantic import Field

from sim.step_time.latency import (FEATURES, LatencyModel, check_prices_steps, feature_matrix,
                                   midpoints)
from sim.step_time.registry import register
from sim.step_time.schema import Coef, ModelJson, coefs


class LayeredJson(ModelJson):
    """A layered model's parameters: fixed and per-layer coefficients, the full depth."""

    fixed_ms: coefs(len(FEATURES))
    layer_ms: coefs(len(FEATURES))
    layers: Annotated[int, Field(ge=1, le=10_000)]
    prefill_seq_ms: Annotated[list[Coef], Field(min_length=2, max_length=2)] = [0.0, 0.0]


@register
@dataclass(frozen=True)
class LayeredModel:
    """Coefficients of the fixed and the per-layer part (ms per feature unit), and residuals."""

    kind: ClassVar[str] = "layered"
    version: ClassVar[int] = 1
    schema: ClassVar[type] = LayeredJson
    not_compiled: ClassVar[str] = ("a step's cost depends on its loaded depth, which only the "
                                   "HELIOS replica (`sim.families.helios.replica`) carries")
    fixed_ms: tuple[float, ...]
    layer_ms: tuple[float, ...]
    layers: int
    """the model's full depth"""
    residual_log_quantiles: tuple[float, ...] = (0.0,)
    prefill_seq_ms: tuple[float, float] = (0.0, 0.0)
    """per prefilled sequence: (fixed ms, ms per loaded layer)"""

    def prefill_seqs_ms(self, depth: int, seqs: int) -> float:
        """The per-sequence prefill cost of a step that admits `seqs` prompts at `depth`."""
        a, b = self.prefill_seq_ms
        return seqs * (a + depth * b)

    def steps_ms(self, prefill_tokens, decode_seqs, context_tokens, depth,
                 prefill_seqs) -> np.ndarray:
        """Each step's mean price (ms, unscaled) at its own loaded depth, over arrays of steps:
        the fixed and per-layer parts and the per-sequence prefill cost."""
        x = feature_matrix(prefill_tokens, decode_seqs, context_tokens)
        d = np.asarray(depth, dtype=float)
        a, b = self.prefill_seq_ms
        return x @ np.asarray(self.fixed_ms) + d * (x @ np.asarray(self.layer_ms)) \
            + np.asarray(prefill_seqs, dtype=float) * (a + d * b)

    def at_depth(self, depth: int) -> LatencyModel:
        """The linear step-time model with `depth` layers loaded."""
        if not 1 <= depth <= self.layers:
            raise ValueError(f"depth {depth}: the model has {self.layers} layers")
        coef = tuple(f + depth * g for f, g in zip(self.fixed_ms, self.layer_ms))
        return LatencyModel(coef, self.residual_log_quantiles)

    def step_ms(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        """Duration at full depth."""
        return self.at_depth(self.layers).step_ms(prefill_tokens, decode_seqs, context_tokens)

    def decode_run(self, n_seqs: int, context0: int) -> tuple[float, float]:
        """Closed-form decode run at full depth."""
        return self.at_depth(self.layers).decode_run(n_seqs, context0)

    def residual_sampler(self) -> tuple[float, float]:
        """(mean, std) of the multiplicative residual."""
        return self.at_depth(self.layers).residual_sampler()

    def to_json(self) -> dict:
        """Features, both coefficient vectors, depth and residual quantiles."""
        return {"features": list(FEATURES), "fixed_ms": list(self.fixed_ms),
                "layer_ms": list(self.layer_ms), "layers": self.layers,
                "prefill_seq_ms": list(self.prefill_seq_ms),
                "residual_log_quantiles": list(self.residual_log_quantiles)}

    @classmethod
    def from_json(cls, d: dict) -> "LayeredModel":
        """The model from `to_json`'s mapping, every number checked."""
        if d.get("features") != list(FEATURES):
            raise ValueError(f"layered model features {d.get('features')} differ from "
                             f"{list(FEATURES)}")
        fixed, layer = tuple(d["fixed_ms"]), tuple(d["layer_ms"])
        if not any(layer[:3]):
            raise ValueError("layer_ms: layers that take no time (all leading coefficients 0)")
        check_prices_steps([f + g for f, g in zip(fixed, layer)])  # depth 1 prices the least
        seq = d.get("prefill_seq_ms", [0.0, 0.0])
        return cls(fixed, layer, d["layers"], tuple(d["residual_log_quantiles"]), tuple(seq))


def fit_layered(prefill_tokens, decode_seqs, context_tokens, depth, duration_ms, layers: int,
                prefill_seqs=None, quantiles: int = 101) -> LayeredModel:
    """NNLS on relative error over steps of every depth: [x, depth * x, s, depth * s] -> duration
    (s: prefilled sequences; without them the per-sequence term is 0)."""
    y = np.asarray(duration_ms, dtype=float)
    d = np.asarray(depth, dtype=float)
    n = 2 * len(FEATURES)
    if y.size < n or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need >= {n} finite positive step durations, got {y.size}")
    if len(np.unique(d)) < 2:
        raise ValueError("need steps at two or more loaded depths to separate the per-layer time")
    x = feature_matrix(prefill_tokens, decode_seqs, context_tokens)
    seqs = np.zeros_like(y) if prefill_seqs is None else np.asarray(prefill_seqs, dtype=float)
    xx = np.hstack([x, x * d[:, None], seqs[:, None], (seqs * d)[:, None]])
    scale = xx.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((xx / scale) / y[:, None], np.ones_like(y))
    coef = coef / scale
    log_ratio = np.log(y / np.maximum(xx @ coef, 1e-9))
    q = np.quantile(log_ratio, midpoints(quantiles))  # not 0..1: one stall would weigh 1%
    k = len(FEATURES)
    check_prices_steps(coef[:k] + coef[k:2 * k])  # at depth 1, the cheapest
    return LayeredModel(tuple(map(float, coef[:k])), tuple(map(float, coef[k:2 * k])), int(layers),
                        tuple(map(float, q)), (float(coef[-2]), float(coef[-1])))

"""The numbers a calibration's `step_time_model` holds, as strict types: every kind registers a
model of its parameters (`sim.step_time.registry.register`), checked before the kind reads them,
so no kind parses its own JSON by hand.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from inputs.limits import MAX_COEF_MS, MAX_LOG_RESIDUAL
from inputs.strict import Strict

Coef = Annotated[float, Field(ge=0, le=MAX_COEF_MS)]
"""ms per unit of a feature: a coefficient beyond the cap is no measurement"""
LogResidual = Annotated[float, Field(ge=-MAX_LOG_RESIDUAL, le=MAX_LOG_RESIDUAL)]
"""log(actual / predicted): a step e^10 times its prediction is no residual"""
LogResiduals = Annotated[list[LogResidual], Field(min_length=1, max_length=100_000)]


def coefs(n: int, at_least: int | None = None):
    """`n` coefficients (from `at_least` to `n` where older versions wrote fewer)."""
    return Annotated[list[Coef], Field(min_length=at_least or n, max_length=n)]


class ModelJson(Strict):
    """The base of every kind's parameters: the features it was fitted on, its residuals."""

    features: list[str]
    residual_log_quantiles: LogResiduals

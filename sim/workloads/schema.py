"""A config's `workload:` section (synthetic or a trace replay) as strict models.

Strict as every input (`inputs.strict`): `num_requests: 2.5`, `rate_per_s: "4"`, `low: true` and
NaN are errors, never a 2, a 4.0 or a 1; bounds are physical (`inputs.limits`). A length is a
whole number of tokens or a mapping whose `kind` picks its model; an arrival process likewise.
`workload.programs` is its family's (`programs.workload`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, ValidationError, model_validator

from inputs.limits import (INT32_MAX, MAX_CV, MAX_REQUESTS, MAX_SIGMA, MIN_CV,
                           MIN_RATE_PER_S)
from inputs.strict import Strict, one_line

Tokens = Annotated[int, Field(ge=1, le=INT32_MAX)]
Rate = Annotated[float, Field(ge=MIN_RATE_PER_S)]
"""requests per second: at least one a day (slower puts arrivals where a latency vanishes in
the clock's float precision)"""
PROMPT_TEXTS = ("random", "testbed")
"""what a live replay's prompts are made of (the simulator sees lengths only): random token ids,
or the testbed's questions (text a draft model predicts: it sets speculative acceptance)"""
TRACE_FORMATS = ("requests", "azure", "mooncake", "burstgpt", "vidur")
"""trace formats `workload.trace.format` accepts"""


class Uniform(Strict):
    """Whole lengths from `low` to `high`, both included."""

    kind: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _ordered(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class Lognormal(Strict):
    """Lengths whose mean is `mean`, rounded to whole tokens, at least 1, at most `max`."""

    kind: Literal["lognormal"]
    mean: Annotated[float, Field(gt=0, le=INT32_MAX)]
    sigma: Annotated[float, Field(ge=0, le=MAX_SIGMA)]
    max: Tokens | None = None

    @model_validator(mode="after")
    def _mean_within_max(self):
        if self.max is not None and self.mean > self.max:
            raise ValueError(f"mean ({self.mean}) must be <= max ({self.max})")
        if self.max is not None and self.sigma > 0:
            capped = capped_lognormal_mean(self.mean, self.sigma, self.max)
            if capped < CAPPED_MEAN_SHARE * self.mean:  # the cap sets the lengths, not `mean`
                raise ValueError(f"max {self.max} with sigma {self.sigma} cuts the mean "
                                 f"{self.mean} to {capped:.0f} tokens; the workload would not "
                                 "have the mean asked for (raise max or lower sigma)")
        return self


CAPPED_MEAN_SHARE = 0.75
"""a lognormal's `max` may take at most this share off its `mean`"""


def capped_lognormal_mean(mean: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for a lognormal X of mean `mean`: its mass below the cap, plus the cap's."""
    def phi(z: float) -> float:
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    mu = math.log(mean) - sigma ** 2 / 2
    z = (math.log(cap) - mu) / sigma
    return mean * phi(z - sigma) + cap * (1 - phi(z))


class Choice(Strict):
    """One of `values`, by `weights` (uniform without)."""

    kind: Literal["choice"]
    values: Annotated[list[Tokens], Field(min_length=1)]
    weights: list[Annotated[float, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _weighted(self):
        if self.weights is not None and (len(self.weights) != len(self.values)
                                         or sum(self.weights) <= 0):
            raise ValueError(f"weights must be {len(self.values)} numbers (one per value) "
                             "with a positive sum")
        return self


def _kind(value: Any) -> str | None:
    """A length's model: a whole number is fixed; a mapping says its `kind`."""
    if isinstance(value, dict):
        return value.get("kind")
    return "fixed"


_LENGTH_KINDS = "a whole number of tokens or a mapping with kind uniform, lognormal or choice"
Length = Annotated[
    Union[Annotated[Tokens, Tag("fixed")], Annotated[Uniform, Tag("uniform")],
          Annotated[Lognormal, Tag("lognormal")], Annotated[Choice, Tag("choice")]],
    Discriminator(_kind, custom_error_type="length_kind",
                  custom_error_message=f"expected {_LENGTH_KINDS}")]


class Poisson(Strict):
    """Exponential gaps at `rate_per_s`."""

    kind: Literal["poisson"]
    rate_per_s: Rate


class Gamma(Strict):
    """Gamma gaps at `rate_per_s` with coefficient of variation `cv` (bursty above 1)."""

    kind: Literal["gamma"]
    rate_per_s: Rate
    cv: Annotated[float, Field(ge=MIN_CV, le=MAX_CV)]


class Constant(Strict):
    """Gaps of exactly 1 / `rate_per_s`, the first request at 0."""

    kind: Literal["constant"]
    rate_per_s: Rate


Arrival = Annotated[
    Union[Annotated[Poisson, Tag("poisson")], Annotated[Gamma, Tag("gamma")],
          Annotated[Constant, Tag("constant")]],
    Discriminator(lambda v: v.get("kind") if isinstance(v, dict) else None,
                  custom_error_type="arrival_kind",
                  custom_error_message="expected a mapping with kind poisson, gamma or constant "
                                       "and rate_per_s")]


class Prefix(Strict):
    """Random shared prefixes: each request joins one of `groups`, sharing `tokens` tokens."""

    groups: Annotated[int, Field(ge=1, le=INT32_MAX)]
    tokens: Tokens


class Synthetic(Strict):
    """A synthetic workload: an arrival process, a request count or duration, two lengths."""

    arrival: Arrival
    num_requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    duration_s: Annotated[float, Field(gt=0)] | None = None
    prompt_tokens: Length
    output_tokens: Length
    prefix: Prefix | None = None
    prompt_text: Literal[PROMPT_TEXTS] = "random"  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _one_size(self):
        if (self.num_requests is None) == (self.duration_s is None):
            raise ValueError("needs exactly one of num_requests and duration_s")
        return self


class TraceFile(Strict):
    """`workload.trace`: a trace file to replay (its rows read by its format's reader)."""

    format: Literal[TRACE_FORMATS]  # type: ignore[valid-type]
    path: Annotated[str, Field(min_length=1)]
    time_scale: Annotated[float, Field(gt=0)] = 1.0
    """inter-arrival times stretched by this"""
    limit: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    """the earliest this many requests"""
    drop_failed: bool | None = None
    """burstgpt only: drop failed requests (default true)"""

    @model_validator(mode="after")
    def _format_keys(self):
        if self.drop_failed is not None and self.format != "burstgpt":
            raise ValueError(f"drop_failed is a burstgpt key, not {self.format}'s")
        return self


class Replayed(Strict):
    """A trace replay, with optional random prefixes."""

    trace: TraceFile
    prefix: Prefix | None = None
    prompt_text: Literal[PROMPT_TEXTS] = "random"  # type: ignore[valid-type]


def workload_spec(d: Any) -> Synthetic | Replayed:
    """A `workload:` mapping (not a program workload) as its model; one line naming the key."""
    if not isinstance(d, dict):
        raise ValueError(f"workload: expected a mapping, got {d!r}")
    model = Replayed if "trace" in d else Synthetic
    try:
        return model.model_validate(d)
    except ValidationError as e:
        raise ValueError(one_line(e, prefix="workload", data=d)) from None

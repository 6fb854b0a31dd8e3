"""Step-time models: what a replica asks for the duration of its iterations.

A replica asks a `StepTimeModel` how long one iteration of a batch takes and, where the model
has one, the closed form of a run of decode-only iterations (so it can fast-forward over the
run in one event). Calibration artifacts name their model's kind and version; `STEP_TIME_MODELS`
maps kinds to classes, so a new kind (per-layer for early exits, draft/verify for speculation)
plugs in by registering, without touching the replica.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from pydantic import ValidationError

from inputs.strict import one_line


class StepTimeModel(Protocol):
    """Iteration durations of one replica's engine on one device."""

    kind: ClassVar[str]
    version: ClassVar[int]
    schema: ClassVar[type]
    """its parameters' strict model (`sim.step_time.schema.ModelJson`)"""
    residual_log_quantiles: tuple[float, ...]
    """quantiles of log(actual / predicted) (multiplicative noise; (0.0,) for none)"""
    not_compiled: ClassVar[str]
    """optional (default ""): why the compiled kernels cannot price this model in closed form
    (the terms it charges that they do not carry); "": they price it as written"""
    engine_state: ClassVar[bool]
    """optional (default False): step_ms also takes new_shape (the engine's first step with this
    many scheduled tokens), idle_ms (since its last step ended), which the replica tracks, and
    prefill_seqs (sequences with prompt tokens in the step)"""

    def step_ms(self, prefill_tokens: float, decode_seqs: float, context_tokens: float) -> float:
        """Predicted duration of one iteration."""
        ...

    def decode_run(self, n_seqs: int, context0: int) -> tuple[float, float] | None:
        """(a_ms, b_ms) with iteration k of a decode-only run lasting a_ms + b_ms * k, or None
        when the model has no such closed form (the replica then steps one event per
        iteration)."""
        ...

    def residual_sampler(self) -> tuple[float, float]:
        """(mean, std) of the multiplicative residual."""
        ...

    def to_json(self) -> dict:
        """The model's parameters, JSON-ready (kind and version are added by the caller)."""
        ...


class FittableModel(StepTimeModel, Protocol):
    """A kind `calibrate` fits from traced steps (found through `fitter`, as `from_json` finds
    the kind it loads)."""

    @staticmethod
    def usable_steps(steps, trace_dirs: list):
        """The traced steps (a steps table) this kind fits, with any columns it derives."""
        ...

    @classmethod
    def fit_steps(cls, steps, without: tuple[str, ...] = ()) -> "FittableModel":
        """The model fitted on usable steps; `without`: terms fitted at 0 (an ablation)."""
        ...

    def predict_steps(self, steps):
        """Predicted durations (ms) of usable steps."""
        ...

    def step_errors(self, steps) -> dict:
        """Relative errors on usable steps: mape, p50_ape, p90_ape, rows."""
        ...


STEP_TIME_MODELS: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make a step-time model loadable by its `kind`; its `schema` (a
    `sim.step_time.schema.ModelJson`) checks a calibration's parameters before `from_json`."""
    if not isinstance(getattr(cls, "schema", None), type):
        raise TypeError(f"step-time model {cls.kind!r} registers no schema of its parameters")
    STEP_TIME_MODELS[cls.kind] = cls
    return cls


def fitter(kind: str) -> type:
    """The registered class that fits step-time model `kind`; a clear error for a kind that is
    unknown or fitted elsewhere (the layered model, from a helios: config's exits traces)."""
    cls = STEP_TIME_MODELS.get(kind)
    fittable = sorted(k for k, c in STEP_TIME_MODELS.items() if hasattr(c, "fit_steps"))
    if cls is None or not hasattr(cls, "fit_steps"):
        raise ValueError(f"step-time model {kind!r}: calibrate fits {fittable}")
    return cls


def to_json(model: StepTimeModel) -> dict:
    """A model as it is stored in a calibration artifact: kind, version, parameters."""
    return {"kind": model.kind, "version": model.version, **model.to_json()}


def from_json(d: dict, where: str = "step_time_model") -> StepTimeModel:
    """The model a calibration artifact names; a clear error for an unknown kind or version."""
    kind, version = d.get("kind"), d.get("version")
    if not isinstance(kind, str) or kind not in STEP_TIME_MODELS:
        raise ValueError(f"{where}: unknown step-time model kind {kind!r}; known: "
                         f"{sorted(STEP_TIME_MODELS)}")
    cls = STEP_TIME_MODELS[kind]
    if version != cls.version:
        raise ValueError(f"{where}: {kind} model version {version} is not the supported "
                         f"{cls.version}; re-run reasonsim calibrate")
    params = {k: v for k, v in d.items() if k not in ("kind", "version")}
    try:  # the kind's schema first: types, bounds, unknown keys (a typo would leave a default)
        checked = cls.schema.model_validate(params).model_dump(exclude_unset=True)
    except ValidationError as e:
        raise ValueError(one_line(e, prefix=where, data=params)) from None
    try:
        return cls.from_json(checked)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None

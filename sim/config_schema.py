"""The simulate config's cluster, SLO and output sections as strict models (pydantic v2).

Strict: unknown keys, wrong types (`count: "2"`, `count: true`, `seed: 1.7`), NaN/inf, zero or
negative limits and non-boolean flags (`enable_prefix_caching: "no"`) are errors, rendered as one
line naming the key: `cluster.replicas[0].count: Input should be greater than or equal to 1`.
Workload sections keep their own checks (`sim.workloads.requests`, `programs.workload`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from inputs.limits import INT32_MAX, MAX_REPLICAS, SEED_MAX
from inputs.strict import Strict, one_line

Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
Positive = Annotated[float, Field(gt=0)]


class SpeculativeSpec(Strict):
    """A replica group's `speculative:` (see `sim.engine.spec_decode`)."""

    acceptance_rates: Annotated[list[Annotated[float, Field(ge=0, le=1)]],
                                Field(min_length=1)] | None = None
    acceptance_trace: str | None = None
    temperature: Annotated[float, Field(ge=0)] = 0.0
    """which of the acceptance trace's sampling temperatures to draw from"""

    @model_validator(mode="after")
    def _temperature_picks_a_trace(self) -> "SpeculativeSpec":
        if "temperature" in self.model_fields_set and self.acceptance_trace is None:
            raise ValueError("temperature picks the acceptance_trace's rows; acceptance_rates "
                             "are the acceptance itself (give the trace, or drop temperature)")
        return self


class GroupSpec(Strict):
    """One replica group (see `sim.config.ReplicaGroup` for each field's meaning)."""

    calibration: str
    count: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    max_num_seqs: Count | None = None
    max_num_batched_tokens: Count | None = None
    kv_blocks: Annotated[int, Field(ge=2, le=INT32_MAX)] | None = None
    """the engine's `num_gpu_blocks`: one of them is vLLM's null block"""
    block_size: Count | None = None
    memory_gb: Positive | None = None
    model_config_path: str | None = Field(None, alias="model_config")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    enable_prefix_caching: bool = False
    pool: Annotated[str, Field(min_length=1)] = "target"
    device: Annotated[str, Field(min_length=1)] | None = None
    speculative: SpeculativeSpec | None = None
    scheduler: Literal["reasonsim", "vllm"] = "reasonsim"
    """whose code composes each step: the simulator's own, or the installed vLLM's `Scheduler`"""

    @model_validator(mode="after")
    def _one_kv_size(self) -> "GroupSpec":
        # a device memory (with the model's config) sizes the KV cache; kv_blocks gives it
        if self.memory_gb is None and ("gpu_memory_utilization" in self.model_fields_set
                                       or self.model_config_path is not None):
            raise ValueError("gpu_memory_utilization and model_config size the KV cache from "
                             "memory_gb; give memory_gb or drop them")
        if self.memory_gb is not None and self.kv_blocks is not None:
            raise ValueError("kv_blocks and memory_gb both size the KV cache; give one")
        return self

    @field_validator("calibration", "model_config_path", mode="before")
    @classmethod
    def _path_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, Path) else v


class ClusterSpec(Strict):
    """The `cluster:` section."""

    replicas: Annotated[list[GroupSpec], Field(min_length=1)]
    router: str = "least_outstanding"
    scheduler: str | dict = "fcfs"
    kv_eviction: Literal["free_order", "idle_programs_first"] = "free_order"


class SloSpec(Strict):
    """The `slo:` section."""

    ttft_s: Positive | None = None
    tpot_s: Positive | None = None


class OutputSpec(Strict):
    """The `output:` section."""

    steps: bool = True
    requests: bool = True


class ConfigSpec(Strict):
    """A whole simulate config; `workload` is checked by its own layer."""

    workload: dict
    cluster: ClusterSpec
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] = 0
    latency: Literal["mean", "sampled"] = "mean"
    noise_seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    slo: SloSpec | None = None
    output: OutputSpec | None = None

    @model_validator(mode="after")
    def _noise_seed_of_sampled(self) -> "ConfigSpec":
        if self.noise_seed is not None and self.latency != "sampled":
            raise ValueError(f"noise_seed {self.noise_seed}: it draws the step-time noise, "
                             "which only latency: sampled has (latency: mean draws none)")
        return self


class EngineLimitsSpec(Strict):
    """A calibration's `engine_limits`: the traced engine's."""

    max_num_seqs: Count
    max_num_batched_tokens: Count
    block_size: Count
    kv_blocks_total: Count
    max_model_len: Count | None = None


HostMs = Annotated[float, Field(ge=0, le=1e3)]
"""a host time in ms: a second per added request, step or token is no engine loop's"""


class HostSpec(Strict):
    """A calibration's `host`: what the engine's loop spends outside its steps."""

    add_request_ms: HostMs = 0.0
    logprob_token_ms: HostMs = 0.0
    logprob_top_k_ms: HostMs = 0.0
    logprob_step_ms: HostMs = 0.0
    seeded_step_ms: HostMs = 0.0
    seeded_seq_ms: HostMs = 0.0
    wake_ms: HostMs = 0.0
    add_next_ms: HostMs | None = None
    step_gap_ms: HostMs = 0.0


class ProvenanceSpec(BaseModel):
    """A calibration's `provenance`: where its traces came from (what a simulation's output and
    `validate` name); further keys are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())
    device: Annotated[str, Field(min_length=1)]
    device_count: Annotated[int, Field(ge=1)]
    engine: Annotated[str, Field(min_length=1)]
    model_id: str
    model_config_hash: str
    dtype: str


class CalibrationSpec(Strict):
    """A calibration artifact's envelope (its step-time model is checked by its own kind; a
    misspelled top-level key is refused, as a misspelled `host` would drop the host terms)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True,
                              protected_namespaces=())
    kind: Literal["reasonsim.calibration"]
    version: Literal[1, 2]
    engine_limits: EngineLimitsSpec
    provenance: ProvenanceSpec
    heldout: dict
    host: HostSpec | None = None
    step_time_model: Any = None
    """version 2: the model, checked by its kind (`sim.step_time.registry`)"""
    features: Any = None
    """version 1 held the linear model's fields at the top level"""
    coef_ms: Any = None
    residual_log_quantiles: Any = None


def validate_calibration(d: Any) -> CalibrationSpec:
    """The artifact's envelope as a strict model; ValueError naming the key on any problem."""
    try:
        return CalibrationSpec.model_validate(d)
    except ValidationError as e:
        raise ValueError(one_line(e, root="calibration")) from None


def describe(model: type[BaseModel] = ConfigSpec) -> list[str]:
    """One line per config key (type, default, bounds), from the schema configs are checked by."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})

    def resolve(node: dict) -> dict:
        return defs[node["$ref"].split("/")[-1]] if "$ref" in node else node

    def walk(node: dict, prefix: str) -> list[str]:
        lines = []
        required = set(node.get("required", ()))
        for key, prop in node.get("properties", {}).items():
            options = [resolve(o) for o in prop.get("anyOf", [prop])]
            kinds, bounds, subs = [], [], []
            for o in options:
                if o.get("type") == "array":
                    item = resolve(o.get("items", {}))
                    kinds.append(f"list of {item.get('title', item.get('type', 'any'))}")
                    subs.append((item, f"{prefix}{key}[]."))
                    bounds += _list_bounds(o, item)
                elif "properties" in o:
                    kinds.append("mapping")
                    subs.append((o, f"{prefix}{key}."))
                elif "enum" in o or "const" in o:
                    kinds.append(" | ".join(map(repr, o.get("enum", [o.get("const")]))))
                else:
                    kinds.append(o.get("type", "any"))
                for k, sym in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                               ("exclusiveMaximum", "<")):
                    if k in o:
                        bounds.append(f"{sym} {o[k]}")
            default = "required" if key in required else f"default {prop.get('default')!r}"
            lines.append(f"{prefix}{key}: {' or '.join(dict.fromkeys(kinds))}; {default}"
                         + (f"; {', '.join(bounds)}" if bounds else ""))
            for sub, sub_prefix in subs:
                lines += walk(sub, sub_prefix)
        return lines

    return walk(schema, "")


def validate_config(d: Any) -> ConfigSpec:
    """The config as a strict model; ValueError with one line naming the key on any problem."""
    try:
        return ConfigSpec.model_validate(d)
    except ValidationError as e:
        raise ValueError(one_line(e)) from None


def _list_bounds(array: dict, item: dict) -> list[str]:
    """A list's length and its items' bounds, in words."""
    low, high = array.get("minItems"), array.get("maxItems")
    unit = "item" if (high or low) == 1 else "items"
    if low is None and high is None:
        out = []
    elif low == high:
        out = [f"{low} {unit}"]
    elif high is None:
        out = [f"at least {low} {unit}"]
    elif low is None:
        out = [f"at most {high} {unit}"]
    else:
        out = [f"{low} to {high} {unit}"]
    each = [f"{sym} {item[k]}" for k, sym in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                               ("maximum", "<="), ("exclusiveMaximum", "<"))
            if k in item]
    return out + ([f"each {' and '.join(each)}"] if each else [])

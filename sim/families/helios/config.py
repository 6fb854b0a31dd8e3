"""A HELIOS experiment config (`helios:` section) and its simulated run of every policy.

    seed: 0
    helios:
      models: [{exits: TRACE_DIR}, ...]     # candidate models, each from its exits trace
      memory_mb: 8                          # device memory for weights + KV
      max_num_seqs: 32                      # engine slots cap
      replicas: 2                           # optional: devices, each serving a routed share
      router: round_robin                   # optional: how prompts are routed (least_outstanding)
      repository:                           # optional Model Repository (benchmark telemetry)
        - {model: target-large, memory_mb: 3.4, accuracy: 0.84, throughput_tok_s: 5300}
      policies:                             # each served over the same prompt stream
        - {type: static, model: target-large}
        - {type: helios, strategy: throughput, threshold: 0.9, reassess_every: 60}
        - {type: helios, shortlist: 2, min_accuracy: 0.3}         # top 2 of the repository
        - {type: ee_full, model: target-large, threshold: 0.9}   # EE-LLM style baseline

Strict like the simulate config: unknown keys, wrong types and out-of-range values are one-line
errors naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationError

from policies.helios import (STRATEGIES, EarlyExitFull, Helios, RepositoryEntry, Serve, Static,
                             shortlist)
from programs.helios import HeliosProgram
from sim.config_schema import Count, Strict, one_line
from sim.families.helios.profile import Memory, ModelProfile, candidate, load_profile
from sim.families.helios.serving import HeliosResult, route_stream, simulate_cluster
from sim.families.registry import ConfigSection, register_section
from sim.families.helios.whatif import Device, Phase, what_if_profile

Share = Annotated[float, Field(gt=0, le=1)]


class ModelSpec(Strict):
    """One candidate model: from its exits trace, or a what-if from its config.json."""

    exits: str | None = None
    name: str | None = None
    config: str | None = None
    """what-if: the model's config.json (shape only)"""
    exit_layers: list[Annotated[int, Field(ge=1)]] | None = None
    """what-if: layers with an exit head, the last layer included"""
    exit_shares: list[list[Annotated[float, Field(ge=0, le=1)]]] | None = None
    """what-if: per stream phase, the share of tokens whose first confident exit is each exit"""


class DeviceSpec(Strict):
    """What-if accelerator figures (datasheet, not measured)."""

    memory_bw_gb_s: Annotated[float, Field(gt=0)]
    peak_tflops: Annotated[float, Field(gt=0)]
    load_gb_s: Annotated[float, Field(gt=0)]
    step_overhead_ms: Annotated[float, Field(ge=0)] = 0.0


class PhaseSpec(Strict):
    """A stretch of the what-if prompt stream."""

    prompts: Count
    prompt_tokens: Count
    output_tokens: Count


class WhatIfSpec(Strict):
    """Inputs of what-if models: the device and the prompt stream."""

    device: DeviceSpec
    phases: Annotated[list[PhaseSpec], Field(min_length=1)]


class StaticSpec(Strict):
    """Baseline: one model at full depth."""

    type: Literal["static"]
    model: str
    label: str | None = None


class EarlyExitSpec(Strict):
    """Baseline: one early-exit model, every layer loaded, one sequence at a time, each token
    leaving at the first exit that reaches the threshold (EE-LLM style layer skipping)."""

    type: Literal["ee_full"]
    model: str
    threshold: Share = 0.9
    label: str | None = None


class RepositorySpec(Strict):
    """A Model Repository row: a model's benchmark telemetry, as given."""

    model: str
    memory_mb: Annotated[float, Field(gt=0)]
    accuracy: Annotated[float, Field(ge=0, le=1)] | None = None
    throughput_tok_s: Annotated[float, Field(gt=0)] | None = None
    latency_ms: Annotated[float, Field(gt=0)] | None = None
    energy_per_token: Annotated[float, Field(gt=0)] | None = None


class HeliosSpec(Strict):
    """HELIOS over every candidate model, or over a shortlist of the repository."""

    type: Literal["helios"]
    label: str | None = None
    shortlist: Count | None = None
    """HELIOS Step-1: the top this many repository models for the strategy (None: all models)"""
    min_accuracy: Annotated[float, Field(ge=0, le=1)] = 0.0
    """shortlist only models whose repository accuracy reaches this"""
    strategy: Literal[STRATEGIES] = "throughput"  # type: ignore[valid-type]
    threshold: Share = 0.9
    eval_prompts: Count = 5
    cbc_max: Annotated[int, Field(ge=0)] = 50
    window: Count = 100
    reassess_every: Count | Literal["auto"] = 150
    """prompts between re-assessments, or `auto`: set at each selection so the evaluation costs
    at most `overhead_share` of the serving time (`policies.helios.Helios.auto_interval`)"""
    coverage: Share = 0.5
    horizon_tokens: Count = 1000
    overhead_share: Share = 0.05


class HeliosSection(Strict):
    """The `helios:` section."""

    models: Annotated[list[ModelSpec], Field(min_length=1)]
    what_if: WhatIfSpec | None = None
    memory_mb: Annotated[float, Field(gt=0)]
    max_num_seqs: Count = 256
    replicas: Count = 1
    """devices, each with memory_mb, its own loaded model and its own policy"""
    router: Annotated[str, Field(min_length=1)] = "least_outstanding"
    """how the stream's prompts are assigned to replicas (`policies.routing`)"""
    overlap_loading: bool = False
    """a standby server per replica loads the next round's model while the current round serves,
    where the decision is known early (HELIOS's loading "concurrently on another server");
    simulated only"""
    repository: list[RepositorySpec] | None = None
    policies: Annotated[list[Annotated[Union[StaticSpec, EarlyExitSpec, HeliosSpec],
                                       Field(discriminator="type")]], Field(min_length=1)]


class HeliosConfig(Strict):
    """A whole HELIOS experiment config."""

    seed: Annotated[int, Field(ge=0)] = 0
    helios: HeliosSection


class Experiment:
    """A validated config with its profiles loaded: policies to run over one prompt stream."""

    def __init__(self, d: Any, base_dir: str | Path = "."):
        try:
            self.spec = HeliosConfig.model_validate(d)
        except ValidationError as e:
            raise ValueError(one_line(e)) from None
        h = self.spec.helios
        base = Path(base_dir)
        from policies.routing import make_router

        try:
            make_router(h.router)
        except ValueError as e:
            raise ValueError(f"helios.router: {e}") from None
        self.profiles: dict[str, ModelProfile] = {}
        for k, m in enumerate(h.models):
            try:
                p = self._profile(m, base, self.spec.seed + k)
            except (FileNotFoundError, ValueError, KeyError) as e:
                key = "exits" if m.exits is not None else "config"
                raise ValueError(f"helios.models[{k}].{key}: {e}") from None
            if p.name in self.profiles:
                raise ValueError(f"helios.models[{k}]: a second model named {p.name!r}")
            self.profiles[p.name] = p
        streams = {tuple(p.prompt_tokens) for p in self.profiles.values()}
        if len(streams) > 1:
            raise ValueError("helios.models: the exits traces served different prompt streams "
                             "(trace them with the same workload)")
        self.num_prompts = len(next(iter(self.profiles.values())).prompt_tokens)
        longest = max(max(p.prompt_tokens) for p in self.profiles.values())
        self.max_tokens = max(int(p.workload.get("max_tokens", 0))
                              for p in self.profiles.values())
        """a prompt's output budget (what a router knows of its length)"""
        self.memory = Memory(h.memory_mb, longest + self.max_tokens, h.max_num_seqs)
        for name, p in self.profiles.items():
            if self.memory.batch(p, 1) < 1:
                raise ValueError(f"helios.memory_mb: {h.memory_mb} MB cannot hold one layer of "
                                 f"{name} and one sequence's KV")
        self.candidates = {n: candidate(p, self.memory) for n, p in self.profiles.items()}
        for k, pol in enumerate(h.policies):
            if isinstance(pol, (StaticSpec, EarlyExitSpec)) and pol.model not in self.profiles:
                raise ValueError(f"helios.policies[{k}].model: {pol.model!r} is not one of "
                                 f"{', '.join(self.profiles)}")
            if isinstance(pol, EarlyExitSpec):
                p = self.profiles[pol.model]
                if p.ee_step is None:
                    raise ValueError(f"helios.policies[{k}]: ee_full needs {pol.model}'s exits "
                                     "trace to have layer-skipping steps (reasonsim trace exits "
                                     "--ee-thresholds 0.9)")
                if self.memory.batch(p, p.layers) < 1:
                    raise ValueError(f"helios.policies[{k}]: ee_full loads all of {pol.model}; "
                                     f"helios.memory_mb {h.memory_mb} MB cannot hold it")
        self.shortlists: dict[str, list[str]] = {}
        """policy name -> its shortlisted candidates (HELIOS policies with `shortlist`)"""
        for k, pol in enumerate(h.policies):
            if isinstance(pol, HeliosSpec) and pol.shortlist is not None:
                self.shortlists[self.policy_name(pol)] = self._shortlist(pol,
                                                                         f"helios.policies[{k}]")
        names = [self.policy_name(p) for p in h.policies]
        if len(set(names)) != len(names):
            raise ValueError("helios.policies: two policies with one name (give one a 'label')")

    def _shortlist(self, pol: "HeliosSpec", where: str) -> list[str]:
        h = self.spec.helios
        if h.repository is None:
            raise ValueError(f"{where}.shortlist: needs a helios.repository table")
        repo = [RepositoryEntry(**r.model_dump()) for r in h.repository]
        try:
            names = shortlist(repo, pol.strategy, pol.shortlist, h.memory_mb, pol.min_accuracy)
        except ValueError as e:
            raise ValueError(f"helios.{e}") from None
        if not names:
            raise ValueError(f"{where}.shortlist: no repository model fits memory_mb "
                             f"{h.memory_mb} with accuracy >= {pol.min_accuracy}")
        missing = [n for n in names if n not in self.profiles]
        if missing:
            raise ValueError(f"{where}.shortlist: {missing[0]!r} was shortlisted but has no "
                             "exits trace in helios.models")
        return names

    def _profile(self, m: ModelSpec, base: Path, seed: int) -> ModelProfile:
        whatif = (m.config, m.exit_layers, m.exit_shares)
        if (m.exits is None) == all(x is None for x in whatif):
            raise ValueError("give either exits (a trace) or config, exit_layers and "
                             "exit_shares (a what-if)")
        if m.exits is not None:
            return load_profile(_resolve(m.exits, base), m.name)
        w = self.spec.helios.what_if
        if w is None or any(x is None for x in whatif) or not m.name:
            raise ValueError("a what-if model needs name, config, exit_layers, exit_shares and "
                             "the helios.what_if section (device, phases)")
        return what_if_profile(m.name, _resolve(m.config, base), list(m.exit_layers),
                               [list(x) for x in m.exit_shares],
                               [Phase(**p.model_dump()) for p in w.phases],
                               Device(**w.device.model_dump()), seed)

    @staticmethod
    def policy_name(p: StaticSpec | EarlyExitSpec | HeliosSpec) -> str:
        """A policy's label in tables and figures."""
        if p.label:
            return p.label
        if isinstance(p, HeliosSpec):
            return f"helios:{p.strategy}"
        return f"{p.type}:{p.model}"

    def program(self, p: StaticSpec | EarlyExitSpec | HeliosSpec,
                prompts: list[int] | None = None) -> HeliosProgram:
        """A fresh program (and policy) for one policy spec, over the stream indices `prompts`
        (None: the whole stream)."""
        if isinstance(p, StaticSpec):
            policy = Static(self.candidates[p.model])
        elif isinstance(p, EarlyExitSpec):
            policy = EarlyExitFull(self.candidates[p.model], p.threshold)
        else:
            args = p.model_dump(exclude={"type", "label", "shortlist", "min_accuracy"})
            names = self.shortlists.get(self.policy_name(p), list(self.candidates))
            policy = Helios([self.candidates[n] for n in names], **args)
        return HeliosProgram(policy, self.num_prompts if prompts is None else prompts,
                             self.max_batch)

    def max_batch(self, s: Serve) -> int:
        """Sequences a decision serves at once: what memory allows; one with layer skipping."""
        if s.exit_threshold is not None:
            return 1
        return self.memory.batch(self.profiles[s.model], s.depth)

    def devices(self) -> list[str]:
        """The devices the models' profiles were measured on (what-if: stated)."""
        return sorted({p.device for p in self.profiles.values()})

    def simulate(self) -> dict[str, HeliosResult]:
        """Every policy simulated over the stream, on the configured replicas."""
        h = self.spec.helios
        # every policy's stream routed alike: the router sees tokens, not decisions
        shares = route_stream(self.profiles, self.num_prompts, h.replicas, h.router,
                              self.max_tokens) if h.replicas > 1 else None
        return {self.policy_name(p): simulate_cluster(
                    lambda prompts, p=p: self.program(p, prompts), self.profiles,
                    self.num_prompts, h.replicas, h.router, self.max_tokens, h.overlap_loading,
                    shares=shares)
                for p in h.policies}


def _resolve(path: str, base: Path) -> Path:
    return Path(path) if Path(path).is_absolute() else base / path


register_section(ConfigSection("helios", Experiment))

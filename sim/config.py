"""Simulation config: YAML -> validated dataclasses. Unknown keys and impossible values are errors."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class ReplicaGroup:
    """`count` identical replicas sharing one calibration (clusters may mix groups)."""

    calibration: Path
    """calibration artifact (JSON from `reasonsim calibrate`)"""
    count: int = 1
    """replicas in the group"""
    max_num_seqs: int | None = None
    """override the traced engine's max sequences per iteration"""
    max_num_batched_tokens: int | None = None
    """override the traced engine's token budget per iteration"""
    kv_blocks: int | None = None
    """override the traced engine's KV blocks"""
    block_size: int | None = None
    """override the traced engine's KV block size in tokens (the engine being simulated pages
    its KV, and caches prefixes, in blocks of this size); KV blocks are rescaled to the same
    tokens unless kv_blocks is given"""
    memory_gb: float | None = None
    """derive KV blocks from device memory instead (needs model_config)"""
    model_config: Path | None = None
    """config.json of the served model (for memory_gb)"""
    gpu_memory_utilization: float = 0.9
    """share of memory_gb usable by weights + KV (vLLM's default)"""
    enable_prefix_caching: bool = False
    """reuse KV of shared prompt prefixes"""
    pool: str = "target"
    """the model pool the group serves: requests go to the pool named by their role"""
    device: str | None = None
    """groups naming the same device share it, replica by replica (the j-th replica of each):
    their iterations run one at a time, in turn, as two engines driven from one process on one
    machine do; None: a device of its own"""
    speculative: dict | None = None
    """in-engine speculative decoding (`sim.engine.spec_decode`): acceptance_rates (per position) or
    acceptance_trace (+ temperature); the calibration must be fitted on spec-decoding steps
    (`calibrate --spec-k K`)"""
    scheduler: str = "reasonsim"
    """whose code composes each step: `reasonsim` (the simulator's replica, fast-forwarded and
    compiled where it can be) or `vllm` (the installed vLLM's own `Scheduler`, run step by step:
    exact, slower; `sim.engine.replica_kinds`)"""


@dataclass(frozen=True)
class SimConfig:
    """A whole simulation: workload, cluster, latency mode, SLOs, outputs."""

    workload: dict
    """workload mapping (see sim/workloads/requests.py)"""
    replicas: list[ReplicaGroup]
    """replica groups"""
    router: str = "least_outstanding"
    """round_robin, least_outstanding, or module:Class of a policies-style router"""
    scheduler: str | dict = "fcfs"
    """inter-program scheduler (program workloads): fcfs, lpm, app_fifo, dynasor, dynasor_sjf or a
    mapping {type: dynasor, escalate_after_s: 10, default_remaining_tokens: 128, estimate:
    finished | program} (`policies/scheduling.py`)"""
    kv_eviction: str = "free_order"
    """which cached KV blocks a replica evicts first under memory pressure: `free_order` (vLLM's:
    least recently freed first) or `idle_programs_first` (Dynasor's: the blocks of programs with
    no request in flight first; `sim.engine.prefix_cache.PrefixCache.demote`)"""
    seed: int = 0
    """run seed (workload and latency noise)"""
    latency: str = "mean"
    """mean (deterministic: prediction x mean residual ratio) or sampled (residuals drawn from
    the calibration)"""
    slo_ttft_s: float | None = None
    """TTFT SLO for attainment/goodput"""
    slo_tpot_s: float | None = None
    """TPOT SLO for attainment/goodput"""
    write_steps: bool = True
    """write the per-iteration steps table (expanded from runs of iterations)"""
    write_requests: bool = True
    """keep a program workload's requests table; False: fold each finished request into the
    summary as the run goes (`sim.engine.folded_requests`), for runs too large to keep one"""
    noise_seed: int | None = None
    """seed of the sampled latency noise alone (None: from `seed`); the workload stays the
    same across noise seeds, so their spread is the step-time uncertainty band"""
    base_dir: Path = field(default=Path("."))
    programs: object = None
    """the program workload (`programs.workload.ProgramWorkload`) parsed once from
    `workload.programs`; None for a request workload"""
    """directory relative paths are resolved against"""

    def to_json(self) -> str:
        """JSON of the config (for the runs table)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("base_dir", "programs")}  # the workload mapping holds it
        d["replicas"] = [{k: (str(v) if isinstance(v, Path) else v)
                          for k, v in r.__dict__.items()} for r in self.replicas]
        return json.dumps(d, sort_keys=True, default=str)


DYNASOR_FAMILIES = ("reasoning", "search")
"""the program families whose live replay (`live.replay`) passes Dynasor's eviction hint"""


def _check_eviction(spec, programs) -> None:
    """`idle_programs_first` needs Dynasor's programs to be idle and cached blocks to evict."""
    if spec.cluster.kv_eviction == "free_order":
        return
    if programs is None:
        raise ValueError("cluster.kv_eviction: idle_programs_first needs a program workload "
                         "(workload.programs): plain requests belong to no program")
    from programs.families import family_of

    family = family_of(programs.method, programs.policy).name
    if family not in DYNASOR_FAMILIES:
        raise ValueError(f"cluster.kv_eviction: idle_programs_first is Dynasor's (programs of "
                         f"the {' and '.join(DYNASOR_FAMILIES)} families); method "
                         f"{programs.method!r} is the {family} family's")
    if not any(g.enable_prefix_caching for g in spec.cluster.replicas):
        raise ValueError("cluster.kv_eviction: idle_programs_first orders cached blocks; no "
                         "replica group sets enable_prefix_caching")
    if any(g.scheduler != "reasonsim" for g in spec.cluster.replicas):
        raise ValueError("cluster.kv_eviction: idle_programs_first runs on the simulator's own "
                         "replicas only (a group sets scheduler: vllm)")


def serving_pool(pools, role: str) -> str:
    """The pool serving requests of a model role: the only pool serves the target role whatever
    its name but another role's; another role needs a pool of its own name (priced on the
    target's calibration it would time a draft as the target)."""
    if len(pools) == 1:
        single = next(iter(pools))
        if role == single or role == "target" and single != "draft":
            return single
    if role not in pools:
        raise ValueError(f"no replica pool serves role {role!r}; pools: {sorted(pools)}")
    return role


def _check_roles(groups: list, programs) -> None:
    """Every model role the programs' family sends requests to has a pool serving it."""
    from programs.families import family_of

    family = family_of(programs.method, programs.policy)
    pools = {g.pool for g in groups}
    for role in family.roles(programs.policy):
        try:
            serving_pool(pools, role)
        except ValueError as e:
            raise ValueError(f"cluster.replicas: the {family.name} family's programs send "
                             f"{role} requests: {e} (name a group's pool {role})") from None


def parse_config(d: dict, base_dir: str | Path = ".") -> SimConfig:
    """Validate a config mapping (strict: `sim.config_schema`) and resolve its paths."""
    from sim.config_schema import MAX_REPLICAS, validate_config

    base = Path(base_dir)
    spec = validate_config(d)
    total = sum(g.count for g in spec.cluster.replicas)
    if total > MAX_REPLICAS:
        raise ValueError(f"cluster.replicas: {total} replicas in all, over the cap of "
                         f"{MAX_REPLICAS:,}")
    groups = []
    for g in spec.cluster.replicas:
        grp = g.model_dump(by_alias=True)
        for key in ("calibration", "model_config"):
            if grp.get(key) is not None:
                grp[key] = (base / grp[key]).resolve()
        if grp["speculative"] is not None:
            grp["speculative"] = {k: v for k, v in grp["speculative"].items() if v is not None}
        if grp["memory_gb"] is not None and grp["model_config"] is None:
            i = spec.cluster.replicas.index(g)
            raise ValueError(f"cluster.replicas[{i}]: memory_gb needs model_config")
        groups.append(ReplicaGroup(**grp))
    from policies.routing import make_router

    make_router(spec.cluster.router)  # an unknown or unloadable router fails here, named
    scheduler = spec.cluster.scheduler
    if scheduler != "fcfs" and "programs" not in spec.workload:
        raise ValueError("cluster.scheduler: only program workloads (workload.programs) have "
                         "inter-program schedulers")
    programs = None
    if "programs" in spec.workload:
        from policies.scheduling import make_scheduler
        from programs.workload import program_workload

        if set(spec.workload) != {"programs"}:
            raise ValueError("workload: a program workload has only the 'programs' key")
        programs = program_workload(spec.workload["programs"], base)
        _check_roles(groups, programs)
        make_scheduler(scheduler)
        if spec.slo is not None:  # the programs' deadlines would replace it unread
            raise ValueError("slo: a program workload's attainment is its programs' deadlines "
                             "(workload.programs.deadline); slo is a request workload's")
    _check_eviction(spec, programs)
    if spec.output is not None and not spec.output.requests and programs is None:
        raise ValueError("output.requests: false folds a program workload's requests into its "
                         "summary; a request workload's requests table is its result")
    slo = spec.slo
    return SimConfig(workload=d["workload"], replicas=groups, router=spec.cluster.router,
                     scheduler=scheduler, kv_eviction=spec.cluster.kv_eviction,
                     seed=spec.seed, latency=spec.latency,
                     noise_seed=spec.noise_seed,
                     slo_ttft_s=slo.ttft_s if slo else None,
                     slo_tpot_s=slo.tpot_s if slo else None,
                     write_steps=spec.output.steps if spec.output else True,
                     write_requests=spec.output.requests if spec.output else True,
                     base_dir=base, programs=programs)


_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""a number with an exponent, whatever its dot: YAML 1.1 (PyYAML) reads `1e12` as text"""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a mapping with the same key twice (the last would win)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2,
                                       list("-+0123456789."))


def yaml_value(text: str) -> Any:
    """A value given as YAML text (a flag's `KEY=VALUE`), read as config files are."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content; one-line errors naming the file (duplicate keys refused)."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except OSError as e:
        raise ValueError(f"{path}: cannot read config ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        raise ValueError(f"{path}: not valid YAML ({e.problem}"
                         + (f" at line {mark.line + 1}" if mark else "") + ")") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def load_config(path: str | Path) -> SimConfig:
    """Read a YAML config file."""
    path = Path(path)
    d = read_yaml(path)
    try:
        return parse_config(d, path.parent)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def kv_blocks_from_memory(model_config: Path, memory_gb: float, block_size: int,
                          utilization: float = 0.9, dtype_bytes: int = 2) -> int:
    """KV blocks that fit beside the weights: (memory x utilization - weights) / bytes per block."""
    from sim.model_shape import read_model_config

    cfg = read_model_config(model_config)
    layers = cfg["num_hidden_layers"]
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", hidden // heads)
    inter = cfg.get("intermediate_size", cfg.get("ffn_dim", 4 * hidden))
    vocab = cfg["vocab_size"]
    mlp_mats = 3 if cfg.get("hidden_act", "relu") in ("silu", "swiglu") else 2
    params = layers * (hidden * (heads + 2 * kv_heads) * head_dim + hidden * heads * head_dim
                       + mlp_mats * hidden * inter) + vocab * hidden * (
        1 if cfg.get("tie_word_embeddings") else 2)
    per_block = 2 * layers * kv_heads * head_dim * dtype_bytes * block_size
    free = memory_gb * 2**30 * utilization - params * dtype_bytes
    if free <= per_block:
        raise ValueError(f"{model_config}: {memory_gb} GB leaves no room for KV cache beside "
                         f"{params * dtype_bytes / 2**30:.1f} GB of weights")
    return int(free // per_block)

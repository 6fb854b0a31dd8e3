"""Simulation config: YAML -> validated dataclasses. Unknown keys and impossible values are errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


def _check_keys(where: str, d: Any, allowed: set[str]) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {sorted(allowed)}")
    return d


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
    memory_gb: float | None = None
    """derive KV blocks from device memory instead (needs model_config)"""
    model_config: Path | None = None
    """config.json of the served model (for memory_gb)"""
    gpu_memory_utilization: float = 0.9
    """share of memory_gb usable by weights + KV (vLLM's default)"""
    enable_prefix_caching: bool = False
    """reuse KV of shared prompt prefixes"""


@dataclass(frozen=True)
class SimConfig:
    """A whole simulation: workload, cluster, latency mode, SLOs, outputs."""

    workload: dict
    """workload mapping (see sim/workload.py)"""
    replicas: list[ReplicaGroup]
    """replica groups"""
    router: str = "least_outstanding"
    """round_robin, least_outstanding, or module:Class of a policies-style router"""
    scheduler: str | dict = "fcfs"
    """inter-program scheduler (program workloads): fcfs, lpm, app_fifo, dynasor or a mapping"""
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
    base_dir: Path = field(default=Path("."))
    """directory relative paths are resolved against"""

    def to_json(self) -> str:
        """JSON of the config (for the runs table)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "base_dir"}
        d["replicas"] = [{k: (str(v) if isinstance(v, Path) else v)
                          for k, v in r.__dict__.items()} for r in self.replicas]
        return json.dumps(d, sort_keys=True, default=str)


_TOP = {"workload", "cluster", "seed", "latency", "slo", "output"}
_CLUSTER = {"replicas", "router", "scheduler"}
_GROUP = {f.name for f in fields(ReplicaGroup)}
_SLO = {"ttft_s", "tpot_s"}
_OUTPUT = {"steps"}


def parse_config(d: dict, base_dir: str | Path = ".") -> SimConfig:
    """Validate a config mapping and resolve its paths."""
    base = Path(base_dir)
    _check_keys("config", d, _TOP)
    if "workload" not in d or "cluster" not in d:
        raise ValueError("config: needs 'workload' and 'cluster'")
    cl = _check_keys("cluster", d["cluster"], _CLUSTER)
    groups = []
    for i, g in enumerate(cl.get("replicas") or []):
        g = dict(_check_keys(f"cluster.replicas[{i}]", g, _GROUP))
        if "calibration" not in g:
            raise ValueError(f"cluster.replicas[{i}]: needs 'calibration'")
        for key in ("calibration", "model_config"):
            if g.get(key) is not None:
                g[key] = (base / g[key]).resolve()
        grp = ReplicaGroup(**g)
        if grp.count < 1:
            raise ValueError(f"cluster.replicas[{i}].count must be >= 1, got {grp.count}")
        if grp.memory_gb is not None and grp.model_config is None:
            raise ValueError(f"cluster.replicas[{i}]: memory_gb needs model_config")
        groups.append(grp)
    if not groups:
        raise ValueError("cluster.replicas: at least one replica group is required")
    slo = _check_keys("slo", d.get("slo") or {}, _SLO)
    out = _check_keys("output", d.get("output") or {}, _OUTPUT)
    scheduler = cl.get("scheduler", "fcfs")
    if scheduler != "fcfs" and "programs" not in (d["workload"] or {}):
        raise ValueError("cluster.scheduler: only program workloads (workload.programs) have "
                         "inter-program schedulers")
    if isinstance(d["workload"], dict) and "programs" in d["workload"]:
        from policies.scheduling import make_scheduler
        from sim.programs import program_workload

        if set(d["workload"]) != {"programs"}:
            raise ValueError("workload: a program workload has only the 'programs' key")
        program_workload(d["workload"]["programs"], base)
        make_scheduler(scheduler)
    latency = d.get("latency", "mean")
    if latency not in ("mean", "sampled"):
        raise ValueError(f"latency: must be 'mean' or 'sampled', got {latency!r}")
    return SimConfig(workload=d["workload"], replicas=groups,
                     router=cl.get("router", "least_outstanding"), scheduler=scheduler,
                     seed=int(d.get("seed", 0)),
                     latency=latency, slo_ttft_s=slo.get("ttft_s"), slo_tpot_s=slo.get("tpot_s"),
                     write_steps=bool(out.get("steps", True)), base_dir=base)


def load_config(path: str | Path) -> SimConfig:
    """Read a YAML config file."""
    path = Path(path)
    try:
        d = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read config ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    try:
        return parse_config(d, path.parent)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def kv_blocks_from_memory(model_config: Path, memory_gb: float, block_size: int,
                          utilization: float = 0.9, dtype_bytes: int = 2) -> int:
    """KV blocks that fit beside the weights: (memory x utilization - weights) / bytes per block."""
    cfg = json.loads(Path(model_config).read_text())
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

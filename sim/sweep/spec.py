"""A sweep: a base config plus typed overrides, expanded into content-hashed points.

A sweep file (YAML) names a base simulation config and the overrides to apply to it:

    base: ../examples/dynasor-cot-certaindex.yaml   # relative to the sweep file
    seeds: 3                                        # or a list: [0, 1, 2]; none: the config's
    # noise_seeds: 20   instead of seeds: the workload stays (the config's seed) and only the
    #                   step-time noise is drawn anew (latency: sampled): the calibration band
    grid:                                           # every combination
      workload.programs.rate_per_s: [2, 4, 6]
      cluster.scheduler: [fcfs, dynasor]
    cases:                                          # optional: each case x the grid
      - {name: even, workload.programs.policy: {type: even, budget: 96}}

An override key is a dotted path into the config (`cluster.replicas.0.count` indexes a list);
every step but the last must exist, so a typo fails before anything runs, and the strict config
parser then rejects a last key the config does not know. A point is one config and one seed; its
hash covers the resolved config and the bytes of every file it reads (calibrations, traces), so
results are reused exactly when they would be recomputed identically.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inputs.repeats import repeated, value_key
from sim.config import parse_config, read_yaml

FILE_KEYS = ("calibration", "trace", "path", "model_config", "exits", "config")
"""config keys that name inputs (`exits`, `config`: a HELIOS model's trace or config.json)"""


@dataclass(frozen=True)
class Point:
    """One simulation of a sweep: its overrides (in axis order), seed, position, and the hash of
    its config without the seed (shared by the point's seeds)."""

    index: int
    overrides: tuple[tuple[str, Any], ...]
    seed: int
    point_id: str

    def label(self) -> str:
        """Overrides and seed as one short line (progress, errors)."""
        return " ".join(f"{k}={v}" for k, v in self.overrides) + f" seed={self.seed}"


@dataclass
class Sweep:
    """A base config (mapping + the directory its paths are relative to) and its axes."""

    base: dict
    base_dir: Path
    grid: dict[str, list]
    cases: list[dict]
    seeds: list[int]
    seed_key: str = "seed"
    """what a seed sets: `seed` (workload, routing and noise) or `noise_seed` (the step-time
    noise alone, over the config's workload)"""
    own_seed: bool = False
    """`seeds` is the config's own seed (none given): a --set of it replaces it (`set_seed`)"""

    def __post_init__(self) -> None:
        if self.seed_key not in ("seed", "noise_seed"):
            raise ValueError(f"sweep: seed_key must be seed or noise_seed, not {self.seed_key!r}")
        if not self.seeds:
            raise ValueError("sweep: seeds is empty")
        if repeated(self.seeds):
            raise ValueError(f"sweep: seeds repeat ({self.seeds})")
        if self.seed_key in self.grid or any(self.seed_key in c for c in self.cases
                                             if isinstance(c, dict)):
            # each point's seed is replaced by the sweep's seeds: the value would be lost
            raise ValueError(f"sweep: the grid or a case sets {self.seed_key}, which the "
                             "sweep's seeds set at every point; give them as seeds (--seeds "
                             f"N, or seeds: [..] in a sweep file)")
        for key, values in self.grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"sweep: grid.{key} must be a non-empty list")
            apply_overrides(self.base, [(key, values[0])])  # the path exists
        seen: dict[str, str] = {}  # a case's overrides -> its name
        for i, case in enumerate(self.cases):
            if not isinstance(case, dict):
                raise ValueError(f"sweep: a case must be a mapping, got {case!r}")
            same = _case_key(case)
            if same in seen:  # one point: the table would keep one of the two names
                raise ValueError(f"sweep: cases {seen[same]} and {case.get('name', i)} set the "
                                 "same values; give each case something of its own")
            seen[same] = str(case.get("name", i))
            both = sorted(set(case) & set(self.grid))
            if both:  # the grid, applied after the case, would replace its value
                raise ValueError(f"sweep: a case sets {both[0]}, which the grid also sweeps")
            apply_overrides(self.base, [(k, v) for k, v in case.items() if k != "name"])

    def set_seed(self, value: Any) -> None:
        """A --set of the seed key: the sweep's one seed where it is the config's own; an error
        where seeds were given (they would replace it at every point)."""
        if not self.own_seed:
            raise ValueError(f"--set {self.seed_key}: the sweep's seeds ({self.seeds}) set it "
                             "at every point; give the seeds you want as seeds instead")
        self.seeds = [value]

    def configs(self) -> list[tuple[tuple[tuple[str, Any], ...], dict]]:
        """(overrides, config mapping) for every case x grid combination, in sweep order."""
        keys = list(self.grid)
        out = []
        for case in self.cases or [{}]:
            for combo in itertools.product(*(self.grid[k] for k in keys)):
                ov = tuple(case.items()) + tuple(zip(keys, combo))
                out.append((ov, apply_overrides(self.base, [(k, v) for k, v in ov
                                                            if k != "name"])))
        return out

    def points(self) -> list[tuple[Point, dict]]:
        """Every (point, config with its seed), configs outer, seeds inner."""
        digests: dict[str, str] = {}
        out = []
        for ov, cfg in self.configs():
            point_id = point_hash({k: v for k, v in cfg.items() if k != self.seed_key},
                                  self.base_dir, digests)
            for seed in self.seeds:
                out.append((Point(len(out), ov, seed, point_id), {**cfg, self.seed_key: seed}))
        return out

    def validate(self) -> None:
        """Parse every point's config (strict), so a bad override fails before any runs."""
        from sim.families.registry import section_of

        for point, d in self.points():
            section = section_of(d)
            try:
                if section is None:
                    parse_config(d, self.base_dir)
                else:
                    section.load(d, self.base_dir)
            except ValueError as e:
                raise ValueError(f"sweep point {point.label()}: {e}") from None
            if self.seed_key == "noise_seed" and d.get("latency") != "sampled":
                raise ValueError(f"sweep point {point.label()}: noise seeds draw step-time noise "
                                 "only under latency: sampled (set it in the config or --set)")


def _case_key(case: dict) -> str:
    """A case's overrides (its name apart) as one comparable text."""
    return repr(sorted((k, value_key(v)) for k, v in case.items() if k != "name"))


def apply_overrides(base: dict, overrides: list[tuple[str, Any]]) -> dict:
    """A deep copy of `base` with each dotted path set to its value."""
    d = copy.deepcopy(base)
    for key, value in overrides:
        parts = key.split(".")
        node = d
        for i, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[:i + 1]))
        last = parts[-1]
        if isinstance(node, list):
            node[_index(node, last, key)] = copy.deepcopy(value)
        elif isinstance(node, dict):
            node[last] = copy.deepcopy(value)
        else:
            raise ValueError(f"override {key}: {'.'.join(parts[:-1])} is not a mapping or list")
    return d


def _child(node, part: str, path: str):
    if isinstance(node, dict):
        if part not in node:
            raise ValueError(f"override {path}: the base config has no such key")
        return node[part]
    if isinstance(node, list):
        return node[_index(node, part, path)]
    raise ValueError(f"override {path}: not a mapping or list in the base config")


def _index(node: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"override {path}: index {part!r} not in a list of {len(node)}")
    return int(part)


def point_hash(d: dict, base_dir: Path, digests: dict[str, str]) -> str:
    """Content hash of a config: its canonical JSON and the bytes of the files it reads."""
    files = {}
    for path in sorted(_file_refs(d)):
        full = (base_dir / path).resolve()
        if str(full) not in digests:
            digests[str(full)] = file_digest(full)
        files[path] = digests[str(full)]
    blob = json.dumps({"config": d, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _file_refs(node) -> set[str]:
    refs = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k in FILE_KEYS and isinstance(v, str):
                refs.add(v)
            else:
                refs |= _file_refs(v)
    elif isinstance(node, list):
        for v in node:
            refs |= _file_refs(v)
    return refs


def file_digest(path: Path) -> str:
    """sha256 of a file, or of a directory's files (relative names and bytes); '' if absent."""
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.read_bytes())
    elif path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes())
    else:
        return ""
    return h.hexdigest()[:16]


def load_sweep(path: str | Path, grid: dict | None = None, seeds: list[int] | None = None,
               noise: bool = False) -> Sweep:
    """A sweep file, or a plain config swept by `grid`/`seeds` given here (the CLI's flags;
    `noise`: the seeds are noise seeds). Without seeds anywhere, the config's own seed."""
    from sim.sweep.file import SweepFile, parse_sweep_file

    path = Path(path)
    d = read_yaml(path)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a mapping")
    if "base" in d:
        spec = parse_sweep_file(d, path)
        base_path = path.parent / spec.base
        base = read_yaml(base_path)
    else:  # a plain simulation config: the flags are the whole sweep
        base_path, base, spec = path, d, SweepFile(base=path.name)
    if not isinstance(base, dict):
        raise ValueError(f"{base_path}: not a mapping")
    seed_key = "noise_seed" if noise or spec.noise_seeds is not None else "seed"
    spec_seeds = spec.seed_list()
    if spec_seeds is None:  # none given: the config's own (parse_config checks it)
        spec_seeds = [base.get("seed", 0)]
    overlap = sorted(set(spec.grid) & set(grid or {}))
    if overlap:
        raise ValueError(f"{path}: --grid {overlap[0]} and the sweep file's grid both set it")
    try:
        return Sweep(base, base_path.parent, {**spec.grid, **(grid or {})}, list(spec.cases),
                     list(seeds if seeds is not None else spec_seeds), seed_key,
                     own_seed=seeds is None and spec.seed_list() is None)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None

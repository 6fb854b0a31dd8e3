"""The fidelity suite's file (`reasonsim fidelity --suite`): read, merged with its `base:`, and
checked whole before any engine starts. Every request workload and calibration traffic is built
as the config the loop would simulate and replay (quick and full), every program entry as its
example's config, and every request is held against the engines' `max_model_len`: an error a
grid's tracing would otherwise reach minutes in, from a child process, is one line up front."""

from __future__ import annotations

from pathlib import Path

from validation.replay import REPO

SUITE = REPO / "examples" / "fidelity" / "suite.yaml"
SUITE_KEYS = ("base", "grid", "quick_grid", "sampling_grid", "max_model_len",
              "calibration_traffic", "workloads")
REQUEST_KEYS = ("quick", "quick_requests", "seed", "workload", "replica")
"""a request workload's keys (calibration traffic has the same)"""
PROGRAM_KEYS = ("quick", "quick_count", "count", "seed", "program", "programs", "retrace")
DEFAULT_MAX_MODEL_LEN = 2048


def load_suite(path: Path, seen: tuple = ()) -> dict:
    """The suite file, checked enough to fail before any engine starts (`seen`: the suites
    whose `base:` led here)."""
    from sim.config import read_yaml

    try:
        suite = read_yaml(path)
    except ValueError as e:
        raise ValueError(f"not a readable suite: {e}") from None
    if not isinstance(suite, dict) or not isinstance(suite.get("workloads"), dict) or \
            not suite["workloads"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty `workloads:` mapping")
    _refuse_unknown(suite, SUITE_KEYS, f"{path}")
    suite = with_base(Path(path), suite, seen)
    try:
        _check_grids(suite)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    traffic = suite.get("calibration_traffic") or {}
    if not isinstance(traffic, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("workload"), dict) for t in traffic.values()):
        raise ValueError(f"{path}: calibration_traffic: expected a mapping of name -> "
                         "{workload: ...}")
    for name, spec in traffic.items():
        _check_entry(suite, spec, f"{path}: calibration_traffic.{name}", Path(path).parent)
    for name, spec in suite["workloads"].items():
        if not isinstance(spec, dict) or ("workload" in spec) == ("program" in spec):
            raise ValueError(f"{path}: workloads.{name}: needs exactly one of `workload:` "
                             "(requests) or `program:` (an example program config)")
        _check_entry(suite, spec, f"{path}: workloads.{name}", Path(path).parent)
    return suite


def _check_grids(suite: dict) -> None:
    """Each grid a `StepGrid`, and the engines' `max_model_len` an integer that holds each
    grid's longest request."""
    from tracers.step_profile import _grid_limits

    from engines.model_dir import check_model_len
    from validation.replay import DEFAULT_MODEL

    limit = suite.get("max_model_len", DEFAULT_MAX_MODEL_LEN)
    if type(limit) is not int or limit < 1:
        raise ValueError(f"max_model_len: expected a positive integer, got {limit!r}")
    check_model_len(DEFAULT_MODEL, limit)  # the model every engine of the loop serves
    for key in ("grid", "quick_grid", "sampling_grid"):
        if not isinstance(suite.get(key), dict) and (key != "sampling_grid" or key in suite):
            raise ValueError(f"`{key}:` must be a mapping of trace-steps grid settings")
        if isinstance(suite.get(key), dict):
            try:
                _grid_limits(step_grid(suite[key]), limit, None)
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None


def _check_entry(suite: dict, spec: dict, where: str, base_dir: Path) -> None:
    """A workload or calibration traffic entry: its keys, and the configs the loop builds from
    it (quick and full), each as `parse_config` reads it."""
    from validation.fidelity_programs import check_program_spec

    program = "program" in spec
    _refuse_unknown(spec, PROGRAM_KEYS if program else REQUEST_KEYS, where)
    if not isinstance(spec.get("quick", False), bool):
        raise ValueError(f"{where}.quick: expected true or false, got {spec['quick']!r}")
    for key in ("programs", "replica", "retrace"):
        if not isinstance(spec.get(key, {}), dict):
            raise ValueError(f"{where}.{key}: expected a mapping")
    for key, why in (("calibration", "the loop calibrates on this machine"),
                     ("count", "the loop serves one engine live")):
        if key in spec.get("replica", {}):
            raise ValueError(f"{where}.replica.{key}: {why}; the entry sets no {key}")
    try:
        if program:
            check_program_spec(spec)
        else:
            _check_requests(spec, suite.get("max_model_len", DEFAULT_MAX_MODEL_LEN), base_dir)
    except (OSError, ValueError) as e:
        # a request entry's `replica:` is its config's one replica group
        message = str(e) if program else str(e).replace("cluster.replicas[0]", "replica")
        raise ValueError(f"{where}: {message}") from None


def _check_requests(spec: dict, max_model_len: int, base_dir: Path) -> None:
    """A request entry's config, quick and full, read as the loop reads it; every request
    within the engines' `max_model_len`."""
    from sim.config import parse_config
    from sim.workloads.requests import workload_from_config
    from validation.replay import check_lengths

    for quick in (False, True):
        # The calibration is not read here: the loop writes it after the grid's tracing.
        cfg = parse_config(request_config(spec, Path("calibration.json"), quick), base_dir)
        check_lengths(workload_from_config(cfg.workload, cfg.seed, cfg.base_dir),
                      max_model_len, f"the suite's max_model_len {max_model_len}")


def _refuse_unknown(d: dict, known: tuple, where: str) -> None:
    """A key the loop never reads (a misspelling would be ignored silently)."""
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(known)}")


def step_grid(g: dict):
    """A suite's grid mapping as the step profiler's `StepGrid`; a one-line error naming the
    key it lacks or does not know."""
    from tracers.step_profile import StepGrid

    try:
        return StepGrid(**{k: (tuple(v) if k in ("idle_ms", "regimes") else v)
                           for k, v in g.items()})
    except TypeError as e:  # a missing or unknown key
        raise ValueError(f"not a trace-steps grid ({e})") from None


def with_base(path: Path, suite: dict, seen: tuple = ()) -> dict:
    """A suite whose `base:` names another suite file (relative to it) takes that suite's grids,
    calibration traffic and engine settings, and its own workloads only: held-out workloads
    judged on the calibration the base suite's runs have."""
    if "base" not in suite:
        return suite
    base = suite["base"]
    if not isinstance(base, str) or not (path.parent / base).is_file():
        raise ValueError(f"{path}: base: {base!r} is not a suite file beside it")
    if (path.parent / base).resolve() in seen + (path.resolve(),):
        raise ValueError(f"{path}: base: {base!r} leads back to itself")
    parent = load_suite(path.parent / base, seen + (path.resolve(),))
    own = {k: v for k, v in suite.items() if k != "base"}
    return {**{k: v for k, v in parent.items() if k != "workloads"}, **own}


def request_config(spec: dict, cal: Path, quick: bool) -> dict:
    """The simulation config of a suite's request workload (or calibration traffic) on
    calibration `cal`."""
    workload = dict(spec["workload"])
    if quick and "quick_requests" in spec:
        workload["num_requests"] = spec["quick_requests"]
    return {"seed": spec.get("seed", 0), "workload": workload,
            "cluster": {"replicas": [{"calibration": str(cal), "count": 1,
                                      **spec.get("replica", {})}]}}

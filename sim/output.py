"""A simulation's output directory: its tables, `runs` row and summary, complete or absent."""

from __future__ import annotations

import json
from pathlib import Path


def sim_run_row(cfg, result) -> dict:
    """The `runs` row of a simulation (the calibration's device, simulated)."""
    from importlib import metadata

    from sim.step_time.calibration import load_calibration
    from traces.provenance import run_row

    cal = load_calibration(cfg.replicas[0].calibration)
    p = cal.provenance
    return run_row("sim", "reasonsim-sim", metadata.version("reasonsim"),
                   f"simulated {p['device']}", sum(g.count for g in cfg.replicas),
                   p["model_id"], p["model_config_hash"], p["dtype"], "calibrated", cfg.seed,
                   {"config": json.loads(cfg.to_json()), "summary": result.summary,
                    "calibrations": calibration_fingerprints(cfg)})


def calibration_fingerprints(cfg) -> list[dict]:
    """Per replica group: its pool, calibration file, the device its timings came from and its
    step-time model (so `validate` can check the live run's step speed against it)."""
    from sim.step_time import registry as step_time
    from sim.step_time.calibration import fingerprint, load_calibration

    out = []
    for g in cfg.replicas:
        cal = load_calibration(g.calibration)
        out.append({"pool": g.pool, "calibration": str(g.calibration),
                    **fingerprint(cal.provenance),
                    "step_time_model": step_time.to_json(cal.latency),
                    "speed_probe_ms": cal.provenance.get("speed_probe_ms"),
                    "speculative": g.speculative})
    return out


def write_sim(cfg, result, out_dir: Path, extra: dict[str, str] | None = None) -> None:
    """A simulation's tables and summary (and `extra` files: name -> text) under `out_dir`,
    complete or absent: written into a hidden sibling and renamed into place at the end."""
    import os
    import shutil

    from traces.store import check_out_dir, write_tables

    check_out_dir(out_dir, resume=False, can_resume=False)
    tables = {} if result.requests is None else {"requests": result.requests}
    if result.programs is not None:
        tables["programs"] = result.programs
    if result.steps is not None:
        tables["steps"] = result.steps
    tables.update(result.tables)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.parent.glob(f".{out_dir.name}.partial-*"):  # left by a killed writer
        if not _alive(stale.name.rsplit("-", 1)[-1]):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # the summary and extra files are hashed in the manifest with the tables
        write_tables(tmp, sim_run_row(cfg, result), tables, {
            "summary.json": json.dumps(result.summary, indent=1) + "\n", **(extra or {})})
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above): rename replaces nothing else
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Whether the process that named a partial output is still running (it may be writing)."""
    import os

    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

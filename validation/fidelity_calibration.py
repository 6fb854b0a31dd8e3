"""A fidelity run's calibration: the step grids traced on this machine, the calibration traffic
replayed live, a `serving` fit of all, and the whole traced again when the machine was noisy.

A shared machine has spells (tens of seconds at 1.4-1.9x its usual step time) that a
calibration traced through one carries into every simulation of the run, while the live runs
minutes later may be quiet. The fit's held-out step error shows it: on quiet runs of the
shipped suite the held-out P90 was 5-16%, on runs calibrated through a spell 25-33%
(docs/measurements/2026-12-06-noisy-calibrations.md). Above `NOISY_P90_APE` the calibration is
traced again, up to `retraces` times, and the attempt with the lowest held-out P90 is kept at
the run's top level (the others under RUN/noisy_calibrations/K, their calibrations pointing at
their own traces).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from validation.fidelity_suite import request_config, step_grid
from validation.replay import fresh_process
from validation.speed_checks import TRAFFIC_PREFIX

NOISY_P90_APE = 0.20
"""a calibration's held-out step P90 error above which it was traced on a noisy spell"""
RETRACES = 2
"""how many times a noisy calibration is traced again by default"""
NOISY_DIR = "noisy_calibrations"


def calibrate_quietly(out: Path, suite: dict, quick: bool, progress: bool, engine: str = "vllm",
                      device: str = "auto", retraces: int = RETRACES,
                      noisy_p90: float = NOISY_P90_APE) -> tuple[Path, list[dict]]:
    """`trace_and_calibrate`, traced again while its held-out step P90 error is above
    `noisy_p90`, up to `retraces` times; the kept calibration's path and every attempt (its
    held-out errors, when it started, whether it was kept)."""
    check_retraces(retraces, noisy_p90)
    attempts = []
    for k in range(1, retraces + 2):
        started = time.time()
        cal = trace_and_calibrate(out, suite, quick, progress, engine, device)
        heldout = json.loads(cal.read_text())["heldout"]
        attempts.append({"attempt": k, "mape": heldout["mape"], "p90_ape": heldout["p90_ape"],
                         "started_at": round(started, 1)})
        if heldout["p90_ape"] <= noisy_p90 or k == retraces + 1:
            break
        move_calibration(out, out / NOISY_DIR / str(k))
    # ties go to the later attempt: the one nearest the live runs
    best = min(reversed(attempts), key=lambda a: a["p90_ape"])
    if best is not attempts[-1]:
        move_calibration(out, out / NOISY_DIR / str(attempts[-1]["attempt"]))
        move_calibration(out / NOISY_DIR / str(best["attempt"]), out)
        (out / NOISY_DIR / str(best["attempt"])).rmdir()
    for a in attempts:
        a["kept"] = a is best
    return out / "calibration.json", attempts


def check_retraces(retraces: int, noisy_p90: float) -> None:
    """Refuse a negative retrace count or noise bound (NaN included)."""
    if retraces < 0 or not noisy_p90 >= 0:
        raise ValueError(f"--retraces {retraces}, --retrace-above {noisy_p90}: both must be "
                         ">= 0")


def calibration_parts(root: Path) -> list[Path]:
    """What one calibration attempt wrote under root: its traces and calibration.json."""
    names = ["grid", "sampling_grid", "calibration.json"]
    return [root / n for n in names if (root / n).exists()] + sorted(
        root.glob(TRAFFIC_PREFIX + "*"))


def move_calibration(src: Path, dst: Path) -> None:
    """Move one calibration attempt's traces and calibration from src to dst, its
    calibration's trace paths moved with them."""
    dst.mkdir(parents=True, exist_ok=True)
    for part in calibration_parts(src):
        if (dst / part.name).exists():
            raise FileExistsError(f"{dst / part.name}: a calibration attempt is there already")
        shutil.move(str(part), str(dst / part.name))
    cal = dst / "calibration.json"
    d = json.loads(cal.read_text())
    d["provenance"]["traces"] = [str(dst / Path(t).name) if Path(t).parent == src else t
                                 for t in d["provenance"]["traces"]]
    cal.write_text(json.dumps(d, indent=1) + "\n")


def trace_and_calibrate(out: Path, suite: dict, quick: bool, progress: bool,
                        engine: str = "vllm", device: str = "auto") -> Path:
    """Trace the grid on this machine's engine (vLLM, or the PyTorch engine's serving mode on
    `device`), replay the suite's calibration traffic live (workloads of their own, never
    evaluated), and fit a serving calibration on all; its path."""
    from sim.step_time.calibration import calibrate

    traces = trace_grids(out, suite, quick, progress, engine, device)
    path = out / "calibration.json"
    path.write_text(json.dumps(calibrate(traces, model="serving").to_json(), indent=1) + "\n")
    # Live steps: the shapes, waves, idle gaps (and prefix-cache hits) of real serving.
    traces += replay_traffic(out, suite, path, quick, engine, device)
    if len(traces) > 1:
        path.write_text(json.dumps(calibrate(traces, model="serving").to_json(), indent=1)
                        + "\n")
    return path


def replay_traffic(out: Path, suite: dict, cal: Path, quick: bool, engine: str,
                   device: str) -> list[Path]:
    """The suite's calibration traffic replayed live under out, each in a fresh process (the
    config's engine limits from `cal`); their directories."""
    from sim.config import parse_config

    from validation.replay import replay_config

    dirs = []
    for name, traffic in (suite.get("calibration_traffic") or {}).items():
        if (quick and not traffic.get("quick", True)) or unserved(traffic, engine):
            continue
        cfg = parse_config(request_config(traffic, cal, quick), out)
        fresh_process(replay_config, cfg, out / f"{TRAFFIC_PREFIX}{name}", device=device)
        dirs.append(out / f"{TRAFFIC_PREFIX}{name}")
    return dirs


def trace_grids(out: Path, suite: dict, quick: bool, progress: bool, engine: str,
                device: str) -> list[Path]:
    """The suite's step grids traced here, each in a fresh process; their directories."""
    from tracers.step_profile import profile_steps
    from tracers.torch_steps import profile_torch_steps

    from validation.replay import DEFAULT_MODEL

    grid = suite["quick_grid" if quick else "grid"]
    limits = {"max_model_len": int(suite.get("max_model_len", 2048)),
              "max_num_seqs": max(grid["batch_sizes"])}  # one engine for every grid
    traces = []
    # The sampling grid runs small cells greedy and seeded back to back: the seeded-sampling
    # term the program workloads pay (`sim.step_time.sampling_cost`), in the same calibration.
    # The PyTorch engine's grid is greedy: it has the first only.
    grids = (("grid", grid),) if engine == "torch" else (
        ("grid", grid), ("sampling_grid", suite.get("sampling_grid")))
    for name, g in grids:
        if not g:
            continue
        spec = step_grid(g)
        if engine == "torch":
            fresh_process(profile_torch_steps, str(DEFAULT_MODEL), out / name, spec, **limits,
                          serving=True, device=device, progress=progress)
        else:
            fresh_process(profile_steps, str(DEFAULT_MODEL), out / name, spec, **limits,
                          progress=progress)
        traces.append(out / name)
    return traces


def unserved(spec: dict, engine: str) -> str | None:
    """Why a suite workload (or calibration traffic) cannot run on `engine`; None if it can."""
    if engine == "torch" and (spec.get("replica") or {}).get("enable_prefix_caching"):
        return "prefix caching: the PyTorch engine has none"
    return None



"""The machine's speed around each live run of a fidelity suite, and the run judged at it.

A shared machine's speed moves between calibrating and the live passes minutes later. `reasonsim
fidelity` judges each live run at the decode speed of the live runs just before and after it (other
workloads', seconds away; `neighbour_factors`, `judge_at_neighbours`), the estimate at the
calibration's speed alone kept beside it as raw. With `--speed-checks` the suite's calibration
traffic is also replayed after each live pass (under RUN/speed_checks/passK/): the machine's level
then, against the calibration traffic's own, and each live run judged at the level of the check
nearest it as well (`at traffic speed`, beside). Why the neighbours and not the checks:
docs/measurements/2026-12-06-speed-checks.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHECKS_DIR = "speed_checks"
TRAFFIC_PREFIX = "calibration_traffic_"
NEIGHBOURS = "sim_at_neighbours"
"""where a workload's simulations at its live runs' neighbours' speed go (numbered per run)"""


def check_dir(out: Path, k: int) -> Path:
    """Where the traffic replayed after live pass k goes."""
    return Path(out) / CHECKS_DIR / f"pass{k}"


def started_s(trace_dir: str | Path) -> float:
    """The wall-clock time (epoch seconds) a trace's run started."""
    from traces import read_run

    return float(read_run(trace_dir)["created_at"].timestamp())


def traffic_level(calibration: str | Path, trace_dirs: list) -> dict | None:
    """One traffic state: the median of its decode-only steps' live-over-predicted ratio,
    pooled over its traces, and when it ran (the mean of their start times); None without a
    decode step."""
    from sim.step_time.live_speed import decode_steps, step_ratios

    ratios, times = [], []
    for d in trace_dirs:
        got = step_ratios(calibration, d)
        if got is None:
            continue
        ratio, steps = got
        ratios.append(ratio[decode_steps(steps)])
        times.append(started_s(d))
    pooled = np.concatenate(ratios) if ratios else np.zeros(0)
    if not len(pooled):
        return None
    return {"at_s": float(np.mean(times)), "decode": float(np.median(pooled)),
            "steps": int(len(pooled))}


def traffic_levels(run_dir: str | Path, calibration: str | Path) -> list[dict]:
    """Every traffic state of a fidelity run in time order: the calibration's own traffic
    (`pass` 0), then each pass's speed check; empty where the run has no speed check."""
    run_dir = Path(run_dir)
    passes = sorted((run_dir / CHECKS_DIR).glob("pass*"), key=lambda p: int(p.name[4:]))
    if not passes:
        return []
    states = [(0, sorted(run_dir.glob(TRAFFIC_PREFIX + "*")))]
    states += [(int(p.name[4:]), sorted(p.glob(TRAFFIC_PREFIX + "*"))) for p in passes]
    out = []
    for k, dirs in states:
        level = traffic_level(calibration, dirs)
        if level is not None:
            out.append({"pass": k, **level})
    return sorted(out, key=lambda s: s["at_s"])


def live_factor(levels: list[dict], at_s: float, how: str = "nearest",
                relative: bool = True) -> float | None:
    """The step-time factor a live run started at `at_s` is simulated at: the level of the
    traffic state nearest it (`how="nearest"`) or interpolated in time between the two around
    it (`"interpolated"`), over the calibration traffic's own level where `relative` (the
    calibration already prices that traffic at its level); None without levels."""
    if not levels:
        return None
    times = np.array([s["at_s"] for s in levels])
    decode = np.array([s["decode"] for s in levels])
    if how == "nearest":
        # ties go to the earlier state: the one the run's machine came from
        level = float(decode[int(np.argmin(np.abs(times - at_s)))])
    elif how == "interpolated":
        level = float(np.interp(at_s, times, decode))
    else:
        raise ValueError(f"how: {how!r}; nearest or interpolated")
    own = [s["decode"] for s in levels if s["pass"] == 0]
    return level / own[0] if relative and own else level


def at_traffic_speed(d: dict, lives: list, levels: list[dict], out_dir: Path, base_dir: Path,
                     how: str = "nearest", relative: bool = True) -> dict | None:
    """Each metric's judged estimate (the noise draws' median) with the simulation's step times
    scaled, for each live run, to the traffic state nearest it (`live_factor` over the run's
    `traffic_levels`), averaged over the live runs as their values are; with the factors.
    None where the run has no speed check."""
    if not levels:
        return None
    factors = [live_factor(levels, started_s(live), how, relative) for live in lives]
    return {"factors": factors, "levels": levels,
            "median": medians_at(d, factors, out_dir, base_dir)}


def medians_at(d: dict, factors: list[float], out_dir: Path, base_dir: Path,
               name: str = "sim_at_traffic") -> dict:
    """Each metric's noise-draw median with the step times scaled by each live run's factor in
    turn (the scaled calibrations under out_dir/{name}N), averaged over the live runs (as the
    judged live value is their mean)."""
    from validation.fidelity_judging import sampled_medians, scaled_config

    meds = [sampled_medians(scaled_config(d, f, out_dir / f"{name}{i + 1}", base_dir))
            for i, f in enumerate(factors)]
    return {m: float(np.mean([v[m] for v in meds])) for m in meds[0]}


def judge_at_traffic(metric: dict, sim: float) -> None:
    """Add to a `validation.judge.judge` result the error of the estimate at traffic speed and
    whether it is within the tolerance or the live-vs-live spread."""
    from validation.judge import error_within

    err, ok = error_within(metric, sim)
    metric.update(sim_at_traffic_speed=float(sim), error_at_traffic_speed=err,
                  ok_at_traffic_speed=ok)


def neighbour_factors(rows: list[dict], levels: list[dict],
                      per_side: int = 1) -> dict[tuple[str, int], float]:
    """Per (workload, live run index) of a fidelity table's rows, the mean decode level of the
    live runs just before and just after it in time (other workloads' runs, from their
    `step_speed`: the run judged unseen; `per_side` runs a side, each side's mean weighing
    alike); at either end of the suite, the speed check there (`traffic_levels`, over the
    calibration traffic's own level) where the run has one, else the other side alone. The
    machine's speed of the moment, read from real serving seconds away."""
    own = next((s["decode"] for s in levels if s["pass"] == 0), 1.0)
    runs = sorted((t, w["workload"], i, (w["step_speed"][i] or {}).get("decode"))
                  for w in rows for i, t in enumerate(w["live_started_s"]))
    ends = [levels[0]["decode"] / own if levels else None,
            levels[-1]["decode"] / own if len(levels) > 1 else None]
    out = {}
    for k, (_, name, i, _) in enumerate(runs):
        # the nearest runs of other workloads on each side (never the judged workload's own);
        # one that measured no level leaves its place empty
        sides = [[r[3] for r in reversed(runs[:k]) if r[1] != name][:per_side],
                 [r[3] for r in runs[k + 1:] if r[1] != name][:per_side]]
        near = []
        for side, end in zip(sides, ends):
            got = [x for x in side if x is not None] if side else \
                [end] if end is not None else []
            if got:
                near.append(float(np.mean(got)))
        out[(name, i)] = float(np.mean(near)) if near else 1.0
    return out


def judge_at_neighbours(rows: list[dict], levels: list[dict], medians) -> None:
    """Judge each row's latency metrics at its live runs' neighbours' speed: the estimate
    becomes the noise draws' median with each live run's step times scaled to the decode
    level of the runs beside it (`neighbour_factors`, kept in the row; `medians(row,
    factors)`: `medians_at`); the estimate at the calibration's speed alone is kept as
    `sim_raw`, `error_raw`, `ok_raw`."""
    from validation.judge import error_within

    factors = neighbour_factors(rows, levels)
    for r in rows:
        r["neighbour_factors"] = [factors[(r["workload"], i)]
                                  for i in range(len(r["live_started_s"]))]
        med = medians(r, r["neighbour_factors"])
        for m, v in r["metrics"].items():
            if "band" not in v or m not in med:
                continue
            err, ok = error_within(v, med[m])
            v.update(sim_raw=v["sim"], error_raw=v["error"], ok_raw=v["ok"], sim=med[m],
                     error=err, ok=ok)

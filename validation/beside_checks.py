"""A family replay's live runs judged at the machine's speed beside them.

A shared machine's speed moves within minutes (docs/fidelity.md), so a replay calibrated once,
before its live runs, judges them at a speed they may not have run at. With speed checks, the
calibration's own programs are served again after each live run; each live run is then judged at
the mean decode level (`validation.judge.pool_step_speeds`) of the calibration-traffic runs just
before and just after it: other programs than those judged, seconds away, so the judged run's own
speed is never read (as `reasonsim fidelity` judges a workload at its neighbours' speed). The
estimate at the calibration's speed alone stays beside it as raw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TOLERANCE = {"program_latency_p50": 0.05, "program_latency_p90": 0.05, "mean_latency_s": 0.05,
             "throughput_programs_per_s": 0.03}
"""a metric within this of the live runs' mean (or their spread) is judged ok: latency 5%,
throughput 3%, as `reasonsim fidelity` holds e2e latency and throughput"""


def started_s(run_dir: str | Path) -> float:
    """When a live run started (epoch seconds): its trace's, or the earliest of the engine
    traces one level down (a run with a trace per pool)."""
    from validation.speed_checks import started_s as trace_started_s

    run_dir = Path(run_dir)
    if (run_dir / "runs").is_dir():
        return trace_started_s(run_dir)
    nested = [d for d in run_dir.iterdir() if (d / "runs").is_dir()]
    if not nested:
        raise ValueError(f"{run_dir}: no trace (a runs table, there or one level down)")
    return min(map(trace_started_s, nested))


def beside_levels(sim_dir: str | Path, traffic_dirs: list, live_dirs: list,
                  fitted: int = 1) -> list[dict[str, float]]:
    """Per live run, per pool: the mean decode level of the calibration-traffic runs nearest
    before and after it in time that served on the pool (one side where the other has none;
    the pool left out where neither has), over the level of the traffic the calibration was
    fitted on (the first `fitted` of `traffic_dirs`): 1 where the machine ran as it did then."""
    from validation.judge import pool_step_speeds

    measured = [(started_s(d), pool_step_speeds(sim_dir, d)) for d in traffic_dirs]
    pools = sorted({p for _, levels in measured for p in levels})
    own = {p: float(np.mean([lv[p] for _, lv in measured[:fitted] if p in lv] or [1.0]))
           for p in pools}
    traffic = sorted(measured, key=lambda t: t[0])
    out = []
    for live in live_dirs:
        at_s = started_s(live)
        before = [lv for s, lv in reversed(traffic) if s < at_s]
        after = [lv for s, lv in traffic if s > at_s]
        levels = {}
        for pool in pools:
            sides = [next((lv[pool] for lv in side if pool in lv), None)
                     for side in (before, after)]
            got = [x for x in sides if x is not None]
            if got:
                levels[pool] = float(np.mean(got)) / own[pool]
        out.append(levels)
    return out


def judge_quantiles(sims: list[dict[str, float]], lives: list[dict[str, float]],
                    ) -> dict[str, dict]:
    """Per metric, `validation.judge.judge` of the simulations' mean (one per live run, each at
    that run's speed) against the live runs, at the metric's TOLERANCE."""
    from validation.judge import judge

    return {m: judge(float(np.mean([q[m] for q in sims])), [q[m] for q in lives], TOLERANCE[m])
            for m in sims[0]}


def level_line(levels: list[dict[str, float]]) -> str:
    """The levels each live run was judged at, as text."""
    return "; ".join(", ".join(f"{pool} {v:.2f}x" for pool, v in run.items()) or "none"
                     for run in levels)


def judged_line(judged: dict) -> str:
    """A judged result (`levels`, `metrics` from `judge_quantiles`) as one line of text."""
    return (f"judged at the speed checks beside each live run ({level_line(judged['levels'])}): "
            + ", ".join(f"{m} {v['error']:+.1%} ({'within' if v['ok'] else 'NOT within'} "
                        f"{v['tolerance']:.0%} or the spread {v['spread']:.1%})"
                        for m, v in judged["metrics"].items()))

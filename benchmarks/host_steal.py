"""Does the host's CPU steal explain a VM's slow spells? Steal beside each live run's step levels.

    python benchmarks/host_steal.py sample LOG [--interval-s 0.5]     # beside a fidelity run
    python benchmarks/host_steal.py judge LOG RUN... [--json]          # after it

`sample` appends the machine's `/proc/stat` CPU line (with the wall clock) to LOG every
`--interval-s` until stopped: the `steal` column counts the ticks the hypervisor ran another
guest on our virtual CPUs (live traces now carry their own samples, the `host_cpu` table;
this reads traces without). `judge` takes every live run of the fidelity runs given (each
`RUN/<workload>/live*` whose serving LOG covers), places it on the wall clock (its runs row is
written when serving starts; its steps' `start_s` count from there), and prints the share of
CPU ticks stolen while it served beside its steps' levels against RUN's calibration
(`sim.step_time.live_speed.step_ratios`): the median (the level `at live speed` reads), the
time-weighted mean (what latency pays) and the share of steps over twice their price; then
their correlations over the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engines.host_cpu import STAT_FIELDS  # noqa: E402
from sim.step_time.live_speed import step_ratios  # noqa: E402
from traces.store import read_table  # noqa: E402


def sample(log: Path, interval_s: float, count: int | None = None) -> None:
    """Append `time /proc/stat-cpu-line` to log every interval_s, count times (None: until
    interrupted)."""
    with open(log, "a") as f:
        k = 0
        while count is None or k < count:
            if k:
                time.sleep(interval_s)
            f.write(f"{time.time():.3f} {Path('/proc/stat').read_text().splitlines()[0]}\n")
            f.flush()
            k += 1


def read_samples(log: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wall clock s, cumulative steal ticks, cumulative ticks of every state) per sample."""
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    t = np.array([float(r[0]) for r in rows])
    ticks = np.array([[int(x) for x in r[2:2 + len(STAT_FIELDS)]] for r in rows])
    return t, ticks[:, STAT_FIELDS.index("steal")], ticks.sum(axis=1)


def steal_share(samples: tuple, start: float, end: float) -> float | None:
    """Stolen share of all CPU ticks between the samples nearest start and end; None where
    the log does not cover the interval."""
    t, steal, total = samples
    if start < t[0] or end > t[-1]:
        return None
    i, j = np.searchsorted(t, start), np.searchsorted(t, end)
    if j <= i:
        return None
    return float((steal[j] - steal[i]) / max(total[j] - total[i], 1))


def served_span(trace: Path) -> tuple[float, float] | None:
    """When a trace served on the wall clock (its runs row's time plus its steps' span, s);
    None where it ran no step."""
    start = pd.Timestamp(read_table(trace, "runs").to_pandas().created_at.iloc[0]).timestamp()
    steps = read_table(trace, "steps").to_pandas()
    if not len(steps):
        return None
    return start + steps.start_s.min(), start + steps.start_s.max()


def served_steal(samples: tuple, trace: Path) -> float | None:
    """The stolen share while a trace served; None where it ran no step or the log does not
    cover it."""
    span = served_span(trace)
    return None if span is None else steal_share(samples, *span)


def live_row(samples: tuple, calibration: Path, live: Path) -> dict | None:
    """One live run: its steal share while serving and its steps' levels; None if uncovered."""
    got = step_ratios(calibration, live)
    if got is None:
        return None
    ratio, steps = got
    share = served_steal(samples, live)
    if share is None:
        return None
    return {"live": f"{live.parent.parent.name}/{live.parent.name}/{live.name}",
            "steal": share, "median": float(np.median(ratio)),
            "time_weighted": float(steps.duration_ms.sum() / (steps.duration_ms / ratio).sum()),
            "over_2x": float(np.mean(ratio > 2)), "steps": int(len(ratio))}


def judge(log: Path, runs: list[Path]) -> dict:
    """Every covered live run's row and the correlations of steal with the three levels."""
    samples = read_samples(log)
    rows = [r for run in runs for live in sorted(run.glob("*/live[0-9]*"))
            if (r := live_row(samples, run / "calibration.json", live)) is not None]
    out = {"rows": rows}
    if len(rows) > 2:
        steal = np.array([r["steal"] for r in rows])
        out["correlation"] = {k: float(np.corrcoef(steal, [r[k] for r in rows])[0, 1])
                              for k in ("median", "time_weighted", "over_2x")}
    return out


def main(argv: list[str] | None = None) -> int:
    """`sample` or `judge`, as the module's docstring says."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("log", type=Path)
    s.add_argument("--interval-s", type=float, default=0.5)
    j = sub.add_parser("judge")
    j.add_argument("log", type=Path)
    j.add_argument("runs", type=Path, nargs="+")
    j.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "sample":
        sample(a.log, a.interval_s)
        return 0
    out = judge(a.log, a.runs)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'live run':44s} {'steal':>6s} {'median':>7s} {'t-wtd':>6s} {'>2x':>6s} {'steps':>6s}")
    for r in out["rows"]:
        print(f"{r['live']:44s} {r['steal']:6.1%} {r['median']:7.3f} {r['time_weighted']:6.3f} "
              f"{r['over_2x']:6.1%} {r['steps']:6d}")
    for k, v in out.get("correlation", {}).items():
        print(f"correlation of steal with {k}: {v:+.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the machine's speed level persist from one live run to the next? Fidelity runs, offline.

    python benchmarks/level_persistence.py RUN1 RUN2 ... [--json]

Each live run of a `reasonsim fidelity` run records its decode steps' level against the
calibration's prediction (`step_speed` in fidelity.json, the level `at live speed` reads) and
when it started (`live_started_s`). A live run of another workload minutes before a run is a
measurement the simulation could have had (it is not the run judged): if the level persists
over minutes, a reference run interleaved with the live passes would predict each live run's
level better than the calibration alone does. Per fidelity run, with the live runs in the order
they ran, this prints the median absolute log error of each predictor of a live run's decode
level:

- calibration: level 1 (the simulation as judged)
- previous: the live run just before it (another workload, the previous minute or two)
- previous3: the mean log level of the three live runs before it
- pass: the mean log level of every live run of the pass before it (the second pass only)

and the live-vs-live spread of the levels (a workload's two runs, a pass apart) beside them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def live_levels(run: Path) -> list[tuple[float, str, int, float]]:
    """(start_s, workload, live index, log decode level) of every live run, in start order."""
    rows = json.loads((run / "fidelity.json").read_text())["workloads"]
    out = [(start, w["workload"], i, float(np.log(s["decode"])))
           for w in rows
           for i, (start, s) in enumerate(zip(w.get("live_started_s", []),
                                             w.get("step_speed", [])))
           if s.get("decode")]
    return sorted(out)


def predictor_errors(levels: list[tuple[float, str, int, float]]) -> dict:
    """Median absolute log error of each predictor over the runs it applies to."""
    logs = np.array([x[3] for x in levels])
    second = [k for k, x in enumerate(levels) if x[2] == 1]
    first_pass = logs[[k for k, x in enumerate(levels) if x[2] == 0]]
    errors = {
        "calibration": np.abs(logs[1:]),
        "previous": np.abs(logs[1:] - logs[:-1]),
        "previous3": np.abs([logs[k] - logs[max(0, k - 3):k].mean()
                             for k in range(1, len(logs))]),
        "pass": np.abs(logs[second] - first_pass.mean()) if second else np.array([]),
    }
    by_workload: dict[str, dict[int, float]] = {}
    for _, name, i, lv in levels:
        by_workload.setdefault(name, {})[i] = lv
    spread = [abs(v[1] - v[0]) for v in by_workload.values() if len(v) == 2]
    out = {k: float(np.median(v)) if len(v) else None for k, v in errors.items()}
    out["live_vs_live"] = float(np.median(spread)) if spread else None
    out["runs"] = len(logs)
    out["levels"] = [round(float(np.exp(x)), 3) for x in logs]
    return out


def main(argv: list[str] | None = None) -> int:
    """Print each run's predictor errors and the pooled medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {str(r): predictor_errors(live_levels(r)) for r in args.runs}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    keys = ("calibration", "previous", "previous3", "pass", "live_vs_live")
    print("| run | live runs | " + " | ".join(keys) + " | decode levels in order |")
    print("|---|---|" + "---|" * len(keys) + "---|")
    for run, r in result.items():
        cells = [f"{100 * r[k]:.1f}%" if r[k] is not None else "-" for k in keys]
        print(f"| {Path(run).name} | {r['runs']} | " + " | ".join(cells)
              + f" | {', '.join(f'{x:.2f}' for x in r['levels'])} |")
    print("\n(median absolute log error of each predictor of a live run's decode level, x100)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

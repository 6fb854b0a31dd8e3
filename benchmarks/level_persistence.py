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


PREDICTORS = ("calibration", "previous", "previous3", "pass")


def predicted_levels(levels: list[tuple[float, str, int, float]], predictor: str
                     ) -> list[float]:
    """The log level `predictor` gives each live run (in `levels`' order), from the live runs
    before it only (the pass predictor's first pass: every run before it); 0 where none."""
    logs = np.array([x[3] for x in levels])
    first_pass = [k for k, x in enumerate(levels) if x[2] == 0]
    out = []
    for k, (_, _, i, _) in enumerate(levels):
        before = {"previous": logs[k - 1:k], "previous3": logs[max(0, k - 3):k],
                  "pass": logs[first_pass] if i == 1 else logs[:k],
                  "calibration": logs[:0]}[predictor]
        out.append(float(before.mean()) if len(before) else 0.0)
    return out


def predictor_errors(levels: list[tuple[float, str, int, float]]) -> dict:
    """Median absolute log error of each predictor over the runs it applies to (every run but
    the first; the pass predictor: the second pass)."""
    logs = np.array([x[3] for x in levels])
    applies = {p: [k for k, x in enumerate(levels) if (x[2] == 1 if p == "pass" else k > 0)]
               for p in PREDICTORS}
    errors = {p: np.abs(logs - predicted_levels(levels, p))[applies[p]] for p in PREDICTORS}
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

"""Judge fidelity runs at a speed level measured beside each live run, not in it, offline.

    python benchmarks/reference_level.py OUT RUN1 RUN2 ... [--predictors previous,previous3,pass]

The judged estimate of `reasonsim fidelity` simulates at the calibration's speed; `at live
decode speed` rescales to the judged live run's own steps (not a prediction). Between the two:
the level of live runs of *other* workloads that ran just before the judged one (minutes
earlier, as a reference run interleaved with the live passes would measure it). Each
predictor (`level_persistence.py`) names, per live run, the earlier live runs whose mean log
decode level it takes; a live run with none (the suite's first) takes the calibration's level.
Every workload is simulated again at that level (its noise band's median, as judged) against
that one live run, the errors averaged over its live runs, and judged against the metric's
tolerance or the live-vs-live spread as the run recorded it. Prints, per run and predictor:
metrics ok, the median absolute e2e/program P50 error and its mean, beside the run as judged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from level_persistence import PREDICTORS, live_levels, predicted_levels  # noqa: E402
from validation.fidelity import at_live_speed  # noqa: E402
from validation.fidelity_judging import P50_METRICS  # noqa: E402
from validation.fidelity_programs import programs_at_live_speed  # noqa: E402

def reference_factors(run: Path, predictor: str) -> dict[tuple[str, int], float]:
    """(workload, live index) -> the decode level `predictor` gives that live run."""
    levels = live_levels(run)
    return {(name, i): float(np.exp(lv)) for (_, name, i, _), lv in
            zip(levels, predicted_levels(levels, predictor))}


def rejudge_at(run: Path, out: Path, factors: dict[tuple[str, int], float]) -> list[dict]:
    """Every metric of RUN with its error at the given decode levels ((workload, live index)
    -> level; simulated under out): (workload, metric, error of the band's median, ok against
    tolerance or spread)."""
    recorded = json.loads((run / "fidelity.json").read_text())["workloads"]
    rows = []
    for w in recorded:
        name = w["workload"]
        d = yaml.safe_load((run / name / "config.yaml").read_text())
        lives = sorted((run / name).glob("live[0-9]*"))
        got = []
        for i, live in enumerate(lives):
            where = out / name / f"live{i + 1}"
            f = factors[(name, i)]
            got.append(programs_at_live_speed(d, f, where, live, REPO / "examples")
                       if w["kind"] == "programs" else at_live_speed(d, f, where, live))
        for m, v in w["metrics"].items():
            if m not in got[0]:
                continue
            err = float(np.mean([g[m][1] for g in got]))
            rows.append({"workload": name, "metric": m, "error": err,
                         "judged": v["error"],
                         "ok": abs(err) <= max(v["tolerance"], v["spread"]),
                         "ok_judged": v["ok"]})
    return rows


def summary(rows: list[dict], key: str, ok: str) -> str:
    """ok count, median |P50| and mean P50 of the rows' `key` errors."""
    p50 = [r[key] for r in rows if r["metric"] in P50_METRICS]
    return (f"{sum(r[ok] for r in rows)}/{len(rows)} | {100 * np.median(np.abs(p50)):.1f}% | "
            f"{100 * np.mean(p50):+.1f}%")


def main(argv: list[str] | None = None) -> int:
    """Rejudge each run at each predictor's levels and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="where the new simulations go")
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--predictors", default="previous,previous3,pass")
    args = ap.parse_args(argv)
    chosen = args.predictors.split(",")
    if not set(chosen) <= set(PREDICTORS):
        ap.error(f"--predictors: choose from {', '.join(PREDICTORS)}")
    print("| run | estimate | ok (latency metrics) | median abs P50 | mean P50 |")
    print("|---|---|---|---|---|")
    result = {}
    for run in args.runs:
        for p in chosen:
            rows = rejudge_at(run, args.out / run.name / p, reference_factors(run, p))
            result[(run.name, p)] = rows
            if p == chosen[0]:
                print(f"| {run.name} | as judged | {summary(rows, 'judged', 'ok_judged')} |")
            print(f"| {run.name} | at {p} level | {summary(rows, 'error', 'ok')} |", flush=True)
    (args.out / "reference_level.json").write_text(json.dumps(
        {f"{r}:{p}": v for (r, p), v in result.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

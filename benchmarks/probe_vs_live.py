"""How well a live run's speed probe tells the speed its run then ran at.

    python benchmarks/probe_vs_live.py RUN [RUN ...]      # `reasonsim fidelity -o RUN` outputs

Per fidelity run: every live run's decode level (its decode steps over the calibration's
prediction, against the calibration's own steps: `live_over_predicted`) beside its speed
probe's level (`probe_level`, the mean of its phases before and after the run) read three
ways: against the grid's `reference` probe alone, against every probe of the calibration's
traces pooled (`probe_reference`, what `calibrate` keeps), and against the prediction. Prints
per reference the median of probe level over live level (1: the probe reads the run's speed),
its 5-95% range and the correlation across the live runs (does a slower probe mean a slower
run?).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time import registry as step_time  # noqa: E402
from sim.step_time.live_speed import (live_over_predicted, probe_level,  # noqa: E402
                                      probe_reference)
from traces import read_table  # noqa: E402


def levels(run: Path) -> dict:
    """Per live run of a fidelity run: its decode level and its probe's levels by reference."""
    cal = json.loads((run / "calibration.json").read_text())
    model = step_time.from_json(cal["step_time_model"])
    traces = cal["provenance"]["traces"]
    refs = {"grid reference": probe_reference(traces, ("reference",)),
            "pooled": probe_reference(traces), "prediction": None}
    out = {"live": [], **{k: [] for k in refs}}
    for live in sorted(run.glob("*/live[0-9]*")):
        if not (live / "speed_probe").is_dir():
            continue
        ratio, steps = live_over_predicted(model, read_table(live, "steps").to_pandas())
        out["live"].append(float(np.median(ratio[steps.prefill_tokens.eq(0).to_numpy()])))
        for name, ref in refs.items():
            out[name].append(probe_level(model, live, ref)["level"])
    return out


def main() -> None:
    """Print, per run and reference, how the probe's level compares with the run's."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for run in args.runs:
        lv = levels(run)
        live = np.array(lv["live"])
        for name in ("grid reference", "pooled", "prediction"):
            r = np.array(lv[name]) / live
            rows.append({"run": str(run), "reference": name, "live_runs": len(live),
                         "probe_over_live_median": float(np.median(r)),
                         "p5": float(np.quantile(r, 0.05)), "p95": float(np.quantile(r, 0.95)),
                         "corr": float(np.corrcoef(live, lv[name])[0, 1])})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| run | probe read against | live runs | probe / live, median | 5-95% | correlation |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(r['run']).name} | {r['reference']} | {r['live_runs']} | "
              f"{r['probe_over_live_median']:.3f} | {r['p5']:.2f}-{r['p95']:.2f} | "
              f"{r['corr']:+.2f} |")


if __name__ == "__main__":
    main()

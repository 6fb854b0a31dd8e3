"""How fast prefill steps run against their price, relative to the decode steps beside them.

    reasonsim fidelity -o RUN
    python benchmarks/prefill_level.py RUN [RUN...] [--json]

For every fidelity run: per step of each trace directory (the calibration traffic the run's
calibration was fitted on, and each live run of each request workload), measured / predicted
time (`sim.step_time.live_speed.step_ratios`, the run's calibration at its mean fit); the
median over steps with prefill tokens over the median over decode-only steps. A machine that
runs faster or slower moves both alike; a ratio above 1 is a prefill step the model prices low
against the decodes it prices right. Prints one line per run (the calibration traffic's median
and the live runs') and, over all runs, each workload's median.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

MIN_DECODES, MIN_PREFILLS = 20, 5
"""steps a trace needs of each kind for its ratio"""


def prefill_over_decode(calibration: Path, steps_dir: Path) -> float | None:
    """Median measured / predicted over prefill steps, over that of decode-only steps; None
    with too few of either."""
    got = step_ratios(calibration, steps_dir)
    if got is None:
        return None
    ratio, steps = got
    decode = steps.prefill_tokens.eq(0).to_numpy()
    if decode.sum() < MIN_DECODES or (~decode).sum() < MIN_PREFILLS:
        return None
    return float(np.median(ratio[~decode]) / np.median(ratio[decode]))


def run_levels(run: Path) -> dict[str, float]:
    """Per trace directory of a fidelity run ("traffic:NAME" or "WORKLOAD/liveN"), its
    prefill-over-decode ratio."""
    cal = run / "calibration.json"
    result = json.loads((run / "fidelity.json").read_text())
    dirs = [("traffic:" + d.name.removeprefix("calibration_traffic").lstrip("_") or "base", d)
            for d in sorted(run.glob("calibration_traffic*"))]
    dirs += [(f"{w['workload']}/{d.name}", d) for w in result["workloads"]
             if w["kind"] == "requests" for d in sorted((run / w["workload"]).glob("live[0-9]"))]
    out = {}
    for name, d in dirs:
        r = prefill_over_decode(cal, d)
        if r is not None:
            out[name] = r
    return out


def main() -> None:
    """Parse arguments, read every run, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = {str(r): run_levels(r) for r in args.runs if (r / "fidelity.json").exists()}
    if args.json:
        print(json.dumps(runs))
        return
    by_workload: dict[str, list] = {}
    for run, levels in runs.items():
        traffic = [v for k, v in levels.items() if k.startswith("traffic:")]
        live = [v for k, v in levels.items() if not k.startswith("traffic:")]
        print(f"{Path(run).name:12s} calibration traffic {_med(traffic)}  live runs {_med(live)}")
        for k, v in levels.items():
            by_workload.setdefault("traffic" if k.startswith("traffic:") else k.split("/")[0],
                                   []).append(v)
    print("over all runs (median, min-max, traces):")
    for name, vals in sorted(by_workload.items()):
        print(f"  {name:22s} {_med(vals)} ({min(vals):.3f}-{max(vals):.3f}, {len(vals)})")


def _med(values: list) -> str:
    return f"{np.median(values):.3f}" if values else "-"


if __name__ == "__main__":
    main()

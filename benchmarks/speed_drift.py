"""How a machine's speed moves within one live run, against a calibration's step-time model.

    python benchmarks/speed_drift.py --fidelity RUN_DIR        # a `reasonsim fidelity -o` dir:
                                                                # its calibration, every live run
    python benchmarks/speed_drift.py CALIBRATION TRACE_DIR...   # any calibration and traces

Per trace: its decode steps' speed level, live over predicted step time against the
calibration's own steps (as the speed check reads it:
`sim.step_time.live_speed.live_over_predicted`), over the whole run (median and mean) and by
thirds of the run (medians), and the largest third over the smallest. A calibration read
against the very traces it was fitted on reads about 1.
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
from sim.step_time.live_speed import live_over_predicted  # noqa: E402
from sim.step_time.serving_features import attach_spans  # noqa: E402
from traces.store import read_table  # noqa: E402


def load_model(calibration: Path):
    """The step-time model of a calibration file."""
    model = json.loads(calibration.read_text())["step_time_model"]
    return step_time.from_json(model if isinstance(model, dict) else json.loads(model))


def drift(model, trace: Path) -> dict | None:
    """A trace's decode steps' live / predicted: median, mean, the thirds' medians (None with
    fewer than 30 decode steps)."""
    steps = attach_spans(read_table(trace, "steps").to_pandas(), [trace])
    ratio, steps = live_over_predicted(model, steps)
    decode = (steps.prefill_tokens == 0).to_numpy() & (steps.decode_seqs > 0).to_numpy()
    t, r = steps.start_s.to_numpy()[decode], np.asarray(ratio)[decode]
    if len(r) < 30:
        return None
    edges = np.quantile(t, [0, 1 / 3, 2 / 3, 1])
    thirds = [float(np.median(r[(t >= a) & (t <= b)])) for a, b in zip(edges[:-1], edges[1:])]
    return {"trace": str(trace), "steps": int(len(r)), "median": float(np.median(r)),
            "mean": float(r.mean()), "thirds": thirds, "span_s": float(t[-1] - t[0]),
            "max_over_min": max(thirds) / min(thirds)}


def main() -> None:
    """Print one row per trace (or JSON lines with --json) and the median max/min."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", type=Path, help="CALIBRATION TRACE_DIR...")
    ap.add_argument("--fidelity", type=Path, help="a fidelity run's output directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.fidelity:
        cal, traces = args.fidelity / "calibration.json", sorted(args.fidelity.glob("*/live*"))
    elif len(args.paths) >= 2:
        cal, traces = args.paths[0], args.paths[1:]
    else:
        ap.error("give --fidelity DIR, or a calibration and trace directories")
    model = load_model(cal)
    rows = [r for r in (drift(model, t) for t in traces) if r is not None]
    for r in rows:
        print(json.dumps(r) if args.json else
              f"{r['trace']}: {r['steps']} decode steps over {r['span_s']:.0f} s, live/predicted "
              f"median {r['median']:.3f} mean {r['mean']:.3f}, thirds "
              + " ".join(f"{x:.3f}" for x in r["thirds"]) + f" (max/min {r['max_over_min']:.3f})")
    if rows and not args.json:
        print(f"median max/min over {len(rows)} runs: "
              f"{np.median([r['max_over_min'] for r in rows]):.3f}")


if __name__ == "__main__":
    main()

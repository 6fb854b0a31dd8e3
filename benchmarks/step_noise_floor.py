"""How close a calibration's step-time error is to the machine's own noise floor.

    python benchmarks/step_noise_floor.py CALIBRATION RUN_DIR [RUN_DIR ...] [--json]

For the decode-only steps of each run (e.g. a fidelity run's `<workload>/live1`), the absolute
percentage error of three predictors: an oracle that knows the median duration of the run's own
steps of the same shape (decode sequences, context in 256-token bands; shapes with >= 5 steps),
which no model of shape can beat on that run; the calibration; and the calibration times the
run's median actual/predicted ratio (its level on the day, which `fidelity` reports as the live
speed). Where the calibration's error is near the oracle's, what is left is the machine's step
to step noise, not the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.calibration import load_calibration  # noqa: E402
from sim.step_time.serving_features import engine_features  # noqa: E402
from traces import read_table  # noqa: E402

CONTEXT_BAND = 256
"""context tokens per shape band of the oracle"""
MIN_STEPS = 5
"""steps a shape needs for its median to stand for it"""


def _ape(pred: np.ndarray, y: np.ndarray) -> dict:
    ape = np.abs(pred - y) / y
    return {"mape": float(ape.mean()), "p90_ape": float(np.quantile(ape, 0.9))}


def noise_floor(model, run_dir: str | Path) -> dict:
    """The three predictors' errors over a run's decode-only steps of repeated shapes."""
    steps = engine_features(read_table(run_dir, "steps").to_pandas())
    steps = steps[(steps.duration_ms > 0) & (steps.prefill_tokens == 0)]
    pred = model.predict_ms(steps)
    shape = [steps.decode_seqs.to_numpy(), (steps.context_tokens // CONTEXT_BAND).to_numpy()]
    groups = pd.Series(steps.duration_ms.to_numpy(float)).groupby(shape)
    keep = (groups.transform("size") >= MIN_STEPS).to_numpy()
    y, pred = steps.duration_ms.to_numpy(float)[keep], pred[keep]
    if not y.size:
        raise ValueError(f"{run_dir}: no decode shape with >= {MIN_STEPS} steps")
    level = float(np.median(y / pred))
    return {"run": str(run_dir), "steps": int(y.size), "level": level,
            "oracle": _ape(groups.transform("median").to_numpy()[keep], y),
            "calibration": _ape(pred, y), "calibration_at_level": _ape(pred * level, y)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = load_calibration(args.calibration).latency
    rows = [noise_floor(model, d) for d in args.runs]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"decode-only steps, absolute percentage error: mean / P90 ({args.calibration})")
    print(f"{'run':44s} {'steps':>6s} {'oracle':>13s} {'calibration':>13s} "
          f"{'at run level':>20s}")
    for r in rows:
        cell = lambda e: f"{e['mape']:5.1%} / {e['p90_ape']:5.1%}"
        print(f"{r['run'][-44:]:44s} {r['steps']:6d} {cell(r['oracle']):>13s} "
              f"{cell(r['calibration']):>13s} {cell(r['calibration_at_level']):>13s} "
              f"(x{r['level']:.2f})")


if __name__ == "__main__":
    main()

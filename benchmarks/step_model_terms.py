"""What each term of the `serving` step-time model buys: fits with terms left out, scored on
held-out live steps.

    python benchmarks/step_model_terms.py --train GRID_DIR,TRAFFIC_DIR --test LIVE_DIR,... [--json]

Fits the model on the `--train` traces (grid and calibration traffic, as `reasonsim fidelity`
does) once with every term and once without each extra term (and with only the linear terms),
then reports on the `--test` traces (live replays of other workloads, e.g. a fidelity run's
`<workload>/live1`): MAPE over all steps and the median actual/predicted ratio (the mean-mode
prediction, as the simulator uses it) for decode-only, prefill-only and mixed steps.
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

from sim.step_time.latency import midpoints  # noqa: E402
from sim.step_time.serving_features import (  # noqa: E402
    FEATURES, LINEAR, engine_features, feature_matrix)
from traces import read_table  # noqa: E402


def load(dirs: str) -> pd.DataFrame:
    """Steps of comma-separated trace directories, with engine features."""
    frames = [read_table(d, "steps").to_pandas() for d in dirs.split(",")]
    steps = engine_features(pd.concat(frames, ignore_index=True))
    return steps[steps.duration_ms > 0]


def fit_terms(x: np.ndarray, y: np.ndarray, keep: list[int]) -> tuple[np.ndarray, float]:
    """NNLS on relative error over the kept columns; (coefficients, mean residual ratio)."""
    from scipy.optimize import nnls

    xs = x[:, keep]
    scale = xs.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((xs / scale) / y[:, None], np.ones_like(y))
    full = np.zeros(x.shape[1])
    full[keep] = coef / scale
    ratio = y / np.maximum(x @ full, 1e-9)
    return full, float(np.exp(np.quantile(np.log(ratio), midpoints(100))).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True, help="comma-separated trace directories")
    ap.add_argument("--test", required=True, help="comma-separated trace directories")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    train, test = load(args.train), load(args.test)
    x, y = feature_matrix(train), train.duration_ms.to_numpy(float)
    xt, yt = feature_matrix(test), test.duration_ms.to_numpy(float)
    regime = np.where(test.prefill_tokens == 0, "decode",
                      np.where(test.decode_seqs == 0, "prefill", "mixed"))
    every = list(range(len(FEATURES)))
    variants = {"all terms": every, "linear terms only": list(range(LINEAR))}
    variants |= {f"without {FEATURES[i]}": [j for j in every if j != i]
                 for i in range(LINEAR, len(FEATURES))}
    rows = []
    for name, keep in variants.items():
        coef, smear = fit_terms(x, y, keep)
        pred = xt @ coef * smear
        ratio = yt / pred
        row = {"variant": name, "mape": float(np.mean(np.abs(pred - yt) / yt)),
               "steps": int(len(yt))}
        for r in ("decode", "prefill", "mixed"):
            if (regime == r).any():
                row[f"{r}_ratio"] = float(np.median(ratio[regime == r]))
                row[f"{r}_steps"] = int((regime == r).sum())
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"train {len(y)} steps ({args.train}); test {len(yt)} steps")
    print(f"{'variant':34s} {'MAPE':>6s} {'decode':>7s} {'prefill':>8s} {'mixed':>6s}  "
          "(median actual/predicted)")
    for r in rows:
        print(f"{r['variant']:34s} {r['mape']:6.1%} {r.get('decode_ratio', float('nan')):7.2f} "
              f"{r.get('prefill_ratio', float('nan')):8.2f} {r.get('mixed_ratio', float('nan')):6.2f}")


if __name__ == "__main__":
    main()

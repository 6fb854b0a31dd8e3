"""Where a `seed replay`'s live steps leave their calibration: live / predicted by mode and shape.

    python benchmarks/seed_step_speed.py REPLAY_DIR [--calibrations CAL_DIR] [--json]

REPLAY_DIR is a `reasonsim seed replay -o` directory (`<mode>/live<i>/<pool>` and, with
`--calibrate-here`, `calibration/<mode>/live<i>/<pool>`); CAL_DIR holds `draft.calib.json` and
`target.calib.json` (default: REPLAY_DIR/calibration). For each pool, mode and kind of run
(calibration traffic or validation), the median of live step time over the calibration's
prediction (its log-probability term included), over all steps, by sequences per step and,
for one-sequence steps, by the engine's idle time before the step (the other engine's turn on a
shared CPU). A mode whose steps sit above the others' at equal shape and idle, in its
calibration traffic as in its validation runs, meets a cost the step model lacks; the machine's
drift moves whole runs instead.
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

from sim.step_time.live_speed import step_ratios  # noqa: E402

SEQ_BANDS = [0, 1, 2, 4, 8, 1024]
IDLE_BANDS_MS = [-1.0, 0.5, 2.0, 4.0, 8.0, 16.0, np.inf]


def ratios(calibration: Path, dirs: list[Path]) -> pd.DataFrame:
    """Per step of the engines under `dirs`: live / predicted
    (`sim.step_time.live_speed.step_ratios`, as
    `seed replay` measures a run's speed), sequences, idle ms."""
    frames = []
    for d in dirs:
        got = step_ratios(calibration, d)
        if got is None:
            continue
        r, steps = got
        frames.append(pd.DataFrame({"ratio": r, "idle_ms": steps.idle_ms.to_numpy(),
                                    "seqs": (steps.prefill_seqs + steps.decode_seqs).to_numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _medians(f: pd.DataFrame, col: str, bands) -> dict:
    g = f.groupby(pd.cut(f[col], bands), observed=True).ratio
    return {str(b): [int(n), float(m)] for (b, n), m in zip(g.size().items(), g.median())}


def table(replay: Path, cal_dir: Path) -> list[dict]:
    """One row per (pool, kind of run, mode) with its medians."""
    rows = []
    for pool in ("target", "draft"):
        for kind, root in (("calibration", replay / "calibration"), ("validation", replay)):
            for mode in ("ar", "ar_batched", "sd", "seed", "seed_batched"):
                f = ratios(cal_dir / f"{pool}.calib.json",
                           sorted((root / mode).glob(f"live*/{pool}")))
                if f.empty:
                    continue
                one = f[f.seqs == 1]
                rows.append({"pool": pool, "runs": kind, "mode": mode, "steps": len(f),
                             "ratio": float(f.ratio.median()),
                             "by_seqs": _medians(f, "seqs", SEQ_BANDS),
                             "one_seq_by_idle_ms": _medians(one, "idle_ms", IDLE_BANDS_MS)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("replay", type=Path)
    ap.add_argument("--calibrations", type=Path, help="default: REPLAY/calibration")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = table(args.replay, args.calibrations or args.replay / "calibration")
    if args.json:
        print(json.dumps(rows))
        return
    cell = lambda d: " ".join(f"{b}:{n}/{m:.2f}" for b, (n, m) in d.items())
    for r in rows:
        print(f"{r['pool']:6s} {r['runs']:11s} {r['mode']:12s} {r['steps']:6d} steps, "
              f"live/predicted {r['ratio']:.2f}")
        print(f"    by sequences  {cell(r['by_seqs'])}")
        print(f"    1 seq by idle {cell(r['one_seq_by_idle_ms'])}")


if __name__ == "__main__":
    main()

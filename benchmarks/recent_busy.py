"""Do steps run slower after a mostly idle second? Live / predicted by the engine's recent load.

    python benchmarks/recent_busy.py CALIBRATION STEPS_DIR [STEPS_DIR ...] [--window-s 1] [--json]

For the one-sequence decode steps of each live run (a fidelity run's `<workload>/live1`, a
`seed replay` run's `<mode>/live0/target`), the median of live step time over the calibration's
prediction (`sim.step_time.live_speed.step_ratios`) by the share of the previous `--window-s` the
engine spent stepping, over its run's median (within-run: the machine's drift between runs is out)
and raw. The `serving` model's idle terms see only the gap right before a step; a gradient here
is a cost of the engine's recent load that they miss.
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

BUSY_BANDS = [-0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.01]


def busy_steps(calibration: str | Path, steps_dir: str | Path, window_s: float) -> pd.DataFrame:
    """One-sequence decode steps of a run: ratio, ratio over the run's median, busy share."""
    got = step_ratios(calibration, steps_dir)
    if got is None:
        return pd.DataFrame()
    ratio, steps = got
    order = np.argsort(steps.start_s.to_numpy(), kind="stable")
    start = steps.start_s.to_numpy()[order]
    busy_s = np.concatenate([[0.0], np.cumsum(steps.duration_ms.to_numpy()[order] / 1e3)])
    first = np.searchsorted(start, start - window_s, "left")
    share = (busy_s[np.arange(len(start))] - busy_s[first]) / window_s
    f = pd.DataFrame({"ratio": ratio[order], "busy": share,
                      "one_decode": ((steps.prefill_tokens == 0)
                                     & (steps.decode_seqs == 1)).to_numpy()[order]})
    f = f[f.one_decode]
    return f.assign(within=f.ratio / f.ratio.median())


def table(calibration: str | Path, dirs: list[str], window_s: float) -> list[dict]:
    """Rows by busy band over every run: steps, within-run and raw median ratio."""
    f = pd.concat([busy_steps(calibration, d, window_s) for d in dirs], ignore_index=True)
    if f.empty:
        raise ValueError("no one-sequence decode steps in the runs given")
    return [{"busy": str(b), "steps": int(len(x)), "within_run": float(x.within.median()),
             "raw": float(x.ratio.median())}
            for b, x in f.groupby(pd.cut(f.busy, BUSY_BANDS), observed=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = table(args.calibration, args.runs, args.window_s)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"one-sequence decode steps by busy share of the previous {args.window_s:g} s: "
          "live / predicted over the run's median, and raw")
    for r in rows:
        print(f"  busy {r['busy']:12s} {r['steps']:6d} steps  within run {r['within_run']:.3f}  "
              f"raw {r['raw']:.3f}")


if __name__ == "__main__":
    main()

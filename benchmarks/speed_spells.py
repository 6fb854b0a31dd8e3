"""A shared machine's speed spells in live runs: window levels of decode steps against a calibration.

    python benchmarks/speed_spells.py CALIBRATION LIVE_TRACE... [--windows 0.5,1,2] [--json]

For each live run (a `steps` trace: a fidelity run's `<workload>/live1`, a replay), the decode
steps' measured / predicted ratio, its median per window of time over the run's median: the
5/25/50/75/95% quantiles of those levels, their log standard deviation, and the lag-1
correlation of successive windows' log levels (how long a spell lasts). `sim.step_time.spells` draws
such levels per replica and `SPELL_S` window in sampled latency.
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
from traces import read_table  # noqa: E402


def spells(calibration: Path, live: Path, window_s: float) -> dict:
    """Window-level statistics of one live run's decode steps."""
    model = step_time.from_json(json.loads(calibration.read_text())["step_time_model"])
    ratio, steps = live_over_predicted(model, read_table(live, "steps").to_pandas())
    steps = steps.assign(ratio=ratio)
    decode = steps[(steps.prefill_tokens == 0) & (steps.decode_seqs > 0)]
    window = ((decode.start_s - decode.start_s.min()) // window_s).astype(int)
    level = np.log(decode.groupby(window).ratio.median().to_numpy() / decode.ratio.median())
    lag1 = float(np.corrcoef(level[:-1], level[1:])[0, 1]) if len(level) > 2 else float("nan")
    return {"run": str(live), "window_s": window_s, "windows": int(len(level)),
            "quantiles": [round(float(v), 3) for v in np.exp(np.quantile(
                level, [0.05, 0.25, 0.5, 0.75, 0.95]))],
            "sd_log": round(float(level.std()), 3), "lag1": round(lag1, 2)}


def main() -> None:
    """Print one line per live run and window (or JSON rows)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("calibration", type=Path)
    ap.add_argument("live", type=Path, nargs="+")
    ap.add_argument("--windows", default="0.5,1,2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [spells(args.calibration, live, float(w)) for w in args.windows.split(",")
            for live in args.live]
    for r in rows:
        print(json.dumps(r) if args.json else
              f"{r['run']}  window {r['window_s']} s  n={r['windows']:3d}  levels "
              f"{r['quantiles']}  sd(log) {r['sd_log']}  lag-1 {r['lag1']}")


if __name__ == "__main__":
    main()

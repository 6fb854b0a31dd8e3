"""Where an engine's time went, for live and simulated runs of one workload side by side.

    python benchmarks/occupancy.py RUN_DIR [RUN_DIR ...] [--json]

Each RUN_DIR is a live run or a `simulate -o` directory written with `output: {steps: true}`
(one replica). Per run: steps, busy seconds, the mean prefill and decode-only step, the gaps
between steps (host time: < 5 ms; waits for work beyond), the requests' summed wait from
arrival to first scheduled, and the programs' latency P50 where the run has programs. Two runs
with the same busy time and different waits differ in what queueing made of a small difference
in occupancy (or in their order), not in the step model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.host_time import GAP_CAP_MS  # noqa: E402
from traces import read_table  # noqa: E402


def occupancy(run: Path) -> dict:
    """The run's step, gap, wait and program-latency totals."""
    if not (run / "steps").is_dir():
        raise SystemExit(f"{run}: no steps table (simulate with `output: {{steps: true}}`)")
    s = read_table(run, "steps").to_pandas().sort_values("start_s")
    if s.replica_id.nunique() > 1:
        raise SystemExit(f"{run}: {s.replica_id.nunique()} replicas; one is compared")
    end_s = s.start_s + s.duration_ms / 1e3
    gap_s = (s.start_s.shift(-1) - end_s).dropna()
    pre = s.prefill_tokens > 0
    r = read_table(run, "requests").to_pandas()
    out = {"run": str(run), "steps": int(len(s)), "busy_s": float(s.duration_ms.sum() / 1e3),
           "prefill_step_ms": float(s.duration_ms[pre].mean()),
           "decode_step_ms": float(s.duration_ms[~pre].mean()),
           "host_gaps_s": float(gap_s[gap_s < GAP_CAP_MS / 1e3].sum()),
           "waits_for_work_s": float(gap_s[gap_s >= GAP_CAP_MS / 1e3].sum()),
           "request_wait_s": float((r.scheduled_s - r.arrival_s).sum())}
    if (run / "programs").is_dir():
        p = read_table(run, "programs").to_pandas()
        out["program_latency_p50_s"] = float(np.median(p.finish_s - p.arrival_s))
    return out


def main() -> None:
    """Print one row per run (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [occupancy(r) for r in args.runs]
    if args.json:
        print(json.dumps(rows))
        return
    cols = [k for k in rows[0] if k != "run"]
    print("| run | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for row in rows:
        print(f"| {row['run']} | " + " | ".join(
            f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, "-"))
            for c in cols) + " |")


if __name__ == "__main__":
    main()

"""Where a fidelity run's simulated program workload spends its engine time against the live runs.

    reasonsim fidelity -o RUN
    python benchmarks/program_steps.py RUN [WORKLOAD] [--json]

For a program workload of a fidelity run (default `cot_probes`): the steps and busy time (sum of
step durations) of the simulation and of each live run, by step kind (decode-only, prefill-only,
mixed) and sequences in the step; and each live run's steps over the calibration's prediction
(medians; every program sequence samples with a seed, so the seeded term is in the prediction).
Equal busy time by kind with a latency error points at scheduling; unequal at the step model.
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
from traces import read_table  # noqa: E402

SEQ_BANDS = [0, 1, 2, 4, 8, 16, 256]


def by_kind(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps with `kind` (decode / prefill / mixed) and `seqs` (band of sequences)."""
    kind = np.where(steps.prefill_tokens.eq(0), "decode",
                    np.where(steps.decode_seqs.eq(0), "prefill", "mixed"))
    return steps.assign(kind=kind, seqs=pd.cut(steps.decode_seqs + steps.prefill_seqs,
                                               SEQ_BANDS).astype(str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("workload", nargs="?", default="cot_probes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = args.run / args.workload
    runs = [n for n in ("sim", "live1", "live2") if (base / n / "steps").is_dir()]
    if "sim" not in runs:
        sys.exit(f"{base}/sim has no steps table: not a fidelity program workload")
    busy = pd.concat([by_kind(read_table(base / n, "steps").to_pandas()).assign(run=n)
                      for n in runs]).pivot_table(index=["kind", "seqs"], columns="run",
                                                  values="duration_ms", aggfunc=["size", "sum"])
    ratios = {}
    for n in runs[1:]:
        r, s = step_ratios(args.run / "calibration.json", base / n, all_seeded=True)
        s = by_kind(s.assign(ratio=r))
        ratios[n] = s.groupby(["kind", "seqs"]).ratio.median()
    ratio = pd.DataFrame(ratios)
    if args.json:
        print(json.dumps({"busy": json.loads(busy.to_json(orient="split")),
                          "live_over_predicted": json.loads(ratio.to_json(orient="split"))}))
        return
    pd.set_option("display.width", 200)
    totals = busy["sum"].sum()
    print(f"{args.workload}: busy ms " + ", ".join(f"{n} {totals[n]:.0f}" for n in runs))
    print("\nsteps (size) and busy ms (sum) by kind and sequences:")
    print(busy.round(1))
    print("\nlive steps / predicted (median):")
    print(ratio.round(3))


if __name__ == "__main__":
    main()

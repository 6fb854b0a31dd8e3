"""A calibration's log-probability term against the per-position-only least-squares fit it
replaced, on one trace's steps that returned log-probabilities (prints one line each).

    python benchmarks/logprob_terms.py TRACE_DIR CALIBRATION.json

Both price the plain part with the calibration's step-time model; the errors are over the steps
with log-probabilities (median and mean absolute percentage error, and decode steps by batch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.calibration import load_calibration  # noqa: E402
from sim.step_time.logprob_cost import attach_logprobs, logprob_ms  # noqa: E402
from sim.step_time.serving_features import engine_features  # noqa: E402
from traces import read_table  # noqa: E402


def main() -> None:
    """Fit the per-position-only term, compare, print."""
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    trace, cal = sys.argv[1], load_calibration(sys.argv[2])
    steps = engine_features(attach_logprobs(read_table(trace, "steps").to_pandas(), [trace]))
    base = cal.latency.predict_ms(steps) * cal.latency.residual_sampler()[0]
    duration = steps.duration_ms.to_numpy()
    lp = (steps.logprob_tokens > 0).to_numpy()
    per_row, _ = nnls(steps.loc[lp, ["logprob_tokens", "logprob_top_k"]].to_numpy(float),
                      duration[lp] - base[lp])
    decode = lp & (steps.prefill_tokens == 0).to_numpy()
    seqs = steps.decode_seqs.to_numpy()
    for name, cost in (("per position only (least squares)", (0.0, *per_row)),
                       ("calibration's", (cal.logprob_step_ms, cal.logprob_token_ms,
                                          cal.logprob_top_k_ms))):
        ape = np.abs(base + logprob_ms(steps, cost) - duration) / duration
        by_seqs = {int(n): round(float(np.median(ape[decode & (seqs == n)])), 3)
                   for n in sorted(set(seqs[decode]))}
        print(f"{name}: cost (step, position, entry ms) {[round(float(c), 4) for c in cost]}; "
              f"log-probability steps median APE {np.median(ape[lp]):.3f}, MAPE "
              f"{ape[lp].mean():.3f}; decode steps' median APE by sequences {by_seqs}")


if __name__ == "__main__":
    main()

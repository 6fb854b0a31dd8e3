"""What the seeded-sampling term buys: calibrate one regimes grid with and without it, then
price another run's steps (held out by run) with each, by sampling regime (one line each).

    reasonsim trace steps -o FIT --regimes greedy,seeded,logprobs ...   # and again -o EVAL
    python benchmarks/sampling_terms.py FIT EVAL

Each price is the calibration's whole step time (step-time model at its mean, the seeded and the
log-probability terms) against the step's measured duration: median, mean and P90 of the
absolute percentage error, and the median signed error (bias), per regime; the seeded steps'
bias less the greedy steps' (the two runs' machine speeds differ by several percent: that
difference is free of it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.calibration import calibrate  # noqa: E402
from sim.step_time.logprob_cost import attach_logprobs, logprob_ms  # noqa: E402
from sim.step_time.sampling_cost import attach_seeded, seeded_ms  # noqa: E402
from sim.step_time.serving_features import engine_features  # noqa: E402
from traces import read_run, read_table  # noqa: E402


def main() -> None:
    """Calibrate both ways, price the held-out run, print."""
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fit_dir, eval_dir = sys.argv[1], sys.argv[2]
    steps = read_table(eval_dir, "steps").to_pandas()
    steps = engine_features(attach_seeded(attach_logprobs(steps, [eval_dir]),
                                          [read_run(eval_dir)]))
    steps = steps[steps.duration_ms > 0]
    duration = steps.duration_ms.to_numpy()
    lp, seeded = (steps.logprob_tokens > 0).to_numpy(), (steps.seeded_seqs > 0).to_numpy()
    regimes = {"greedy": ~lp & ~seeded, "seeded": ~lp & seeded, "logprobs": lp}
    for name, with_term in (("without the seeded term", False), ("with it", True)):
        cal = calibrate([fit_dir], model="serving", seeded_term=with_term)
        pred = cal.latency.predict_ms(steps) * cal.latency.residual_sampler()[0] + \
            seeded_ms(steps.seeded_seqs, (cal.seeded_step_ms, cal.seeded_seq_ms)) + \
            logprob_ms(steps, (cal.logprob_step_ms, cal.logprob_token_ms, cal.logprob_top_k_ms))
        err = (pred - duration) / duration
        parts = []
        for regime, mask in regimes.items():
            e = err[mask]
            parts.append(f"{regime} ({mask.sum()} steps) median APE {np.median(np.abs(e)):.3f} "
                         f"MAPE {np.abs(e).mean():.3f} P90 {np.quantile(np.abs(e), 0.9):.3f} "
                         f"bias {np.median(e):+.3f}")
        # the two runs' machine speeds differ: the drift-free figure is the regimes' difference
        gap = np.median(err[regimes["seeded"]]) - np.median(err[regimes["greedy"]])
        print(f"{name} (seeded {cal.seeded_step_ms:.4f} ms a step + {cal.seeded_seq_ms:.4f} a "
              f"sequence): seeded bias - greedy bias {gap:+.3f}; " + "; ".join(parts))


if __name__ == "__main__":
    main()

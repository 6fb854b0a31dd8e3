"""The log-probability term of a calibration against the per-position-only least-squares fit it
replaced, on one trace's steps that returned log-probabilities (prints one line each).

    python benchmarks/logprob_terms.py TRACE_DIR CALIBRATION.json

Both use the calibration's step-time model for the plain part; the errors are over the steps with
log-probabilities (median and mean absolute percentage error, and decode steps by batch).
"""

import sys

import numpy as np
from scipy.optimize import nnls
from sim.calibration import load_calibration
from sim.logprob_cost import attach_logprobs, logprob_ms
from sim.serving_latency import engine_features
from traces import read_table
if len(sys.argv) != 3:
    sys.exit(__doc__)
trace, calp = sys.argv[1], sys.argv[2]
cal = load_calibration(calp)
steps = engine_features(attach_logprobs(read_table(trace,'steps').to_pandas(), [trace]))
m = cal.latency
base = m.predict_ms(steps) * m.residual_sampler()[0]
lp = (steps.logprob_tokens > 0).to_numpy()
excess = steps.duration_ms.to_numpy()[lp] - base[lp]
c2, _ = nnls(steps.loc[lp, ['logprob_tokens','logprob_top_k']].to_numpy(float), excess)
costs = {'two-term (least squares)': (0.0, c2[0], c2[1]), 'three-term (Huber)': (cal.logprob_step_ms, cal.logprob_token_ms, cal.logprob_top_k_ms)}
for name, cost in costs.items():
    pred = base + logprob_ms(steps, cost)
    ape = np.abs(pred - steps.duration_ms.to_numpy()) / steps.duration_ms.to_numpy()
    dec = lp & (steps.prefill_tokens == 0).to_numpy()
    by = {int(n): round(float(np.median(ape[dec & (steps.decode_seqs == n).to_numpy()])), 3) for n in sorted(set(steps.decode_seqs[dec]))[:3]}
    print(f"{name}: cost {[round(float(c), 4) for c in cost]}; log-prob steps median APE {np.median(ape[lp]):.3f}, MAPE {ape[lp].mean():.3f}; decode by seqs {by}")

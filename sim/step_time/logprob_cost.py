"""The step time that returned log-probabilities add, fitted from steps with and without them.

vLLM computes and returns a log-probability row per prompt position a request asks prompt
log-probabilities for, and per sampled token of a request asking sampled ones; each row costs
host time on the step's output path, growing with its top-k (`benchmarks/logprob_cost.py` on the
2-core EPYC VM, target-large, one 200-token prefill: 3.5 ms without, 3.9 ms with k = 1, 5.0 ms
with k = 8, 13.3 ms with whole distributions, k = 128). The step-time model has no term for it,
so a fit on scoring traffic spreads it over every step. Here it is a per-step term,
`per_step_ms + per_token_ms * logprob_tokens + per_top_k_ms * logprob_top_k` for a step that
returns any (the `step_logprobs` table's columns): a step pays once for the output path's
log-probability handling (a grid's decode steps with them took ~0.4 ms more at 1 and at 8
sequences alike: `trace steps --regimes`), and per row. The three coefficients are fitted
(non-negative, Huber) on what the steps with them take beyond their greedy twins, the same
steps of the same grid cell run greedy just before (as the seeded term,
`sim.step_time.sampling_cost`);
where too few have one (live traces alone), beyond the step-time model fitted on the steps
without log-probabilities. The
step-time model is then refitted on every step less its log-probability term (`calibrate`
leaves out the steps the term makes up more than half of). Without enough
steps free of log-probabilities the two cannot be told apart: the term stays 0 and the step-time
model keeps the cost, which then holds for traffic like the traced only (the calibration says
so).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from traces import read_table

MIN_PLAIN_STEPS = 20
"""steps without log-probabilities the fit needs to separate their cost"""
MIN_TWIN_STEPS = 20
"""log-probability steps with a greedy twin that the fit takes as its own reference"""


def attach_logprobs(steps: pd.DataFrame, trace_dirs: list[str | Path]) -> pd.DataFrame:
    """The steps with their `logprob_tokens` and `logprob_top_k` (0 where the trace has none)."""
    rows = pd.concat([read_table(d, "step_logprobs").to_pandas() for d in trace_dirs])
    out = steps.merge(rows, on=["run_id", "replica_id", "step_id"], how="left")
    for col in ("logprob_tokens", "logprob_top_k"):
        out[col] = out[col].fillna(0).astype(np.int64)
    return out


def fit_logprob_cost(steps: pd.DataFrame, fit, predict_ms
                     ) -> tuple[float, float, float] | None:
    """(per_step_ms, per_token_ms, per_top_k_ms) of the steps' log-probability rows, or None
    when too few steps are free of them to tell them apart: against their greedy twins where
    at least `MIN_TWIN_STEPS` have one (`greedy_twin_ms`,
    `sim.step_time.sampling_cost.attach_seeded`),
    else against `fit(plain steps)`, the step-time model, by `predict_ms(model, steps)`."""
    has = steps.logprob_tokens.to_numpy() > 0
    if not has.any():
        return 0.0, 0.0, 0.0
    twin = has & steps.greedy_twin_ms.notna().to_numpy() if "greedy_twin_ms" in steps \
        else np.zeros(len(steps), bool)
    if twin.sum() >= MIN_TWIN_STEPS:
        # A grid's log-probability step against the same step of its cell run greedy just
        # before: same shape, same machine speed. Against the step-time model instead, the
        # term took up the model's local error at the regime grid's shapes: 0.17 / 0.28 /
        # 0.21 ms a step in three fits on one machine, where the twins differed by 0.27-0.28
        # every time, and self-consistency replays (a row per token) ran 1.03-1.07x slow.
        lp = steps[twin]
        excess = lp.duration_ms.to_numpy() - lp.greedy_twin_ms.to_numpy()
    elif (~has).sum() < MIN_PLAIN_STEPS:
        return None
    else:
        lp = steps[has]
        excess = lp.duration_ms.to_numpy() - predict_ms(fit(steps[~has]), lp)
    x = np.column_stack([np.ones(len(lp)),
                         lp[["logprob_tokens", "logprob_top_k"]].to_numpy(dtype=float)])
    return tuple(robust_nonnegative_fit(x, excess))


def robust_nonnegative_fit(x: np.ndarray, excess: np.ndarray) -> list[float]:
    """Non-negative coefficients c with x @ c ~ excess, robust to one-off steps."""
    coef, _ = nnls(x, excess)
    # Robust to the one-off steps among them (vLLM's first step returning log-probabilities
    # took 1.8 s in a grid whose others took ~0.4 ms more than plain ones): Huber loss at the
    # excess's own spread, from the least-squares start, coefficients kept >= 0.
    spread = max(1.4826 * float(np.median(np.abs(excess - np.median(excess)))), 0.01)
    fit_ = least_squares(lambda c: x @ c - excess, np.maximum(coef, 1e-6), bounds=(0, np.inf),
                         loss="huber", f_scale=spread)
    return [float(v) for v in fit_.x]


def logprob_ms(steps: pd.DataFrame, cost: tuple[float, float, float]) -> np.ndarray:
    """Each step's log-probability term (`cost`: per step with any, per row, per top-k)."""
    tokens = steps.logprob_tokens.to_numpy()
    return np.where(tokens > 0, cost[0], 0.0) + cost[1] * tokens + \
        cost[2] * steps.logprob_top_k.to_numpy()

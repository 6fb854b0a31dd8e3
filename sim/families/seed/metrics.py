"""ToT metrics: acceptance, verify queue waits, each component's time, target idle time
(sim-vs-live: `validation.seed`).

Both read `tot_requests` tables, which the simulator and the live runner write alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from programs.seed_eval import EVAL_KINDS


SUMMARY_COLUMNS = ("kind", "program_id", "node", "round", "sent_s", "finish_s",
                   "accepted_tokens", "drafted_tokens", "output_tokens")
"""the `tot_requests` columns `tot_summary` reads"""


def queue_waits_s(t: pd.DataFrame) -> np.ndarray:
    """Per verification: seconds from its draft's finish to reaching the target."""
    key = ["program_id", "node", "round"]
    d = t[t.kind == "draft"].set_index(key).finish_s
    v = t[t.kind == "verify"].set_index(key).sent_s
    w = (v - d.reindex(v.index)).dropna().to_numpy(dtype=float)
    return np.maximum(w, 0.0)


def component_s(t: pd.DataFrame, evaluator: bool) -> float:
    """Mean over programs of the seconds the Thought Generator (or the State Evaluator) had a
    request in flight: the union of its requests' [sent, finish] intervals (a serial mode's
    time in that component; under parallel modes the two overlap)."""
    t = t[t.kind.isin(EVAL_KINDS) == evaluator]
    if not len(t):
        return 0.0
    program, _ = pd.factorize(t.program_id)  # programs numbered in order of appearance
    sent, finish = t.sent_s.to_numpy(float), t.finish_s.to_numpy(float)
    order = np.lexsort((finish, sent, program))  # by program, then (sent, finish)
    program, sent, finish = program[order], sent[order], finish[order]
    # each interval adds what it reaches past the latest end of its program's earlier ones
    end = pd.Series(finish).groupby(program).cummax().to_numpy()
    first = np.r_[True, program[1:] != program[:-1]]
    before = np.where(first, -np.inf, np.r_[-np.inf, end[:-1]])
    gained = np.maximum(0.0, finish - np.maximum(sent, before))
    starts = np.flatnonzero(first).tolist() + [len(gained)]
    # summed in order, interval by interval (cumsum adds sequentially)
    spans = [np.cumsum(gained[a:b])[-1] for a, b in zip(starts, starts[1:])]
    return float(np.mean(spans))


def _acceptance(v: pd.DataFrame) -> float:
    return float(v.accepted_tokens.sum() / max(1, v.drafted_tokens.sum()))


def tot_summary(t: pd.DataFrame, busy_s: dict, makespan_s: float) -> dict:
    """Acceptance (thoughts', evaluations'), tokens per round, verify queue waits, the time
    each component takes and pool busy fractions."""
    v = t[t.kind == "verify"]
    ev = t[t.kind == "eval-verify"]
    states = (t.kind == "eval") | ((t.kind == "eval-verify") & (t["round"] == 0))
    return tot_figures(
        int(len(t)), int(states.sum()), (component_s(t, False), component_s(t, True)),
        _acceptance(ev) if len(ev) else None,
        (_acceptance(v), float(v.output_tokens.mean()), queue_waits_s(t)) if len(v) else None,
        busy_s, makespan_s)


def tot_figures(requests: int, thoughts: int, component_mean_s: tuple[float, float],
                eval_acceptance: float | None, verify: tuple | None, busy_s: dict,
                makespan_s: float) -> dict:
    """`tot_summary`'s dict from its figures (a table's, or folded ones:
    `sim.families.seed.folded`): `verify` (acceptance, tokens per round, queue waits s) where
    any verification ran, `eval_acceptance` where any evaluation was verified."""
    out = {"tot_requests": requests, "tot_thoughts": thoughts,
           "generator_mean_s": component_mean_s[0], "evaluator_mean_s": component_mean_s[1]}
    if eval_acceptance is not None:
        out["eval_acceptance_rate"] = eval_acceptance
    if verify is not None:
        acceptance, per_round, waits = verify
        out.update(acceptance_rate=acceptance, tokens_per_round=per_round,
                   verify_queue_wait_p50_s=float(np.median(waits)) if len(waits) else 0.0,
                   verify_queue_wait_p90_s=float(np.quantile(waits, 0.9)) if len(waits) else 0.0)
    for pool, s in busy_s.items():
        out[f"{pool}_busy_fraction"] = float(s / makespan_s) if makespan_s > 0 else 0.0
    return out

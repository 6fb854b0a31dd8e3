"""Dynasor's fine-grained allocation variants (its Table 4) on a branches trace: how many
tokens each saves against the cap at the cap's accuracy, chosen on one half of the questions and
reported on the other.

- static threshold: certaindex read once, at the `detect`-th solution (detect@knob);
- initial-step curve fit: a Pareto frontier read once on the first `detect` solutions' signal,
  which then sets how many solutions the program may use;
- k-step threshold: certaindex read where a checkpoint crosses a multiple of `every` solutions;
- single-step threshold: certaindex read at every checkpoint;
- dynamic curve fit: a frontier read at every checkpoint.

Self-consistency runs one path a round here, so every solution is a checkpoint, as MCTS's
iterations are (the paper runs SC in batches to read certaindex this often, which costs latency
the token counts do not show).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from policies.search import SearchBudget, certaindex_for
from programs.traced import load_search
from sim.families.dynasor.search import (calibrate_threshold, evaluate, fit_frontier,
                                         split_questions, with_frontier)

THRESHOLDS = tuple(round(float(x), 2) for x in np.arange(0.05, 1.0, 0.05))


def variants(bank, calibration, detect: int, every: int) -> list[tuple[str, SearchBudget | None]]:
    """Each variant's policy, its threshold or frontier chosen on `calibration` questions
    (None where no candidate keeps the cap's accuracy there)."""
    per_round = 1 if bank.method == "sc" else 0

    def threshold(**cadence) -> SearchBudget | None:
        t = calibrate_threshold(bank, "entropy", THRESHOLDS, calibration, per_round=per_round,
                                **cadence)["threshold"]
        if t is None:
            return None
        return SearchBudget(bank.cap, certaindex_for(bank.method, entropy_threshold=t),
                            per_round=per_round, **cadence)

    def frontier(d: int | None) -> SearchBudget | None:
        f = fit_frontier(bank, "entropy", THRESHOLDS, calibration, per_round, d)
        return None if f is None else with_frontier(bank, f, per_round, d)

    return [("baseline (cap)", SearchBudget(bank.cap, per_round=per_round)),
            ("static threshold", threshold(detect=detect)),
            ("initial-step curve fit", frontier(detect)),
            (f"{every}-step threshold", threshold(every=every)),
            ("single-step threshold", threshold()),
            ("dynamic curve fit", frontier(None))]


def allocation_table(trace_dir: str | Path, method: str, cap: int, detect: int, every: int,
                     split_seed: int = 0) -> dict:
    """Each variant's held-out tokens, accuracy and token savings against the cap."""
    bank = load_search(trace_dir, method, cap)
    calibration, held = split_questions(bank, split_seed)
    rows = []
    for name, policy in variants(bank, calibration, detect, every):
        row = {"variant": name, "policy": None if policy is None else policy.name}
        if policy is not None:
            row |= evaluate(bank, policy, held)
        rows.append(row)
    base = rows[0]["tokens_mean"]
    for r in rows:
        r["token_savings"] = None if "tokens_mean" not in r else 1 - r["tokens_mean"] / base
    return {"trace": str(trace_dir), "method": method, "cap": cap, "detect": detect,
            "every": every, "calibration_questions": len(calibration),
            "held_out_questions": len(held), "rows": rows}

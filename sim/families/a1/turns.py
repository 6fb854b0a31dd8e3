"""A1 per turn (A1 Fig 9): target take-overs, rejection rate and the draft steps' perplexity
under the target at each turn of the paths, counterfactually on a conformity trace.

A1's Fig 9 plots the perplexity of the draft's and the target's text as turns go on; a
conformity trace scores the draft's steps only (the target's own steps carry no score), so the
perplexity here is the draft step's under the target, exp(mean NLL) over the turn's scored steps.
"""

from __future__ import annotations

import math
from collections import defaultdict

from sim.families.a1.offline import Trace, walk


def per_turn(trace: Trace, policy, samples: int) -> list[dict]:
    """One row per turn: scored steps, take-overs, rejection rate, draft-step perplexity."""
    if not 1 <= samples <= trace.samples:
        raise ValueError(f"samples must be in 1..{trace.samples} (the trace's), got {samples}")
    scores, rejected = defaultdict(list), defaultdict(int)
    for pid in sorted(trace.questions):
        for k in range(samples):
            for turn, score, accepted in walk(trace, pid, k, policy).trail:
                scores[turn].append(score)
                rejected[turn] += not accepted
    rows = []
    for turn in sorted(scores):
        # an empty draft step scores inf: counted as scored, left out of the perplexity
        finite = [s for s in scores[turn] if math.isfinite(s)]
        n = len(scores[turn])
        rows.append({"policy": policy.name, "samples": samples, "turn": turn, "scored": n,
                     "takeovers": rejected[turn], "rejection_rate": rejected[turn] / n,
                     "draft_step_ppl": (math.exp(sum(finite) / len(finite)) if finite
                                        else None)})
    return rows


def plot_turns(rows: list[dict], path) -> None:
    """Take-overs and draft-step perplexity against the turn, one line per policy."""
    from sim.report import pyplot, save_figure

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.8))
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        turns = [r["turn"] + 1 for r in mine]
        ax.plot(turns, [r["draft_step_ppl"] for r in mine], marker="o", ms=3, label=name)
        bx.plot(turns, [r["takeovers"] for r in mine], marker="o", ms=3, label=name)
    # late turns hold few scored steps: one wild step there would flatten the rest linearly
    ax.set(xlabel="turn", ylabel="draft step perplexity (under the target)", yscale="log",
           title="draft steps' perplexity by turn")
    bx.set(xlabel="turn", ylabel="target take-overs", title="take-overs by turn")
    bx.legend(fontsize=7)
    save_figure(fig, path)

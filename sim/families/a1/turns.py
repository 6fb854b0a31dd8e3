"""A1 per turn (A1 Fig 9): target take-overs, rejection rate and perplexities under the target
at each turn of the paths, counterfactually on a conformity trace.

A1's Fig 9(a) plots the perplexity of the draft's and the target's steps as turns go on. Here
each is exp(mean NLL under the target) over the turn's steps: the draft's scored steps, the
target's own steps where it took over, and the steps the paths carry (accepted drafts and
take-overs), the text whose perplexity the take-overs keep down.
"""

from __future__ import annotations

import math
from collections import defaultdict

from sim.families.a1.offline import Trace, walk


def _ppl(scores: list) -> float | None:
    # an empty step (draft: inf, target: None) counts as a step but has no perplexity
    finite = [s for s in scores if s is not None and math.isfinite(s)]
    return math.exp(sum(finite) / len(finite)) if finite else None


def per_turn(trace: Trace, policy, samples: int) -> list[dict]:
    """One row per turn: scored steps, take-overs, rejection rate, the draft's, the target's
    and the paths' step perplexity."""
    if not 1 <= samples <= trace.samples:
        raise ValueError(f"samples must be in 1..{trace.samples} (the trace's), got {samples}")
    drafts, owns, carried = defaultdict(list), defaultdict(list), defaultdict(list)
    for pid in sorted(trace.questions):
        for k in range(samples):
            for turn, score, accepted, own in walk(trace, pid, k, policy).trail:
                drafts[turn].append(score)
                if not accepted:
                    owns[turn].append(own)
                carried[turn].append(score if accepted else own)
    rows = []
    for turn in sorted(drafts):
        n, takeovers = len(drafts[turn]), len(owns[turn])
        rows.append({"policy": policy.name, "samples": samples, "turn": turn, "scored": n,
                     "takeovers": takeovers, "rejection_rate": takeovers / n,
                     "draft_step_ppl": _ppl(drafts[turn]),
                     "target_step_ppl": _ppl(owns[turn]),
                     "path_step_ppl": _ppl(carried[turn])})
    return rows


def plot_turns(rows: list[dict], path) -> None:
    """Perplexities and take-overs against the turn, one colour per policy."""
    from sim.report import pyplot, save_figure

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for i, name in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        mine = [r for r in rows if r["policy"] == name]
        turns = [r["turn"] + 1 for r in mine]
        colour = f"C{i % 10}"
        ax.plot(turns, [r["draft_step_ppl"] for r in mine], marker="o", ms=3, color=colour,
                label=f"{name}: draft steps")
        ax.plot(turns, [r["path_step_ppl"] for r in mine], ls="--", color=colour,
                label=f"{name}: the path's steps")
        ax.plot(turns, [r["target_step_ppl"] for r in mine], ls=":", marker="x", ms=3,
                color=colour, label=f"{name}: target's take-overs")
        bx.plot(turns, [r["takeovers"] for r in mine], marker="o", ms=3, color=colour,
                label=name)
    # late turns hold few steps and the target's own are near 1: a log axis shows them all
    ax.set(xlabel="turn", ylabel="step perplexity under the target", yscale="log",
           title="perplexity by turn")
    ax.legend(fontsize=6)
    bx.set(xlabel="turn", ylabel="target take-overs", title="take-overs by turn")
    bx.legend(fontsize=7)
    save_figure(fig, path)

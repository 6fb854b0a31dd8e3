"""Traced chain-of-thought trajectories and counterfactual early stopping on them (offline).

A probes trace holds, per question x sample, the probe answers after every `stride` tokens and
the trajectory's own end. Because the tracer never stops early, any probe-consistency policy
(window w, interval k a multiple of the stride) or fixed token budget can be replayed on it:
this module computes, per trajectory, where each would stop, what it would answer and what it
would spend, and the tokens-to-accuracy curves of a set of policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.certaindex import Probe, ProbeConsistency
from programs.traced import Trajectory


@dataclass(frozen=True)
class Outcome:
    """What one policy does to one trajectory."""

    reasoning_tokens: int
    probe_tokens: int
    answer: str | None
    correct: bool
    stopped_early: bool


def certaindex_outcome(traj: Trajectory, policy: ProbeConsistency, stride: int) -> Outcome:
    """Run probe consistency over the probes the policy would have sent (every k tokens)."""
    if policy.every_tokens % stride:
        raise ValueError(f"probe interval {policy.every_tokens} is not a multiple of the traced "
                         f"stride {stride}")
    seen: list[Probe] = []
    spent = 0
    for probe, n in zip(traj.probes, traj.probe_tokens):
        if probe.position_tokens >= traj.reasoning_tokens:
            break  # the reasoning ended here: no probe needed, its own answer stands
        if probe.position_tokens % policy.every_tokens:
            continue
        seen.append(probe)
        spent += n
        if policy.should_stop(seen):
            return Outcome(probe.position_tokens, spent, probe.answer,
                           probe.answer == traj.gold_answer, True)
    return Outcome(traj.reasoning_tokens, spent, traj.final_answer,
                   traj.final_answer == traj.gold_answer, False)


def budget_outcome(traj: Trajectory, budget_tokens: int) -> Outcome:
    """Stop at a fixed token budget and probe once for the answer (the even-budget baseline)."""
    if traj.reasoning_tokens <= budget_tokens:
        return Outcome(traj.reasoning_tokens, 0, traj.final_answer,
                       traj.final_answer == traj.gold_answer, False)
    at = [i for i, p in enumerate(traj.probes) if p.position_tokens <= budget_tokens]
    if not at:
        return Outcome(budget_tokens, 0, None, False, True)
    probe = traj.probes[at[-1]]
    return Outcome(probe.position_tokens, traj.probe_tokens[at[-1]], probe.answer,
                   probe.answer == traj.gold_answer, True)


def summarize(outcomes: list[Outcome]) -> dict:
    """Mean tokens (reasoning, probe, total), accuracy and early-stop share of a policy."""
    reasoning = np.array([o.reasoning_tokens for o in outcomes], dtype=float)
    probe = np.array([o.probe_tokens for o in outcomes], dtype=float)
    return {"trajectories": len(outcomes), "accuracy": float(np.mean([o.correct for o in outcomes])),
            "reasoning_tokens_mean": float(reasoning.mean()),
            "probe_tokens_mean": float(probe.mean()),
            "tokens_mean": float((reasoning + probe).mean()),
            "stopped_early_share": float(np.mean([o.stopped_early for o in outcomes]))}


def tokens_to_accuracy(trajs: list[Trajectory], stride: int, windows: list[int],
                       intervals: list[int], budgets: list[int]) -> list[dict]:
    """One row per policy: certaindex (window x interval) and fixed budgets."""
    rows = []
    for every in intervals:
        for window in windows:
            policy = ProbeConsistency(window=window, every_tokens=every)
            rows.append({"policy": "certaindex", "window": window, "interval_tokens": every,
                         "budget_tokens": None} |
                        summarize([certaindex_outcome(t, policy, stride) for t in trajs]))
    for budget in budgets:
        rows.append({"policy": "budget", "window": None, "interval_tokens": None,
                     "budget_tokens": budget} |
                    summarize([budget_outcome(t, budget) for t in trajs]))
    return rows


def plot_tokens_to_accuracy(rows: list[dict], path: str | Path) -> Path:
    """Accuracy against mean tokens per trajectory: one line per probe interval, one for budgets."""
    from sim.report import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    budget = sorted((r for r in rows if r["policy"] == "budget"), key=lambda r: r["tokens_mean"])
    ax.plot([r["tokens_mean"] for r in budget], [r["accuracy"] for r in budget], "o-",
            color="gray", label="fixed budget (baseline-even)")
    for every in sorted({r["interval_tokens"] for r in rows if r["policy"] == "certaindex"}):
        pts = sorted((r for r in rows if r["interval_tokens"] == every),
                     key=lambda r: r["tokens_mean"])
        ax.plot([r["tokens_mean"] for r in pts], [r["accuracy"] for r in pts], "s-",
                label=f"certaindex, probe every {every} tokens (w = "
                      f"{min(r['window'] for r in pts)}..{max(r['window'] for r in pts)})")
    ax.set_xlabel("tokens per trajectory (reasoning + probes), mean")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)

"""Certaindex against the compute a query still needs (Dynasor's Figs 5, 12-14 and B.3): at a
detection point, each query's certaindex beside the oracle's remaining tokens to its correct,
stable answer, their Pearson and Kendall correlations on solvable queries, and the same for the
other signals the paper compares (output length, mean normalised log-probability, their linear
combination).

- **Self-consistency** (a branches trace's SC programs): after the first `k` samples,
  certaindex is the answer-entropy measure `1 - H/log k`; the oracle is the first sample count
  from which the majority vote is correct through the trace's cap, and the remaining compute
  the output tokens of the samples until then. A query whose vote at the cap is wrong is
  unsolvable (at this cap).
- **MCTS and Rebase** (a branches trace's search programs): after the checkpoint (an MCTS
  iteration, a Rebase level) that brings the `k`-th solution, certaindex is the reward
  model's score aggregated over the solutions so far (mean for MCTS, max for Rebase, as the
  policies read it); the oracle is the first checkpoint from which the program's answer is
  correct through the trace's cap, and the remaining compute the output tokens until then.
- **Chain of thought with probes** (a probes trace): at `d` reasoning tokens, certaindex is the
  answer-entropy measure over the last `window` probe answers; the oracle is the first probe
  position from which the probed answer is correct through the trajectory's end, and the
  remaining compute the reasoning tokens until then. A trajectory whose last probe is wrong is
  unsolvable.

Higher certaindex should mean fewer tokens left: the expected correlation is negative (the paper
reports magnitudes).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from policies.certaindex import answer_certainty, reward_certainty
from policies.search import REWARD_AGGREGATE, majority_vote, program_answer
from programs.traced import checkpoint_groups

SIGNALS = ("certaindex", "output_tokens_mean", "logprob_mean")
"""the signals the paper compares (Fig 13): certaindex, mean output length, mean normalised
log-probability"""


def _stable_from(correct: list[bool]) -> int | None:
    """The first index from which every entry is True (None: the last is False)."""
    if not correct or not correct[-1]:
        return None
    i = len(correct)
    while i > 0 and correct[i - 1]:
        i -= 1
    return i


def sc_points(bank, detect_samples: int) -> list[dict]:
    """One row per SC question of a branches trace at `detect_samples` samples."""
    rows = []
    for q in bank.questions:
        reqs = q.requests
        if len(reqs) <= detect_samples:
            continue
        answers = [r.answer for r in reqs]
        votes = [majority_vote(answers[:n]) == q.gold_answer for n in range(1, len(reqs) + 1)]
        stable = _stable_from(votes)  # index n-1 of the first stable vote
        seen = reqs[:detect_samples]
        left = None if stable is None else sum(
            r.output_tokens for r in reqs[detect_samples:max(stable + 1, detect_samples)])
        rows.append({"query": q.question_id, "detect": detect_samples,
                     "certaindex": answer_certainty(answers[:detect_samples]),
                     "output_tokens_mean": float(np.mean([r.output_tokens for r in seen])),
                     "logprob_mean": float(np.mean([math.log(r.reward) for r in seen])),
                     "solvable": stable is not None, "remaining_tokens": left})
    return rows


def search_points(bank, detect_solutions: int) -> list[dict]:
    """One row per MCTS or Rebase question of a branches trace still searching after the
    checkpoint that brings its `detect_solutions`-th solution."""
    rows = []
    for q in bank.questions:
        groups = checkpoint_groups(q, bank.method, bank.cap)
        solved, correct, spent, at, signals = [], [], [], None, None
        for k, group in enumerate(groups):
            spent.append((spent[-1] if spent else 0) + sum(r.output_tokens for r in group))
            solved = sorted(solved + [(r.index, r.answer, r.reward) for r in group if r.is_leaf])
            answers, rewards = [a for _, a, _ in solved], [w for _, _, w in solved]
            correct.append(bool(solved) and
                           program_answer(bank.method, answers, rewards) == q.gold_answer)
            if at is None and len(solved) >= detect_solutions:
                at, seen = k, [r for g in groups[:k + 1] for r in g]
                signals = (reward_certainty(rewards, REWARD_AGGREGATE[bank.method]),
                           float(np.mean([r.output_tokens for r in seen])),
                           float(np.mean([math.log(w) for w in rewards])))
        if at is None or at == len(groups) - 1:
            continue
        stable = _stable_from(correct)
        left = None if stable is None else spent[max(stable, at)] - spent[at]
        rows.append({"query": q.question_id, "detect": detect_solutions,
                     "certaindex": signals[0], "output_tokens_mean": signals[1],
                     "logprob_mean": signals[2], "solvable": stable is not None,
                     "remaining_tokens": left})
    return rows


def cot_points(trajs: list, detect_tokens: int, window: int) -> list[dict]:
    """One row per trajectory of a probes trace still reasoning at `detect_tokens`."""
    rows = []
    for t in trajs:
        seen = [p for p in t.probes if p.position_tokens <= detect_tokens]
        if not seen or t.reasoning_tokens <= detect_tokens:
            continue
        correct = [p.answer == t.gold_answer for p in t.probes]
        stable = _stable_from(correct)
        left = None if stable is None else max(
            0, t.probes[stable].position_tokens - detect_tokens)
        rows.append({"query": f"{t.question_id}/{t.sample_id}", "detect": detect_tokens,
                     "certaindex": answer_certainty([p.answer for p in seen[-window:]]),
                     "output_tokens_mean": float(detect_tokens), "logprob_mean": math.nan,
                     "solvable": stable is not None, "remaining_tokens": left})
    return rows


def correlations(rows: list[dict]) -> dict:
    """Per signal, Pearson r and Kendall tau against remaining tokens on solvable queries (and
    the least-squares combination of the signals that vary), with the query counts (and how
    many solvable ones still needed tokens: the correlation rests on those)."""
    from scipy import stats

    solvable = [r for r in rows if r["solvable"]]
    out = {"queries": len(rows), "solvable": len(solvable),
           "solvable_needing_tokens": sum(r["remaining_tokens"] > 0 for r in solvable),
           "certaindex_mean_solvable": _mean(r["certaindex"] for r in solvable),
           "certaindex_mean_unsolvable": _mean(r["certaindex"] for r in rows
                                               if not r["solvable"]), "signals": {}}
    y = np.array([r["remaining_tokens"] for r in solvable], float)
    usable = [s for s in SIGNALS if len(solvable) > 2 and np.isfinite(
        [r[s] for r in solvable]).all() and np.ptp([r[s] for r in solvable]) > 0]
    columns = {s: np.array([r[s] for r in solvable], float) for s in usable}
    if len(usable) > 1:  # fitted in sample, as the paper's combinations are
        x = np.column_stack([columns[s] for s in usable] + [np.ones(len(y))])
        columns["linear_combination"] = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    for name, x in columns.items():
        if np.ptp(y) == 0:
            break
        out["signals"][name] = {"pearson": float(stats.pearsonr(x, y)[0]),
                                "kendall": float(stats.kendalltau(x, y)[0])}
    return out


def _mean(values) -> float | None:
    v = list(values)
    return float(np.mean(v)) if v else None


def plot_correlation(rows: list[dict], path: str | Path, title: str) -> Path:
    """Certaindex against remaining tokens per detection point, solvable queries (and the
    unsolvable ones at the top edge)."""
    from sim.report import pyplot, save_figure

    plt = pyplot()
    points = sorted({r["detect"] for r in rows})
    fig, axes = plt.subplots(1, len(points), figsize=(3.4 * len(points), 3.2), squeeze=False)
    top = max([r["remaining_tokens"] for r in rows if r["solvable"]] or [1])
    for ax, d in zip(axes[0], points):
        at = [r for r in rows if r["detect"] == d]
        ok = [r for r in at if r["solvable"]]
        ax.scatter([r["certaindex"] for r in ok], [r["remaining_tokens"] for r in ok], s=12,
                   label="solvable")
        ax.scatter([r["certaindex"] for r in at if not r["solvable"]],
                   [top * 1.1] * (len(at) - len(ok)), s=12, marker="x", c="grey",
                   label="unsolvable")
        ax.set_title(f"detect at {d}", fontsize=9)
        ax.set_xlabel("certaindex")
    axes[0][0].set_ylabel("remaining tokens (oracle)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)

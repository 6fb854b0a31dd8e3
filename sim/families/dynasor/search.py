"""Traced SC/MCTS/Rebase programs offline: counterfactual stops, threshold calibration, frontiers.

A branches trace (`reasonsim trace branches`) holds every request of every program run to its
cap. A program's requests fall into checkpoint groups (an SC round, an MCTS iteration, a Rebase
level); a stop policy (`policies.search.SearchBudget`) decides after each group. Because the
trace never stops early, any cap at most the traced one (SC samples, MCTS iterations) or equal to
it (Rebase width) and any stop rule can be replayed on it: offline (tokens to accuracy,
threshold calibration, Pareto-frontier fitting). The simulator runs the programs themselves
(`programs.search`, outcomes from this trace: `sim.workloads.program_driver.TracedSearch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.search import (REWARD_AGGREGATE, ParetoFrontier, SearchBudget, certaindex_for,
                             program_answer)
from programs.traced import SearchBank, SearchQuestion, checkpoint_groups, load_search, traced_caps


# ------------------------------------------------------------------ offline replay
@dataclass(frozen=True)
class SearchOutcome:
    """What one stop policy does to one traced program."""

    tokens: int
    requests: int
    solutions: int
    answer: str | None
    correct: bool


def checkpoint(policy: SearchBudget, solved: list, before: int) -> tuple[bool, list, list]:
    """After a group: (stop now?, answers, rewards), solutions in request order (sorted here)."""
    solved.sort()
    answers = [a for _, a, _, _ in solved]
    rewards = [w for _, _, w, _ in solved]
    return len(solved) > before and policy.should_stop(
        answers, rewards, before, [n for _, _, _, n in solved]), answers, rewards


def search_outcome(q: SearchQuestion, method: str, policy: SearchBudget) -> SearchOutcome:
    """Replay a stop policy over a traced program's checkpoints."""
    answers, rewards, solved = [], [], []
    tokens = requests = 0
    for group in checkpoint_groups(q, method, policy.cap, policy.per_round):
        before = len(solved)
        for r in group:
            tokens += r.output_tokens
            requests += 1
            if r.is_leaf:
                solved.append((r.index, r.answer, r.reward, r.output_tokens))
        stop, answers, rewards = checkpoint(policy, solved, before)
        if stop:
            break
    answer = program_answer(method, answers, rewards)
    return SearchOutcome(tokens, requests, len(solved), answer, answer == q.gold_answer)


def outcome_summary(outcomes: list[SearchOutcome]) -> dict:
    """Mean tokens, requests and solutions, and accuracy of a policy over programs."""
    return {"programs": len(outcomes),
            "accuracy": float(np.mean([o.correct for o in outcomes])),
            "tokens_mean": float(np.mean([o.tokens for o in outcomes])),
            "requests_mean": float(np.mean([o.requests for o in outcomes])),
            "solutions_mean": float(np.mean([o.solutions for o in outcomes]))}


def evaluate(bank: SearchBank, policy: SearchBudget, questions=None) -> dict:
    """A policy's summary over the bank's programs (or a subset of questions)."""
    qs = bank.questions if questions is None else questions
    return outcome_summary([search_outcome(q, bank.method, policy) for q in qs])


def split_questions(bank: SearchBank, seed: int = 0, calibration_share: float = 0.5):
    """A seeded calibration / held-out split of the bank's questions, stratified by difficulty."""
    rng = np.random.default_rng(seed)
    calib, held = [], []
    for level in sorted({q.difficulty or 0 for q in bank.questions}):
        qs = [q for q in bank.questions if (q.difficulty or 0) == level]
        order = rng.permutation(len(qs))
        k = int(round(len(qs) * calibration_share))
        calib += [qs[i] for i in order[:k]]
        held += [qs[i] for i in order[k:]]
    return calib, held


def calibrate_threshold(bank: SearchBank, signal: str, thresholds, calibration,
                        detect: int | None = None, per_round: int = 0, every: int = 0) -> dict:
    """Profiler-guided calibration: the most aggressive threshold losing no calibration accuracy.

    Candidates are tried from the most aggressive (lowest) up; the first whose accuracy on the
    calibration questions is at least the cap's (baseline-even) wins. None if no candidate does.
    """
    base = evaluate(bank, SearchBudget(bank.cap, per_round=per_round), calibration)
    tried = []
    for t in sorted(thresholds):
        cx = certaindex_for(bank.method, **{f"{signal}_threshold": t})
        s = evaluate(bank, SearchBudget(bank.cap, cx, detect, per_round=per_round, every=every),
                     calibration)
        tried.append({"threshold": t} | s)
        if s["accuracy"] >= base["accuracy"]:
            return {"threshold": t, "calibration": s, "baseline": base, "tried": tried}
    return {"threshold": None, "calibration": None, "baseline": base, "tried": tried}


def fit_frontier(bank: SearchBank, signal: str, thresholds, calibration,
                 per_round: int = 0, detect: int | None = None) -> ParetoFrontier | None:
    """A Pareto-frontier curve fitted on calibration questions: certaindex -> solutions allowed.

    Greedy skyline: for each solution count n from the fewest up, add the rule (lowest
    threshold t, n) that keeps calibration accuracy at the cap's and lowers tokens, given the
    rules so far. A high certaindex may stop a program early; a low one lets it run longer.
    With `detect`, the frontier reads the first `detect` solutions' signal only (initial-step
    curve fitting).
    """
    base = evaluate(bank, SearchBudget(bank.cap, per_round=per_round), calibration)
    rules: list[tuple[float, int]] = []
    best_tokens = base["tokens_mean"]
    start = 2 if signal == "entropy" else 1
    for n in range(start, bank.cap):
        for t in sorted(thresholds):
            if rules and t >= rules[-1][0]:
                break  # a rule at n allowing only what an earlier rule allows adds nothing
            cand = ParetoFrontier(tuple(rules + [(float(t), n)]), signal)
            s = evaluate(bank, with_frontier(bank, cand, per_round, detect), calibration)
            if s["accuracy"] >= base["accuracy"] and s["tokens_mean"] < best_tokens:
                rules.append((float(t), n))
                best_tokens = s["tokens_mean"]
                break
    return ParetoFrontier(tuple(rules), signal) if rules else None


def with_frontier(bank: SearchBank, frontier: ParetoFrontier, per_round: int,
                  detect: int | None = None) -> SearchBudget:
    """The bank's cap with a frontier (read once at `detect` where given)."""
    return SearchBudget(bank.cap, frontier=frontier, reward_aggregate=REWARD_AGGREGATE[bank.method],
                        per_round=per_round, detect=detect)


# ------------------------------------------------------------------ offline experiments
LENGTH_QUANTILES = (0.25, 0.5, 0.75)
"""baseline-length's thresholds: these quantiles of the bank's solving requests' lengths"""
LENGTH_DETECT = 2
"""baseline-length decides at the second solution (the first round of two SC paths)"""


def search_tokens_to_accuracy(trace_dir: str | Path, thresholds=(0.2, 0.4, 0.6, 0.8, 0.95),
                              sc_per_round: int = 2) -> list[dict]:
    """Rows per method: baseline-even over caps, certaindex (answer entropy) over thresholds,
    baseline-length (the solving requests' mean length at the second solution) over
    quantiles of their lengths."""
    rows = []
    for method, caps in traced_caps(trace_dir).items():
        top = max(caps)
        per_round = sc_per_round if method == "sc" else 0
        even_caps = caps if method == "rebase" else sorted({c for c in (1, 2, 4, 8, 16, top)
                                                            if c <= top})
        for cap in even_caps:
            bank = load_search(trace_dir, method, cap)
            rows.append({"method": method, "policy": "even", "cap": cap, "threshold": None}
                        | evaluate(bank, SearchBudget(cap)))
        for cap in caps if method == "rebase" else [top]:
            bank = load_search(trace_dir, method, cap)
            for t in thresholds:
                pol = SearchBudget(cap, certaindex_for(method, entropy_threshold=t),
                                   per_round=per_round)
                rows.append({"method": method, "policy": "certaindex", "cap": cap,
                             "threshold": t} | evaluate(bank, pol))
            lengths = [r.output_tokens for q in bank.questions for r in q.requests if r.is_leaf]
            for t in sorted({float(np.quantile(lengths, x)) for x in LENGTH_QUANTILES}):
                pol = SearchBudget(cap, detect=LENGTH_DETECT, per_round=per_round,
                                   length_tokens=t)
                rows.append({"method": method, "policy": "length", "cap": cap,
                             "threshold": t} | evaluate(bank, pol))
    return rows


def plot_search_curves(rows: list[dict], path: str | Path) -> Path:
    """Accuracy against tokens per program, one panel per method."""
    from sim.report import pyplot, save_figure

    plt = pyplot()

    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.6), squeeze=False)
    for ax, method in zip(axes[0], methods):
        even = sorted((r for r in rows if r["method"] == method and r["policy"] == "even"),
                      key=lambda r: r["tokens_mean"])
        ax.plot([r["tokens_mean"] for r in even], [r["accuracy"] for r in even], "o-",
                color="gray", label="baseline-even (cap)")
        for policy, marker, label in (("certaindex", "s-", "certaindex 1-H/log n"),
                                      ("length", "^--", "baseline-length")):
            for cap in sorted({r["cap"] for r in rows if r["method"] == method and
                               r["policy"] == policy}):
                pts = sorted((r for r in rows if r["method"] == method and r["cap"] == cap and
                              r["policy"] == policy), key=lambda r: r["tokens_mean"])
                ax.plot([r["tokens_mean"] for r in pts], [r["accuracy"] for r in pts], marker,
                        label=f"{label}, cap {cap}")
        ax.set_title(method)
        ax.set_xscale("log")
        ax.set_xlabel("tokens per program, mean")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("accuracy")
    fig.tight_layout()
    return save_figure(fig, path)


def calibrate(trace_dir: str | Path, method: str, cap: int, signal: str = "entropy",
              thresholds=None, detect: int | None = None, per_round: int = 0,
              split_seed: int = 0) -> dict:
    """Profiler-guided threshold and Pareto-frontier calibration, reported on held-out questions.

    The calibration split chooses the most aggressive threshold (and fits a frontier) that keeps
    the cap's accuracy; both are then evaluated on the held-out split against baseline-even.
    """
    bank = load_search(trace_dir, method, cap)
    if thresholds is None:
        thresholds = [round(float(x), 2) for x in np.arange(0.05, 1.0, 0.05)] \
            if signal == "entropy" \
            else sorted({round(r.reward, 3) for q in bank.questions for r in q.requests
                         if r.is_leaf})
    calib, held = split_questions(bank, split_seed)
    chosen = calibrate_threshold(bank, signal, thresholds, calib, detect, per_round)
    frontier = fit_frontier(bank, signal, thresholds, calib, per_round)
    agg = REWARD_AGGREGATE[method]
    out = {"method": method, "cap": cap, "signal": signal, "detect": detect,
           "per_round": per_round, "calibration_questions": len(calib),
           "held_out_questions": len(held), "threshold": chosen["threshold"],
           "calibration": {"baseline_even": chosen["baseline"], "threshold": chosen["calibration"]},
           "frontier_rules": None if frontier is None else [list(r) for r in frontier.rules]}
    held_rows = {"baseline_even": evaluate(bank, SearchBudget(cap, per_round=per_round), held)}
    if chosen["threshold"] is not None:
        cx = certaindex_for(method, **{f"{signal}_threshold": chosen["threshold"]})
        held_rows["threshold"] = evaluate(bank, SearchBudget(cap, cx, detect, per_round=per_round,
                                                             reward_aggregate=agg), held)
    if frontier is not None:
        held_rows["frontier"] = evaluate(bank, with_frontier(bank, frontier, per_round), held)
        out["calibration"]["frontier"] = evaluate(bank, with_frontier(bank, frontier, per_round),
                                                  calib)
    out["held_out"] = held_rows
    return out

"""A1 counterfactually on a conformity trace (`a1 offline`): rejection rate vs alpha, accuracy,
tokens by model, per policy, coverage and sample count.

A conformity trace is a path tree per evaluated sample (`live.conformity`): a node is
(program, sample, decision string). A policy's path is walked from the root: at each node the
policy decides from the node's score (p-values recomputed from the trace's calibration rows),
and the path goes on to the child its decision names, or ends where the chosen step ends it. The
tracer ran every grid policy, so their paths are complete; a policy off the grid (another alpha,
a smaller calibration set) may leave the tree, which is counted (`uncovered`), never guessed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from policies.a1 import COVERAGES, Conformal, DraftOnly, TargetOnly, Threshold, calibration_sets
from policies.search import majority_vote
from traces.store import read_run, read_table


@dataclass
class Trace:
    """A conformity trace indexed for walking paths."""

    nodes: dict
    """(program_id, sample, path) -> row"""
    questions: dict
    """evaluation program_id -> (question_id, gold answer, difficulty, family)"""
    samples: int
    turns: int
    alphas: tuple
    calibration: list
    """calibration rows: (question_split, question_id, sample, score)"""
    draft_tokens: int = 0
    """Kd of the evaluated (sampled) steps"""
    calib_draft_tokens: int = 0
    """Kd of the calibration steps (another than draft_tokens: the A1 Fig 6 mismatch)"""
    thresholds: tuple = ()
    """fixed-threshold baselines the tracer ran (their paths all traced)"""


def load_trace(trace_dir: str | Path) -> Trace:
    """Read a conformity trace: the evaluation tree and the calibration scores."""
    import json

    run = read_run(trace_dir)
    if run["kind"] != "conformity":
        raise ValueError(f"{trace_dir}: a {run['kind']} trace, not a conformity trace "
                         "(reasonsim trace conformity)")
    wl = json.loads(run["params_json"])["workload"]
    rows = read_table(trace_dir, "conformity").to_pylist()
    nodes, questions, calibration = {}, {}, []
    for r in rows:
        if r["program_id"].endswith("cal"):
            if r["score"] is not None:
                calibration.append((r["question_split"], r["question_id"], r["sample"],
                                    r["score"]))
            continue
        nodes[(r["program_id"], r["sample"], r["path"])] = r
        questions[r["program_id"]] = (r["question_id"], r["gold_answer"], r["difficulty"],
                                      r["family"])
    if not questions:
        raise ValueError(f"{trace_dir}: no evaluation programs (program ids ending 'eva') in "
                         "its conformity table")
    kd = int(wl["settings"]["draft_tokens"])
    return Trace(nodes, questions, int(wl["samples"]), int(wl["settings"]["turns"]),
                 tuple(wl["alphas"]), calibration, kd, int(wl.get("calib_draft_tokens") or kd),
                 tuple(wl.get("thresholds", ())))


def calibrated(trace: Trace, policy, calib_samples: int | None = None):
    """The policy with the trace's calibration sets (the first `calib_samples` samples of each
    question, all when None)."""
    if not isinstance(policy, Conformal):
        return policy
    return policy.calibrated(*calibration_sets(
        (split, q, score) for split, q, sample, score in trace.calibration
        if calib_samples is None or sample < calib_samples))


@dataclass
class PathResult:
    """One policy's walk down one sample's tree."""

    answer: str | None = None
    steps: int = 0
    scored: int = 0
    rejected: int = 0
    draft_tokens: int = 0
    target_tokens: int = 0
    score_tokens: int = 0
    covered: bool = True
    trail: list = field(default_factory=list)
    """(turn, score, accepted, the target's own step's score or None) of each scored step: the
    per-turn statistics"""


def walk(trace: Trace, program_id: str, sample: int, policy) -> PathResult:
    """Follow one policy down one sample's path tree."""
    qid = trace.questions[program_id][0]
    out, path = PathResult(), ""
    while True:
        node = trace.nodes.get((program_id, sample, path))
        if node is None:
            out.covered = False
            return out
        score = node["score"]
        if (policy.needs_score and score is None) or \
                (policy.needs_draft and node["draft_tokens"] is None):
            out.covered = False  # a node only policies without drafts reached
            return out
        if policy.needs_draft:
            out.draft_tokens += node["draft_tokens"] or 0
        if policy.needs_score and score is not None:
            out.score_tokens += node["score_prefill_tokens"] or 0
        accepted = policy.decide(qid, score).accepted
        if policy.needs_score:
            out.scored += 1
            out.rejected += not accepted
            out.trail.append((len(path), score, accepted, node.get("target_score")))
        kind = "draft" if accepted else "target"
        if node[f"{kind}_tokens"] is None:  # the tracer never asked this step
            out.covered = False
            return out
        if not accepted:
            out.target_tokens += node["target_tokens"]
        out.steps += 1
        path += "A" if accepted else "R"
        if node[f"{kind}_ended"] or len(path) >= trace.turns:
            out.answer = node[f"{kind}_answer"]
            return out


def evaluate(trace: Trace, policy, samples: int) -> dict:
    """One policy with the first `samples` samples of every evaluated question."""
    if not 1 <= samples <= trace.samples:
        raise ValueError(f"samples must be in 1..{trace.samples} (the trace's), got {samples}")
    n = Counter()
    per_q_rates, vote_ok, best_ok, path_ok = [], 0, 0, 0
    for pid, (qid, gold, _, _) in sorted(trace.questions.items()):
        results = [walk(trace, pid, k, policy) for k in range(samples)]
        for r in results:
            for key in ("steps", "scored", "rejected", "draft_tokens", "target_tokens",
                        "score_tokens"):
                n[key] += getattr(r, key)
            n["uncovered"] += not r.covered
            path_ok += r.answer == gold
        scored = sum(r.scored for r in results)
        if scored:
            per_q_rates.append(sum(r.rejected for r in results) / scored)
        answers = [r.answer for r in results]
        vote_ok += majority_vote(answers) == gold
        best_ok += gold in answers
    questions = len(trace.questions)
    alpha = getattr(policy, "alpha", None)
    rate = n["rejected"] / n["scored"] if n["scored"] else math.nan
    return {
        "policy": policy.name, "coverage": getattr(policy, "coverage", None), "alpha": alpha,
        "samples": samples, "questions": questions, "paths": questions * samples,
        "rejection_rate": rate,
        "rate_error": abs(rate - alpha) if alpha is not None else None,
        "question_rate_error": (sum(abs(r - alpha) for r in per_q_rates) / len(per_q_rates)
                                if alpha is not None and per_q_rates else None),
        # how far each question's rate strays from the policy's own: what a fixed threshold
        # (no alpha to hold) is judged by beside the conformal policies
        "question_rate_spread": (sum(abs(r - rate) for r in per_q_rates) / len(per_q_rates)
                                 if per_q_rates else None),
        "max_score": getattr(policy, "max_score", None),
        "accuracy_vote": vote_ok / questions, "accuracy_best_of_n": best_ok / questions,
        "accuracy_path": path_ok / (questions * samples),
        "draft_tokens": n["draft_tokens"], "target_tokens": n["target_tokens"],
        "score_prefill_tokens": n["score_tokens"], "steps": n["steps"],
        "uncovered_paths": n["uncovered"],
    }


def offline_grid(trace_dir: str | Path, alphas=None, samples=None,
                 calib_samples: int | None = None, thresholds=()) -> list[dict]:
    """Every policy (baselines, conformal per coverage x alpha, the fixed-threshold baseline at
    each threshold: the trace's where none are given) at every sample count, with the trace's
    sampling and calibration Kd."""
    trace = load_trace(trace_dir)
    alphas = tuple(alphas or trace.alphas)
    counts = sorted(set(samples or _powers(trace.samples)))
    policies = [DraftOnly(), TargetOnly()] + [
        calibrated(trace, Conformal(a, c), calib_samples) for c in COVERAGES for a in alphas]
    policies += [Threshold(t) for t in thresholds or trace.thresholds]
    kd = {"draft_tokens": trace.draft_tokens, "calib_draft_tokens": trace.calib_draft_tokens}
    return [{**evaluate(trace, p, m), **kd} for p in policies for m in counts]


def equal_accuracy(rows: list[dict]) -> list[dict]:
    """Each conformal row beside the fixed-threshold baseline that reaches at least its vote
    accuracy at the same sample count with the fewest target-side tokens (thresholds whose
    paths all stay in the traced tree only): SpecReason against A1 at equal accuracy."""
    out = []
    for r in rows:
        if r["coverage"] is None:
            continue
        rivals = [t for t in rows if t["max_score"] is not None and t["samples"] == r["samples"]
                  and not t["uncovered_paths"] and t["accuracy_vote"] >= r["accuracy_vote"]]
        best = min(rivals, key=_target_side, default=None)
        out.append({"policy": r["policy"], "samples": r["samples"],
                    "accuracy_vote": r["accuracy_vote"], "target_side_tokens": _target_side(r),
                    "question_rate_spread": r["question_rate_spread"],
                    "threshold": best and best["policy"],
                    "threshold_accuracy_vote": best and best["accuracy_vote"],
                    "threshold_target_side_tokens": best and _target_side(best),
                    "threshold_question_rate_spread": best and best["question_rate_spread"]})
    return out


def _target_side(row: dict) -> int:
    return row["target_tokens"] + row["score_prefill_tokens"]


def _powers(n: int) -> list[int]:
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]

"""Traced A1 questions a program workload draws from: a conformity trace's path trees.

A conformity trace (`reasonsim trace conformity`) holds, per evaluated question x sample, the
A1 path tree that its policy grid explored, keyed by decision string, and the calibration
phase's scores. The bank gives the simulator the traced nodes it answers requests from, the
calibration sets the conformal policy needs (the same sets live), and the figures a workload
draws with (difficulty, expected tokens, difficulty factor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from policies.a1 import A1Settings, Conformal, ConformalSet, calibration_sets
from programs.families import ProgramFamily, register_family
from traces.store import read_run, read_table


@dataclass(frozen=True)
class A1Question:
    """An evaluated question with its traced path trees."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    nodes: dict
    """(sample, path) -> the node's conformity row (its `NODE_COLUMNS`)"""
    expected_tokens: int
    """mean tokens of a traced target-only path x samples (routing estimate)"""


@dataclass(frozen=True)
class A1Bank:
    """The evaluated questions of a conformity trace, its settings and calibration sets."""

    questions: tuple[A1Question, ...]
    settings: A1Settings
    samples: int
    """traced samples per question"""
    marginal: ConformalSet
    by_question: dict
    difficulty_factor: dict
    seed: int

    def settings_for(self, policy) -> A1Settings:
        """The trace's generation settings with a policy's paths, synchronisation and turns (at
        most the trace's: a longer path than it traced has no steps to answer from)."""
        turns = policy.turns or self.settings.turns
        if turns > self.settings.turns:
            raise ValueError(f"programs.policy.turns: {turns} turns; the conformity trace "
                             f"traced at most {self.settings.turns}")
        return replace(self.settings, samples=policy.samples, sync=policy.sync, turns=turns,
                       target_cap=policy.target_cap)

    def calibrate(self, policy):
        """An A1 policy with this trace's calibration sets (baselines unchanged)."""
        if isinstance(policy.step, Conformal):
            return replace(policy, step=policy.step.calibrated(self.marginal, self.by_question))
        return policy


NODE_COLUMNS = ("question_id", "difficulty", "gold_answer", "sample", "path", "policies",
                "context_tokens", "score", *(f"{step}_{c}" for step in ("draft", "target")
                                             for c in ("tokens", "text", "answer", "ended")))
"""the conformity columns a traced node keeps (`A1Question.nodes`: what the simulator's oracle
reads)"""


def load_conformity(trace_dir: str | Path, samples: int) -> A1Bank:
    """The evaluation trees and calibration sets of a conformity trace."""
    run = read_run(trace_dir)
    if run["kind"] != "conformity":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace, not a conformity trace")
    wl = json.loads(run["params_json"])["workload"]
    if samples > int(wl["samples"]):
        raise ValueError(f"programs.policy.samples: a1 needs {samples} samples per question; "
                         f"the trace has {wl['samples']}")
    table = read_table(trace_dir, "conformity")
    d = table.select(["program_id", "question_split", "question_id", "score"]).to_pandas()
    cal = d[d.program_id.str.endswith("cal") & d.score.notna()]
    marginal, by_q = calibration_sets(zip(cal.question_split, cal.question_id, cal.score))
    by_question: dict[str, list[dict]] = {}
    # rows as Python values straight from Arrow (missing steps and answers None): a tenth of
    # pandas' records' cost
    evaluation = table.filter(pc.ends_with(table["program_id"], "eva")).select(NODE_COLUMNS)
    for r in evaluation.to_pylist():
        by_question.setdefault(r["question_id"], []).append(r)
    if not by_question:
        raise ValueError(f"{trace_dir}: no evaluation programs (program ids ending 'eva') in "
                         "its conformity table")
    questions = []
    for qid in sorted(by_question):
        rows = by_question[qid]
        nodes = {(int(r["sample"]), r["path"]): r for r in rows}
        root = next((r for r in rows if r["path"] == ""), None)
        if root is None or root["difficulty"] is None:
            raise ValueError(f"{trace_dir}: question {qid} has no root node (path '') with a "
                             "difficulty in its conformity table")
        target_only = [r["target_tokens"] for r in rows if "target-only" in r["policies"]]
        questions.append(A1Question(qid, int(root["difficulty"]), int(root["context_tokens"]),
                                    root["gold_answer"], nodes,
                                    int(sum(target_only) / int(wl["samples"]) * samples)))
    tokens = np.array([q.expected_tokens for q in questions], dtype=float)
    level = np.array([q.difficulty or 0 for q in questions])
    factor = {int(lv): float(tokens[level == lv].mean() / tokens.mean()) for lv in set(level)}
    s = wl["settings"]
    settings = A1Settings(samples=samples, turns=s["turns"], draft_tokens=s["draft_tokens"],
                          target_tokens=s["target_tokens"], temperature=s["temperature"])
    return A1Bank(tuple(questions), settings, int(wl["samples"]), marginal, by_q, factor,
                  int(wl["seed"]))


def _a1_roles(policy) -> tuple[str, ...]:
    """The draft writes steps where the policy drafts; the target writes or scores the rest
    (draft-only: never the target)."""
    step = policy.step
    return ("draft",) * step.needs_draft + ("target",) * (step.needs_score or not step.needs_draft)


register_family(ProgramFamily("a1", ("a1",),
                              lambda wl: load_conformity(wl.trace, wl.policy.samples),
                              roles=_a1_roles))


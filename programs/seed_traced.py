"""Traced ToT questions a program workload draws from: a tot trace's requests, by identity.

A tot trace (`reasonsim trace tot`) holds, per held-out question, the tree the target grows
alone (`ar`) and the tree speculative rounds grow (`sd`, the tree of every speculative mode),
each request keyed by (thought, kind, round). A ToT program is deterministic given its outcomes,
so the simulator answers each request of a program with the traced request of the same
identity, from the tree of the program's mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from policies.seed import ToTSettings
from programs.families import ProgramFamily, register_family
from traces.store import read_run, read_table


@dataclass(frozen=True)
class ToTQuestion:
    """A traced question: its requests under each tree."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    requests: dict
    """tree -> {(node, kind, round): the traced tot_requests row}"""
    expected_tokens: int
    """tokens the ar tree generated (routing estimate)"""


@dataclass(frozen=True)
class ToTBank:
    """The questions of a tot trace, its ToT settings and seed."""

    questions: tuple[ToTQuestion, ...]
    settings: ToTSettings
    probe_tokens: int
    difficulty_factor: dict
    seed: int
    vocab: int = 0
    """the target's vocabulary: the top-k of whole-distribution log-probabilities (sampled
    acceptance asks them; 0 in traces that did not record it)"""

    def check(self, policy) -> None:
        """Raise unless a policy's tree is in the trace: the same settings, depth at most the
        traced depth (BFS never looks ahead, so a shallower tree is the deeper one's top)."""
        if replace(policy.settings, depth=self.settings.depth, k_config=(),
                   speculative_eval=False) != self.settings or \
                policy.settings.depth > self.settings.depth:
            raise ValueError(f"programs.policy: tot settings {policy.settings} are not in the "
                             f"trace ({self.settings}; any depth up to its own): trace them "
                             "with reasonsim trace tot")
        trees = set(self.questions[0].requests) if self.questions else set()
        if policy.tree not in trees:
            how = "--speculative-eval" if policy.settings.speculative_eval else "--k-config"
            raise ValueError(f"programs.policy: tot policy {policy.mode} with k_config "
                             f"{policy.settings.k_config}, speculative_eval "
                             f"{policy.settings.speculative_eval}: its tree {policy.tree!r} is "
                             f"not in the trace (trees: {sorted(trees)}): trace it with "
                             f"reasonsim trace tot {how}")


def load_tot(trace_dir: str | Path) -> ToTBank:
    """The traced trees of a tot trace."""
    run = read_run(trace_dir)
    if run["kind"] != "tot":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace, not a tot trace "
                         "(reasonsim trace tot)")
    params = json.loads(run["params_json"])
    wl = params["workload"]
    by_question: dict[str, list[dict]] = {}
    # rows as Python values straight from Arrow (nulls None): a tenth of pandas' records' cost
    for r in read_table(trace_dir, "tot_requests").to_pylist():
        by_question.setdefault(r["question_id"], []).append(r)
    questions = []
    for qid in sorted(by_question):
        rows = by_question[qid]
        trees = {}
        for r in rows:
            tree = r["program_id"][len(qid) + len("-tot"):]  # ar, sd, sd-k2.1 (ids.tot_program_id)
            trees.setdefault(tree, {})[(r["node"], r["kind"], int(r["round"]))] = r
        first = next(r for r in rows if r["node"] == "0" and r["round"] == 0 and
                     r["kind"] in ("ar", "draft"))
        tokens = sum(int(r["output_tokens"]) for r in trees.get("ar", {}).values())
        questions.append(ToTQuestion(qid, first["difficulty"], int(first["prompt_tokens"]),
                                     first["gold_answer"], trees, tokens))
    tokens = np.array([q.expected_tokens for q in questions], dtype=float)
    level = np.array([q.difficulty or 0 for q in questions])
    factor = {int(lv): float(tokens[level == lv].mean() / tokens.mean()) for lv in set(level)}
    return ToTBank(tuple(questions), ToTSettings(**wl["settings"]), int(params["probe_tokens"]),
                   factor, int(wl["seed"]), int(params.get("vocab", 0)))


def _load_seed(wl) -> ToTBank:
    bank = load_tot(wl.trace)
    bank.check(wl.policy)
    return bank


# SEED's programs are ToT trees: its configs name the method `tot`
register_family(ProgramFamily("seed", ("tot",), _load_seed))


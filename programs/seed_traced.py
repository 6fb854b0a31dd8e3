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
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from policies.seed import ToTSettings
from programs.families import ProgramFamily, register_family
from traces import ids
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
    trees: frozenset = frozenset()
    """every tree the trace holds (the questions hold the requests of those loaded)"""

    def check(self, policy) -> None:
        """Raise unless a policy's tree is in the trace: the same settings, depth at most the
        traced depth (BFS never looks ahead, so a shallower tree is the deeper one's top)."""
        if replace(policy.settings, depth=self.settings.depth, k_config=(),
                   speculative_eval=False) != self.settings or \
                policy.settings.depth > self.settings.depth:
            raise ValueError(f"programs.policy: tot settings {policy.settings} are not in the "
                             f"trace ({self.settings}; any depth up to its own): trace them "
                             "with reasonsim trace tot")
        trees = self.trees
        if policy.tree not in trees:
            how = "--speculative-eval" if policy.settings.speculative_eval else "--k-config"
            raise ValueError(f"programs.policy: tot policy {policy.mode} with k_config "
                             f"{policy.settings.k_config}, speculative_eval "
                             f"{policy.settings.speculative_eval}: its tree {policy.tree!r} is "
                             f"not in the trace (trees: {sorted(trees)}): trace it with "
                             f"reasonsim trace tot {how}")


ROW_COLUMNS = ("node", "kind", "round", "output_tokens", "text", "ended", "eos", "drafted_tokens",
               "accepted_tokens", "accepted_positions", "value", "answer")
"""the columns of a traced request the simulator's oracle reads (`sim.families.seed.driver`)"""


def load_tot(trace_dir: str | Path, trees: Iterable[str] | None = None) -> ToTBank:
    """The traced trees of a tot trace: each question's requests of `trees` (default every tree
    the trace holds; a program reads only its mode's, and turning rows into Python values is
    most of a load)."""
    run = read_run(trace_dir)
    if run["kind"] != "tot":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace, not a tot trace "
                         "(reasonsim trace tot)")
    params = json.loads(run["params_json"])
    wl = params["workload"]
    table = read_table(trace_dir, "tot_requests")
    tree_of = _trees(table)
    held = frozenset(tree_of.values())
    wanted = held if trees is None else held & set(trees)
    questions = [ToTQuestion(qid, difficulty, prompt_tokens, gold, {}, tokens) for
                 qid, (difficulty, prompt_tokens, gold, tokens) in _question_facts(table).items()]
    by_id = {q.question_id: q.requests for q in questions}
    # rows as Python values straight from Arrow (nulls None): a tenth of pandas' records' cost
    kept = table.filter(pc.is_in(table["program_id"], pa.array(
        [p for p, tree in tree_of.items() if tree in wanted], pa.string())))
    for qid, pid, r in zip(kept["question_id"].to_pylist(), kept["program_id"].to_pylist(),
                           kept.select(list(ROW_COLUMNS)).to_pylist()):
        if r["accepted_positions"] is not None:  # one tuple, shared by every outcome made of it
            r["accepted_positions"] = tuple(r["accepted_positions"])
        by_id[qid].setdefault(tree_of[pid], {})[(r["node"], r["kind"], int(r["round"]))] = r
    tokens = np.array([q.expected_tokens for q in questions], dtype=float)
    level = np.array([q.difficulty or 0 for q in questions])
    factor = {int(lv): float(tokens[level == lv].mean() / tokens.mean()) for lv in set(level)}
    return ToTBank(tuple(questions), ToTSettings(**wl["settings"]), int(params["probe_tokens"]),
                   factor, int(wl["seed"]), int(params.get("vocab", 0)), held)


def _trees(table: pa.Table) -> dict[str, str]:
    """program id -> its tree (ar, sd, sd-k2.1: `traces.ids.tot_program_id`)."""
    pairs = table.group_by(["question_id", "program_id"]).aggregate([]).to_pylist()
    return {p["program_id"]: p["program_id"][len(p["question_id"]) + len("-tot"):]
            for p in pairs}


def _question_facts(table: pa.Table) -> dict[str, tuple]:
    """question id -> (difficulty, prompt tokens, gold answer, tokens its ar tree generated),
    in question id order; the facts from its first root request (the target's or a draft)."""
    roots = table.filter(pc.and_(pc.and_(pc.equal(table["node"], "0"),
                                         pc.equal(table["round"], 0)),
                                 pc.is_in(table["kind"], pa.array(["ar", "draft"]))))
    first: dict[str, dict] = {}
    for r in roots.select(["question_id", "difficulty", "prompt_tokens",
                           "gold_answer"]).to_pylist():
        first.setdefault(r["question_id"], r)
    ar = pc.equal(table["program_id"], pc.binary_join_element_wise(
        table["question_id"], pa.scalar(ids.tot_program_id("", "ar")), ""))
    sums = table.filter(ar).group_by("question_id").aggregate([("output_tokens", "sum")])
    ar_tokens = dict(zip(sums["question_id"].to_pylist(), sums["output_tokens_sum"].to_pylist()))
    return {q: (first[q]["difficulty"], int(first[q]["prompt_tokens"]), first[q]["gold_answer"],
                int(ar_tokens.get(q, 0)))
            for q in sorted(pc.unique(table["question_id"]).to_pylist())}


def _load_seed(wl) -> ToTBank:
    bank = load_tot(wl.trace, trees=(wl.policy.tree,))
    bank.check(wl.policy)
    return bank


# SEED's programs are ToT trees: its configs name the method `tot`
register_family(ProgramFamily("seed", ("tot",), _load_seed, roles=lambda policy: (
    ("draft", "target") if policy.speculative else ("target",))))


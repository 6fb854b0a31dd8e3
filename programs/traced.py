"""Traced questions a program workload draws from: probes traces (cot, sc) and branches traces.

A probes trace (`reasonsim trace probes`) gives, per question x sample, a trajectory with its
probe answers every stride; a branches trace (`reasonsim trace branches`) gives every request of
every search program run to its cap. Both load into banks of questions with the figures a
workload needs (difficulty, expected tokens, difficulty factor) and the traced content the
simulator answers outcomes from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from policies.allocation import TokenBudget
from policies.certaindex import Probe, ProbeConsistency
from policies.search import SEARCH_METHODS, SearchBudget
from programs.families import ProgramFamily, register_family
from traces import ids
from traces.store import read_run, read_table


@dataclass(frozen=True)
class Trajectory:
    """One traced reasoning sample with its probes in position order."""

    question_id: str
    sample_id: int
    difficulty: int | None
    gold_answer: str
    final_answer: str | None
    reasoning_tokens: int
    probes: tuple[Probe, ...]
    probe_tokens: tuple[int, ...]
    request_seed: int = 0
    """the sample's sampling seed (its chunks' seeds derive from it)"""
    same_text_as: tuple[int, ...] = ()
    """per probe, the lowest sample id of the question whose reasoning up to that probe's
    position is this sample's text exactly (its own id where no other's is): a model that
    samples near-deterministically writes some samples' first tokens alike, and an engine's
    prefix cache serves them alike"""


def load_trajectories(trace_dir: str | Path) -> tuple[list[Trajectory], int]:
    """Trajectories of a probes trace and the trace's probe stride in tokens."""
    trajs, run, _ = _trajectories(trace_dir)
    return trajs, int(run["params"]["workload"]["stride_tokens"])


def _trajectories(trace_dir: str | Path) -> tuple[list[Trajectory], dict, dict]:
    """(trajectories, the run row, the trajectories table's columns) of a probes trace: each
    table read once for `load_questions` too, and turned into Python values column by column."""
    run = read_run(trace_dir)
    if run["kind"] != "probes":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace, not a probes trace")
    probes = read_table(trace_dir, "probes")
    probes = probes.take(pc.sort_indices(  # a stable sort, as pandas' `kind="stable"`
        probes, [("request_id", "ascending"), ("position_tokens", "ascending")]))
    p = {c: probes.column(c).to_pylist() for c in (
        "request_id", "question_id", "sample_id", "position_tokens", "chunk_text", "answer",
        "is_hesitant", "probe_tokens")}
    by_request: dict[str, list[int]] = {}
    for i, rid in enumerate(p["request_id"]):
        by_request.setdefault(rid, []).append(i)
    same = _same_text(p)
    trajs = []
    table = read_table(trace_dir, "trajectories").to_pydict()
    orphans = sorted(set(by_request) - set(table["request_id"]))
    if orphans:  # they would be dropped unread
        raise ValueError(f"{trace_dir}: probes of request {orphans[0]} have no trajectory row")
    for row in zip(*(table[c] for c in _TRAJECTORY_COLUMNS)):
        rid, qid, sample, difficulty, gold, final, reasoning, seed = row
        rows = by_request.get(rid)
        if rows is None:
            raise ValueError(f"{trace_dir}: trajectory {rid} has no probes")
        _check_positions(trace_dir, rid, [p["position_tokens"][i] for i in rows], reasoning)
        trajs.append(Trajectory(
            question_id=qid, sample_id=int(sample),
            difficulty=None if difficulty is None else int(difficulty),
            gold_answer=gold, final_answer=final if isinstance(final, str) else None,
            reasoning_tokens=int(reasoning), request_seed=int(seed),
            probes=tuple(Probe(int(p["position_tokens"][i]), p["answer"][i] or "",
                               bool(p["is_hesitant"][i])) for i in rows),
            probe_tokens=tuple(int(p["probe_tokens"][i]) for i in rows),
            same_text_as=tuple(same[i] for i in rows)))
    trajs.sort(key=lambda t: (t.question_id, t.sample_id))
    return trajs, run, table


def _check_positions(trace_dir, rid: str, positions: list[int], reasoning: int) -> None:
    """A trajectory's probe positions (sorted) rise, each within the reasoning it probed."""
    if any(b <= a for a, b in zip(positions, positions[1:])):
        raise ValueError(f"{trace_dir}: request {rid} is probed twice at one position")
    if positions and positions[-1] > reasoning:
        raise ValueError(f"{trace_dir}: request {rid} is probed at {positions[-1]} tokens, past "
                         f"its {reasoning} reasoning tokens")


_TRAJECTORY_COLUMNS = ("request_id", "question_id", "sample_id", "difficulty", "gold_answer",
                       "final_answer", "reasoning_tokens", "request_seed")


def _same_text(p: dict) -> list[int]:
    """Per probe row, the lowest sample id of its question whose text up to the row's position
    is the row's sample's (`Trajectory.same_text_as`); `p`: the probes' columns, sorted by
    request and position."""
    out, lowest = [0] * len(p["request_id"]), {}
    text: dict = {}  # request id -> its reasoning up to the last row seen
    rows = zip(range(len(out)), p["request_id"], p["question_id"], p["sample_id"],
               p["position_tokens"], p["chunk_text"])
    for i, rid, qid, sample, pos, chunk in sorted(rows, key=lambda r: (r[3], r[4])):
        text[rid] = text.get(rid, "") + (chunk or "")
        out[i] = lowest.setdefault((qid, int(pos), text[rid]), int(sample))
    return out


@dataclass(frozen=True)
class Question:
    """A traced question with its sampled trajectories (sample order)."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    samples: tuple[Trajectory, ...]

    @cached_property  # asked at every program's arrival
    def expected_tokens(self) -> int:
        """Mean reasoning tokens of its samples (routing estimate)."""
        return int(np.mean([t.reasoning_tokens for t in self.samples]))


@dataclass(frozen=True)
class QuestionBank:
    """Every question of a probes trace, and what a request of it costs."""

    questions: tuple[Question, ...]
    stride_tokens: int
    budget_tokens: int
    """a path's token budget when traced"""
    suffix_tokens: int
    """tokens the probe suffix adds to a probe's prompt"""
    difficulty_factor: dict
    """difficulty level -> mean reasoning tokens at that level / overall mean"""


def load_questions(trace_dir: str | Path) -> QuestionBank:
    """The questions of a probes trace, grouped with their samples."""
    trajs, run, tr = _trajectories(trace_dir)
    stride = int(run["params"]["workload"]["stride_tokens"])
    prompt = dict(zip(tr["request_id"], tr["prompt_tokens"]))
    req = read_table(trace_dir, "requests").to_pandas()
    probes = req[req.role == "probe"]
    if probes.empty:
        raise ValueError(f"{trace_dir}: no probe requests in the requests table")
    # The probe after the first chunk has prompt = question + stride + suffix.
    first = probes[probes.request_id.map(ids.probe_number) == 1]
    sizes = pd.Series(first.prompt_tokens.to_numpy(np.int64)
                      - first.program_id.map(prompt).to_numpy(np.int64) - stride)
    if sizes.nunique() != 1:
        raise ValueError(f"{trace_dir}: probe prompts disagree on the suffix length "
                         f"({sorted(sizes.unique())[:5]})")
    by_q: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_q.setdefault(t.question_id, []).append(t)
    questions = tuple(Question(q, ts[0].difficulty, int(prompt[ids.trajectory_id(q, ts[0].sample_id)]),
                               ts[0].gold_answer, tuple(ts)) for q, ts in sorted(by_q.items()))
    lengths = pd.Series({(t.question_id, t.sample_id): t.reasoning_tokens for t in trajs})
    level = pd.Series({(t.question_id, t.sample_id): t.difficulty or 0 for t in trajs})
    factor = (lengths.groupby(level).mean() / lengths.mean()).to_dict()
    budget = int(run["params"]["workload"]["budget_tokens"])
    return QuestionBank(questions, stride, budget, int(sizes.iloc[0]),
                        {int(k): float(v) for k, v in factor.items()})


@dataclass(frozen=True)
class TracedRequest:
    """One traced request of a search program."""

    index: int
    """request order within the program (branch id - 1)"""
    group: int
    """sc sample, mcts iteration or rebase level"""
    prompt_tokens: int
    output_tokens: int
    answer: str | None
    reward: float
    is_leaf: bool
    parent: int = 0
    """node the request extended: 0 the question, else the branch id of the request that
    created it"""


@dataclass(frozen=True)
class SearchQuestion:
    """A traced question with its program's requests (request order)."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    requests: tuple[TracedRequest, ...]

    @cached_property  # asked at every program's arrival
    def expected_tokens(self) -> int:
        """Tokens the traced program generated (routing estimate)."""
        return sum(r.output_tokens for r in self.requests)

    @cached_property  # asked once per program
    def content_ends(self) -> tuple[int, ...]:
        """Per node (0: the question, i: the node request i - 1 created), where its content
        ends: the prompt tokens of the requests that extend it (0 for a node none extends).
        A node's content is the start of its creator's output (all of it for Rebase, the first
        step for MCTS), so later prompts find those blocks in the engine's prefix cache."""
        ends = [0] * (len(self.requests) + 1)
        for r in self.requests:
            ends[r.parent] = r.prompt_tokens
        return tuple(ends)


@dataclass(frozen=True)
class SearchBank:
    """The traced programs of one method and cap, one per question."""

    method: str
    cap: int
    questions: tuple[SearchQuestion, ...]
    difficulty_factor: dict
    """difficulty level -> mean tokens per program at that level / overall mean"""
    settings: dict
    """how the traced programs generated (`programs.search.SearchSettings` fields)"""
    seed: int = 0
    """the trace's seed (programs' seeds derive from it)"""


def traced_caps(trace_dir: str | Path) -> dict[str, list[int]]:
    """The caps a branches trace ran each method to."""
    run = read_run(trace_dir)
    if run["kind"] != "branches":
        raise ValueError(f"{trace_dir}: a {run['kind']!r} trace, not a branches trace")
    wl = json.loads(run["params_json"])["workload"]
    caps = {"sc": [wl["sc_samples"]], "mcts": [wl["mcts_iterations"]],
            "rebase": list(wl["rebase_widths"])}
    return {m: caps[m] for m in wl["methods"]}


def load_search(trace_dir: str | Path, method: str, cap: int) -> SearchBank:
    """The programs of a branches trace that a `method` policy with this cap can replay."""
    caps = traced_caps(trace_dir)
    if method not in caps:
        raise ValueError(f"{trace_dir}: no {method} programs (traced: {sorted(caps)})")
    if method == "rebase":
        if cap not in caps[method]:
            raise ValueError(f"programs.policy.cap: rebase width {cap} was not traced; traced "
                             f"widths: {caps[method]}")
        traced = cap
    else:
        traced = caps[method][0]
        if cap > traced:
            raise ValueError(f"programs.policy.cap: {method} cap {cap} exceeds the traced "
                             f"{traced}")
    t = read_table(trace_dir, "branches")
    t = t.filter(pc.and_(pc.equal(t["method"], method), pc.equal(t["cap"], traced)))
    if t.num_rows == 0:
        raise ValueError(f"{trace_dir}: no {method} programs with cap {traced}")
    # each question's rows in program then branch order; the columns read once as lists
    t = t.sort_by([("question_id", "ascending"), ("program_id", "ascending"),
                   ("branch_id", "ascending")])
    cols = {name: t[name].to_pylist() for name in (
        "question_id", "branch_id", "round", "prompt_tokens", "output_tokens", "answer",
        "reward", "is_leaf", "parent_branch_id", "difficulty", "gold_answer")}
    qids = cols["question_id"]
    starts = [i for i in range(len(qids)) if i == 0 or qids[i] != qids[i - 1]]
    questions = [_search_question(trace_dir, cols, i, j)
                 for i, j in zip(starts, starts[1:] + [len(qids)])]
    tokens = np.array([q.expected_tokens for q in questions], dtype=float)
    level = np.array([q.difficulty or 0 for q in questions])
    factor = {int(lv): float(tokens[level == lv].mean() / tokens.mean()) for lv in set(level)}
    twl = json.loads(read_run(trace_dir)["params_json"])["workload"]
    return SearchBank(method, cap, tuple(questions), factor, twl["settings"], int(twl["seed"]))


def _search_question(trace_dir, cols: dict, i: int, j: int) -> SearchQuestion:
    """The question in rows i..j-1 of a branches trace's columns (`load_search`), its tree
    checked: each branch extends the question or a branch created before it."""
    qid, branches = cols["question_id"][i], cols["branch_id"][i:j]
    parents = [p or 0 for p in cols["parent_branch_id"][i:j]]
    known = set(branches)
    bad = [(b, p) for b, p in zip(branches, parents) if p and (p >= b or p not in known)]
    if bad:
        raise ValueError(f"{trace_dir}: question {qid}'s branch {bad[0][0]} extends branch "
                         f"{bad[0][1]}, which its tree does not hold before it")
    reqs = tuple(TracedRequest(b - 1, r, p, o, a, float(w), bool(leaf), up)
                 for b, r, p, o, a, w, leaf, up in zip(
                     branches, cols["round"][i:j], cols["prompt_tokens"][i:j],
                     cols["output_tokens"][i:j], cols["answer"][i:j], cols["reward"][i:j],
                     cols["is_leaf"][i:j], parents))
    difficulty = cols["difficulty"][i]
    return SearchQuestion(qid, None if difficulty is None else int(difficulty),
                          min(cols["prompt_tokens"][i:j]), cols["gold_answer"][i], reqs)


def checkpoint_groups(q: SearchQuestion, method: str, cap: int,
                      per_round: int = 0) -> list[list[TracedRequest]]:
    """The program's requests grouped by decision point, up to the cap."""
    reqs = q.requests
    if method == "sc":
        reqs = reqs[:cap]
        size = per_round or cap
        return [list(reqs[i:i + size]) for i in range(0, len(reqs), size)]
    if method == "mcts":
        return [[r] for r in reqs[:cap]]
    groups: dict[int, list[TracedRequest]] = {}
    for r in reqs:
        groups.setdefault(r.group, []).append(r)
    return [groups[k] for k in sorted(groups)]


def check_policy(bank: QuestionBank, method: str, policy) -> None:
    """Raise if a policy cannot be replayed on this trace (interval, budget, samples)."""
    s = bank.stride_tokens
    if isinstance(policy, ProbeConsistency) and policy.every_tokens % s:
        raise ValueError(f"programs.policy.interval_tokens: {policy.every_tokens} is not a "
                         f"multiple of the traced stride {s}")
    if isinstance(policy, TokenBudget) and policy.budget_tokens % s:
        raise ValueError(f"programs.policy.budget_tokens: {policy.budget_tokens} is not a "
                         f"multiple of the traced stride {s}")
    if method == "sc":
        have = min(len(q.samples) for q in bank.questions)
        if policy.samples > have:
            raise ValueError(f"programs.policy.samples: sc needs {policy.samples} samples per "
                             f"question; the trace has {have}")


def _load_reasoning(wl) -> QuestionBank:
    bank = load_questions(wl.trace)
    check_policy(bank, wl.method, wl.policy)
    return bank


def _reasoning_samples(wl, q: Question, drawn: int) -> tuple[int, ...]:
    # sc launches every traced sample; cot replays the one drawn
    if wl.method == "sc":
        return tuple(t.sample_id for t in q.samples)
    return (q.samples[drawn].sample_id,)


register_family(ProgramFamily(
    "reasoning", ("cot", "sc"), _load_reasoning,
    accepts=lambda policy: not isinstance(policy, SearchBudget), samples=_reasoning_samples))
register_family(ProgramFamily(
    "search", SEARCH_METHODS, lambda wl: load_search(wl.trace, wl.method, wl.policy.cap),
    accepts=lambda policy: isinstance(policy, SearchBudget)))


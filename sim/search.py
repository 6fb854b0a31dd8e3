"""Traced SC/MCTS/Rebase programs: counterfactual stops, calibration, and the simulator's driver.

A branches trace (`reasonsim trace branches`) holds every request of every program run to its
cap. A program's requests fall into checkpoint groups (an SC round, an MCTS iteration, a Rebase
level); a stop policy (`policies.search.SearchBudget`) decides after each group. Because the
trace never stops early, any cap at most the traced one (SC samples, MCTS iterations) or equal to
it (Rebase width) and any stop rule can be replayed on it: offline (tokens to accuracy,
threshold calibration, Pareto-frontier fitting) or in the simulator, where each traced request
becomes a simulated request and the program waits for a whole group before deciding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.certaindex import Certaindex
from policies.scheduling import ProgramView
from policies.search import REWARD_AGGREGATE, ParetoFrontier, SearchBudget, program_answer
from sim.replica import Req
from traces.store import read_run, read_table


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


@dataclass(frozen=True)
class SearchQuestion:
    """A traced question with its program's requests (request order)."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    requests: tuple[TracedRequest, ...]

    @property
    def expected_tokens(self) -> int:
        """Tokens the traced program generated (routing estimate)."""
        return sum(r.output_tokens for r in self.requests)


@dataclass(frozen=True)
class SearchBank:
    """The traced programs of one method and cap, one per question."""

    method: str
    cap: int
    questions: tuple[SearchQuestion, ...]
    difficulty_factor: dict
    """difficulty level -> mean tokens per program at that level / overall mean"""


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
            raise ValueError(f"rebase width {cap} was not traced; traced widths: {caps[method]}")
        traced = cap
    else:
        traced = caps[method][0]
        if cap > traced:
            raise ValueError(f"{method} cap {cap} exceeds the traced {traced}")
    d = read_table(trace_dir, "branches").to_pandas()
    d = d[(d.method == method) & (d.cap == traced)].sort_values(["program_id", "branch_id"])
    if d.empty:
        raise ValueError(f"{trace_dir}: no {method} programs with cap {traced}")
    questions = []
    for qid, g in d.groupby("question_id", sort=True):
        reqs = tuple(TracedRequest(int(b) - 1, int(r), int(p), int(o), a, float(w), bool(leaf))
                     for b, r, p, o, a, w, leaf in zip(g.branch_id, g["round"], g.prompt_tokens,
                                                       g.output_tokens, g.answer, g.reward,
                                                       g.is_leaf))
        first = g.iloc[0]
        questions.append(SearchQuestion(
            qid, None if first.difficulty is None else int(first.difficulty),
            int(g.prompt_tokens.min()), first.gold_answer, reqs))
    tokens = np.array([q.expected_tokens for q in questions], dtype=float)
    level = np.array([q.difficulty or 0 for q in questions])
    factor = {int(lv): float(tokens[level == lv].mean() / tokens.mean()) for lv in set(level)}
    return SearchBank(method, cap, tuple(questions), factor)


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
    answers = [a for _, a, _ in solved]
    rewards = [w for _, _, w in solved]
    return len(solved) > before and policy.should_stop(answers, rewards, before), answers, rewards


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
                solved.append((r.index, r.answer, r.reward))
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


def certaindex_for(method: str, entropy_threshold: float | None = None,
                   reward_threshold: float | None = None) -> Certaindex:
    """Certaindex with the method's reward aggregate (MCTS mean, Rebase max)."""
    return Certaindex(entropy_threshold, reward_threshold, REWARD_AGGREGATE[method])


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
                        detect: int | None = None, per_round: int = 0) -> dict:
    """Profiler-guided calibration: the most aggressive threshold losing no calibration accuracy.

    Candidates are tried from the most aggressive (lowest) up; the first whose accuracy on the
    calibration questions is at least the cap's (baseline-even) wins. None if no candidate does.
    """
    base = evaluate(bank, SearchBudget(bank.cap, per_round=per_round), calibration)
    tried = []
    for t in sorted(thresholds):
        cx = certaindex_for(bank.method, **{f"{signal}_threshold": t})
        s = evaluate(bank, SearchBudget(bank.cap, cx, detect, per_round=per_round), calibration)
        tried.append({"threshold": t} | s)
        if s["accuracy"] >= base["accuracy"]:
            return {"threshold": t, "calibration": s, "baseline": base, "tried": tried}
    return {"threshold": None, "calibration": None, "baseline": base, "tried": tried}


def fit_frontier(bank: SearchBank, signal: str, thresholds, calibration,
                 per_round: int = 0) -> ParetoFrontier | None:
    """A Pareto-frontier curve fitted on calibration questions: certaindex -> solutions allowed.

    Greedy skyline: for each solution count n from the fewest up, add the rule (lowest
    threshold t, n) that keeps calibration accuracy at the cap's and lowers tokens, given the
    rules so far. A high certaindex may stop a program early; a low one lets it run longer.
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
            s = evaluate(bank, _with_frontier(bank, cand, per_round), calibration)
            if s["accuracy"] >= base["accuracy"] and s["tokens_mean"] < best_tokens:
                rules.append((float(t), n))
                best_tokens = s["tokens_mean"]
                break
    return ParetoFrontier(tuple(rules), signal) if rules else None


def _with_frontier(bank: SearchBank, frontier: ParetoFrontier, per_round: int) -> SearchBudget:
    return SearchBudget(bank.cap, frontier=frontier, reward_aggregate=REWARD_AGGREGATE[bank.method],
                        per_round=per_round)


# ------------------------------------------------------------------ simulator driver
class SearchRun:
    """One search program in the simulator: its traced groups, progress and outcome."""

    __slots__ = ("idx", "q", "policy", "arrival_s", "deadline_s", "replica", "groups", "next",
                 "pending", "solved", "before", "requests", "tokens", "finish_s", "answer")

    def __init__(self, idx, q: SearchQuestion, policy: SearchBudget, arrival_s: float,
                 deadline_s: float, groups):
        self.idx = idx
        self.q = q
        self.policy = policy
        self.arrival_s = arrival_s
        self.deadline_s = deadline_s
        self.replica = -1
        self.groups = groups
        self.next = 0
        self.pending = 0
        self.solved: list = []
        self.before = 0
        self.requests = 0
        self.tokens = 0
        self.finish_s = float("nan")
        self.answer = None

    # What programs_table reads.
    @property
    def paths(self) -> list:
        return [None] * self.requests

    reasoning = property(lambda self: self.tokens)
    probe_tokens = property(lambda self: 0)
    stop_at = property(lambda self: None)


class SearchDriver:
    """Runs search programs on replicas: a group of requests at a time, then the stop policy."""

    def __init__(self, env, replicas, results, method: str, scheduler, on_program_done=None):
        self.env = env
        self.replicas = replicas
        self.res = results
        self.method = method
        self.scheduler = scheduler
        self.finished_tokens: list[int] = []
        self.owner: list[tuple] = []            # request idx -> (program, traced request)
        self.req_arrival: list[float] = []
        self.req_prompt: list[int] = []
        self.req_priority: list[int] = []
        self.on_program_done = on_program_done

    def start(self, prog: SearchRun) -> None:
        """A program arrives: send its first group."""
        self._send_group(prog)

    def _send_group(self, prog: SearchRun) -> None:
        group = prog.groups[prog.next]
        prog.next += 1
        prog.pending = len(group)
        prog.before = len(prog.solved)
        view = ProgramView(prog.idx, self.env.now - prog.arrival_s, prog.tokens)
        priority = self.scheduler.priority(view, self.finished_tokens)
        replica = self.replicas[prog.replica]
        for t in group:
            idx = len(self.owner)
            self.owner.append((prog, t))
            self.req_arrival.append(self.env.now)
            self.req_prompt.append(t.prompt_tokens)
            self.req_priority.append(priority)
            self.res.replica_id[idx] = prog.replica
            prog.requests += 1
            # One prefix-cache group per program, its whole prompt cacheable: this overestimates
            # hits where sibling branches diverge.
            replica.submit(Req(idx, t.prompt_tokens, t.output_tokens, priority=priority,
                               group=prog.idx, prefix_tokens=t.prompt_tokens))

    def on_request_done(self, r: Req) -> None:
        """Replica callback: a request finished."""
        prog, t = self.owner[r.idx]
        prog.tokens += r.generated
        if t.is_leaf:
            prog.solved.append((t.index, t.answer, t.reward))
        prog.pending -= 1
        if prog.pending:
            return
        stop, answers, rewards = checkpoint(prog.policy, prog.solved, prog.before)
        if not stop and prog.next < len(prog.groups):
            self._send_group(prog)
            return
        prog.answer = program_answer(self.method, answers, rewards)
        prog.finish_s = self.env.now
        self.finished_tokens.append(prog.tokens)
        if self.on_program_done is not None:
            self.on_program_done(prog)


def search_policy(method: str, spec: dict) -> SearchBudget:
    """A SearchBudget from a config mapping: {type: even|certaindex|frontier, cap, ...}."""
    args = dict(spec)
    kind = args.pop("type", "even")
    if kind not in ("even", "certaindex", "frontier"):
        raise ValueError(f"programs.policy: {kind!r} is not a {method} policy; known: "
                         "certaindex, even, frontier")
    cap = args.pop("cap", None)
    if cap is None:
        raise ValueError(f"programs.policy: a {method} policy needs 'cap'")
    agg = REWARD_AGGREGATE[method]
    per_round = int(args.pop("per_round", 0)) if method == "sc" else 0
    if kind == "even":
        if args:
            raise ValueError(f"programs.policy even: unknown keys {sorted(args)}")
        return SearchBudget(int(cap), reward_aggregate=agg, per_round=per_round)
    if kind == "certaindex":
        unknown = set(args) - {"entropy_threshold", "reward_threshold", "detect"}
        if unknown:
            raise ValueError(f"programs.policy certaindex: unknown keys {sorted(unknown)}")
        cx = certaindex_for(method, args.get("entropy_threshold"), args.get("reward_threshold"))
        return SearchBudget(int(cap), cx, args.get("detect"), reward_aggregate=agg,
                            per_round=per_round)
    unknown = set(args) - {"rules", "signal"}
    if unknown or "rules" not in args:
        raise ValueError("programs.policy frontier: expected {rules: [[certaindex, solutions], "
                         "...], signal: entropy|reward}")
    rules = tuple((float(t), int(n)) for t, n in args["rules"])
    return SearchBudget(int(cap), frontier=ParetoFrontier(rules, args.get("signal", "entropy")),
                        reward_aggregate=agg, per_round=per_round)


# ------------------------------------------------------------------ offline experiments
def search_tokens_to_accuracy(trace_dir: str | Path, thresholds=(0.2, 0.4, 0.6, 0.8, 0.95),
                              sc_per_round: int = 2) -> list[dict]:
    """Rows per method: baseline-even over caps, certaindex (answer entropy) over thresholds."""
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
        for cap in sorted({r["cap"] for r in rows if r["method"] == method and
                           r["policy"] == "certaindex"}):
            pts = sorted((r for r in rows if r["method"] == method and r["cap"] == cap and
                          r["policy"] == "certaindex"), key=lambda r: r["tokens_mean"])
            ax.plot([r["tokens_mean"] for r in pts], [r["accuracy"] for r in pts], "s-",
                    label=f"certaindex 1-H/log n, cap {cap}")
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
        held_rows["frontier"] = evaluate(bank, _with_frontier(bank, frontier, per_round), held)
        out["calibration"]["frontier"] = evaluate(bank, _with_frontier(bank, frontier, per_round),
                                                  calib)
    out["held_out"] = held_rows
    return out

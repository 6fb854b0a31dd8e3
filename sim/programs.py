"""Reasoning programs in the simulator: requests whose control flow depends on traced outputs.

A program answers one traced question. Its reasoning paths replay traced trajectories (probes
trace) in chunks of the trace's stride, each chunk a request whose prompt is the question plus
the reasoning so far (prefix-cached, as the tracer and the live replay send them):

- `cot`: one path; after every `interval` tokens a probe request (reasoning + probe suffix,
  the traced probe's length) is sent together with the next chunk. The allocation policy
  (`ProbeConsistency`, `TokenBudget`, `FullReasoning`) reads the traced probe answers in order
  and may stop: the in-flight chunk and probes are aborted.
- `sc`: self-consistency; paths launch in rounds (`SelfConsistency`), answers are the traced
  final answers, the program answers by majority vote.

Programs arrive as a Poisson process; each is pinned to one replica by the router (its prefix
cache lives there) and each request gets a priority from the inter-program scheduler
(`policies.scheduling`). The cost grows with requests (one per chunk or probe), not tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import simpy

from policies.allocation import FullReasoning, SelfConsistency, TokenBudget, describe_policy
from policies.certaindex import Certaindex, Probe, ProbeConsistency
from policies.routing import ClusterView, RequestView
from policies.scheduling import ProgramView, make_scheduler
from policies.search import majority_vote
from sim.metrics import stats, summarize
from sim.reasoning import Trajectory, load_trajectories
from sim.replica import Replica, Req, Results
from traces.store import read_table

METHODS = ("cot", "sc", "mcts", "rebase")


# ------------------------------------------------------------------ workload
@dataclass(frozen=True)
class ProgramWorkload:
    """Which traced questions arrive, how fast, how they are reasoned about, and deadlines."""

    trace: Path
    """probes trace (reasonsim trace probes) or branches trace (reasonsim trace branches)"""
    method: str
    """cot, sc, mcts or rebase"""
    policy: object
    """ProbeConsistency | TokenBudget | FullReasoning (cot), SelfConsistency (sc on a probes
    trace) or SearchBudget (sc, mcts, rebase on a branches trace)"""
    count: int
    """programs to simulate"""
    rate_per_s: float
    """Poisson program arrival rate"""
    base_deadline_s: float
    """deadline of a program of average difficulty at SLO scale 1"""
    slo_scale: float = 1.0


_WORKLOAD_KEYS = {"trace", "method", "policy", "count", "rate_per_s", "deadline"}


def policy_from_spec(method: str, spec: dict | str):
    """An allocation policy from its config mapping ({type: ..., parameters})."""
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"programs.policy: expected a mapping with 'type', got {spec!r}")
    if method in ("mcts", "rebase") or (method == "sc" and spec["type"] != "sc"):
        from sim.search import search_policy

        return search_policy(method, spec)
    args = dict(spec)
    kind = args.pop("type")
    makers = {"cot": {"certaindex": _probe_consistency, "budget": TokenBudget,
                      "full": FullReasoning},
              "sc": {"sc": _self_consistency}}[method]
    if kind not in makers:
        raise ValueError(f"programs.policy: {kind!r} is not a {method} policy; known: "
                         f"{sorted(makers)}")
    try:
        return makers[kind](**args)
    except TypeError as e:
        raise ValueError(f"programs.policy {kind!r}: {e}") from None


def _probe_consistency(window: int = 3, interval_tokens: int = 32, effort: str | None = None):
    if effort is not None:
        return ProbeConsistency.preset(effort)
    return ProbeConsistency(window=window, every_tokens=interval_tokens)


def _self_consistency(samples: int = 4, per_round: int | None = None,
                      entropy_threshold: float | None = None,
                      detect_round: int | None = None, length_tokens: float | None = None):
    cx = Certaindex(entropy_threshold=entropy_threshold) if entropy_threshold is not None else None
    # Without a stopping signal every path launches at once (baseline-even).
    return SelfConsistency(samples=samples, per_round=per_round or samples, certaindex=cx,
                           detect_round=detect_round, length_tokens=length_tokens)


def program_workload(d: dict, base_dir: str | Path = ".") -> ProgramWorkload:
    """Validate a `workload.programs` mapping."""
    if not isinstance(d, dict):
        raise ValueError(f"workload.programs: expected a mapping, got {d!r}")
    unknown = sorted(set(d) - _WORKLOAD_KEYS)
    if unknown:
        raise ValueError(f"workload.programs: unknown key {unknown[0]!r}; allowed: "
                         f"{sorted(_WORKLOAD_KEYS)}")
    for key in ("trace", "policy", "rate_per_s", "deadline"):
        if key not in d:
            raise ValueError(f"workload.programs: needs {key!r}")
    method = d.get("method", "cot")
    if method not in METHODS:
        raise ValueError(f"workload.programs.method: {method!r}; expected one of {METHODS}")
    deadline = d["deadline"]
    if not isinstance(deadline, dict) or "base_s" not in deadline or \
            set(deadline) - {"base_s", "slo_scale"}:
        raise ValueError("workload.programs.deadline: expected {base_s: .., slo_scale: ..}")
    wl = ProgramWorkload(trace=(Path(base_dir) / d["trace"]).resolve(), method=method,
                         policy=policy_from_spec(method, d["policy"]),
                         count=int(d.get("count", 64)), rate_per_s=float(d["rate_per_s"]),
                         base_deadline_s=float(deadline["base_s"]),
                         slo_scale=float(deadline.get("slo_scale", 1.0)))
    if wl.count < 1 or wl.rate_per_s <= 0 or wl.base_deadline_s <= 0 or wl.slo_scale <= 0:
        raise ValueError("workload.programs: count, rate_per_s, deadline.base_s and slo_scale "
                         "must be positive")
    return wl


# ------------------------------------------------------------------ the traced questions
@dataclass(frozen=True)
class Question:
    """A traced question with its sampled trajectories (sample order)."""

    question_id: str
    difficulty: int | None
    prompt_tokens: int
    gold_answer: str
    samples: tuple[Trajectory, ...]

    @property
    def expected_tokens(self) -> int:
        """Mean reasoning tokens of its samples (routing estimate)."""
        return int(np.mean([t.reasoning_tokens for t in self.samples]))


@dataclass(frozen=True)
class QuestionBank:
    """Every question of a probes trace, and what a request of it costs."""

    questions: tuple[Question, ...]
    stride_tokens: int
    suffix_tokens: int
    """tokens the probe suffix adds to a probe's prompt"""
    difficulty_factor: dict
    """difficulty level -> mean reasoning tokens at that level / overall mean"""


def load_questions(trace_dir: str | Path) -> QuestionBank:
    """The questions of a probes trace, grouped with their samples."""
    trajs, stride = load_trajectories(trace_dir)
    tr = read_table(trace_dir, "trajectories").to_pandas()
    prompt = dict(zip(tr.request_id, tr.prompt_tokens))
    req = read_table(trace_dir, "requests").to_pandas()
    probes = req[req.role == "probe"]
    if probes.empty:
        raise ValueError(f"{trace_dir}: no probe requests in the requests table")
    # The probe after the first chunk (id suffix -p1) has prompt = question + stride + suffix.
    first = probes[probes.request_id.str.endswith("-p1")]
    sizes = pd.Series(first.prompt_tokens.to_numpy(np.int64)
                      - first.program_id.map(prompt).to_numpy(np.int64) - stride)
    if sizes.nunique() != 1:
        raise ValueError(f"{trace_dir}: probe prompts disagree on the suffix length "
                         f"({sorted(sizes.unique())[:5]})")
    by_q: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_q.setdefault(t.question_id, []).append(t)
    questions = tuple(Question(q, ts[0].difficulty, int(prompt[f"{q}-s{ts[0].sample_id}"]),
                               ts[0].gold_answer, tuple(ts)) for q, ts in sorted(by_q.items()))
    lengths = pd.Series({(t.question_id, t.sample_id): t.reasoning_tokens for t in trajs})
    level = pd.Series({(t.question_id, t.sample_id): t.difficulty or 0 for t in trajs})
    factor = (lengths.groupby(level).mean() / lengths.mean()).to_dict()
    return QuestionBank(questions, stride, int(sizes.iloc[0]),
                        {int(k): float(v) for k, v in factor.items()})


def load_bank(wl: ProgramWorkload):
    """The traced questions a workload draws from (probes or branches trace), policy checked."""
    from policies.search import SearchBudget

    if isinstance(wl.policy, SearchBudget):
        from sim.search import load_search

        return load_search(wl.trace, wl.method, wl.policy.cap)
    bank = load_questions(wl.trace)
    check_policy(bank, wl.method, wl.policy)
    return bank


def check_policy(bank: QuestionBank, method: str, policy) -> None:
    """Raise if a policy cannot be replayed on this trace (interval, budget, samples)."""
    s = bank.stride_tokens
    if isinstance(policy, ProbeConsistency) and policy.every_tokens % s:
        raise ValueError(f"probe interval {policy.every_tokens} is not a multiple of the traced "
                         f"stride {s}")
    if isinstance(policy, TokenBudget) and policy.budget_tokens % s:
        raise ValueError(f"budget {policy.budget_tokens} is not a multiple of the traced stride "
                         f"{s}")
    if method == "sc":
        have = min(len(q.samples) for q in bank.questions)
        if policy.samples > have:
            raise ValueError(f"sc needs {policy.samples} samples per question; the trace has "
                             f"{have}")


def draw_programs(bank: QuestionBank, count: int, rate_per_s: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times, question indices and cot sample indices of `count` programs."""
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))
    arrival -= arrival[0]
    # Every question once per pass, in a seeded order: accuracy is not left to the draw.
    passes = -(-count // len(bank.questions))
    order = np.concatenate([rng.permutation(len(bank.questions)) for _ in range(passes)])[:count]
    sample = np.array([rng.integers(len(getattr(bank.questions[q], "samples", (0,))))
                       for q in order])
    return arrival, order, sample


# ------------------------------------------------------------------ program state machines
_MAIN, _PROBE = 0, 1


class _Path:
    """One traced trajectory decoded chunk by chunk, probed at the policy's interval."""

    __slots__ = ("prog", "traj", "group", "pos", "limit", "probe_every", "chunk", "probes",
                 "next_probe", "returned", "in_flight", "ended", "answer", "probe_at")

    def __init__(self, prog: "_Program", traj: Trajectory, group: int):
        self.prog = prog
        self.traj = traj
        self.group = group
        self.pos = 0                 # reasoning tokens decoded
        pol = prog.policy
        self.limit = traj.reasoning_tokens
        if isinstance(pol, TokenBudget):
            self.limit = min(self.limit, pol.budget_tokens)
        self.probe_every = pol.every_tokens if isinstance(pol, ProbeConsistency) else 0
        self.chunk: Req | None = None
        self.probes: list[Probe] = []     # probe answers seen, in position order
        self.next_probe = []              # positions of probes in flight, in order
        self.returned: dict[int, Probe] = {}
        self.in_flight: set[Req] = set()
        self.ended = False
        self.answer: str | None = None
        self.probe_at = dict(zip((p.position_tokens for p in traj.probes),
                                 zip(traj.probes, traj.probe_tokens)))


class _Program:
    __slots__ = ("idx", "q", "policy", "arrival_s", "deadline_s", "replica", "paths",
                 "tokens", "reasoning", "probe_tokens", "finish_s", "answer", "stop_at",
                 "sample", "round_left")

    def __init__(self, idx, q, policy, arrival_s, deadline_s, sample):
        self.idx = idx
        self.q: Question = q
        self.policy = policy
        self.arrival_s = arrival_s
        self.deadline_s = deadline_s
        self.sample = sample
        self.replica = -1
        self.paths: list[_Path] = []
        self.tokens = self.reasoning = self.probe_tokens = 0
        self.finish_s = float("nan")
        self.answer = None
        self.stop_at = None
        self.round_left = 0


class ProgramDriver:
    """Runs programs on replicas: submits their requests, reacts to completions, records."""

    def __init__(self, env, replicas: list[Replica], results: Results, bank: QuestionBank,
                 scheduler, on_program_done=None):
        self.env = env
        self.replicas = replicas
        self.res = results
        self.bank = bank
        self.scheduler = scheduler
        self.finished_tokens: list[int] = []   # per finished program, for SJF estimates
        self.owner: list[tuple] = []           # request idx -> (path, kind, position)
        self.req_arrival: list[float] = []
        self.req_prompt: list[int] = []
        self.req_output: list[int] = []
        self.req_priority: list[int] = []
        self.on_program_done = on_program_done
        self.next_group = 0
        self.done_programs = 0

    # -------------------------------------------------------------- requests
    def _submit(self, path: _Path, kind: int, prompt: int, output: int, position: int) -> Req:
        prog = path.prog
        view = ProgramView(prog.idx, self.env.now - prog.arrival_s, prog.tokens)
        idx = len(self.owner)
        prefix = prompt - (self.bank.suffix_tokens if kind == _PROBE else 0)
        r = Req(idx, prompt, output, priority=self.scheduler.priority(view, self.finished_tokens),
                group=path.group, prefix_tokens=prefix)
        self.owner.append((path, kind, position))
        self.req_arrival.append(self.env.now)
        self.req_prompt.append(prompt)
        self.req_output.append(output)
        self.req_priority.append(r.priority)
        self.res.replica_id[idx] = prog.replica
        path.in_flight.add(r)
        self.replicas[prog.replica].submit(r)
        return r

    def _send_chunk(self, path: _Path) -> None:
        n = min(self.bank.stride_tokens, path.limit - path.pos)
        path.chunk = self._submit(path, _MAIN, path.prog.q.prompt_tokens + path.pos, n, path.pos)

    def _send_probe(self, path: _Path, position: int) -> None:
        _, tokens = path.probe_at[position]
        path.next_probe.append(position)
        self._submit(path, _PROBE, path.prog.q.prompt_tokens + position +
                     self.bank.suffix_tokens, tokens, position)

    # -------------------------------------------------------------- program flow
    def start(self, prog: _Program) -> None:
        """A program arrives: launch its first path(s)."""
        if isinstance(prog.policy, SelfConsistency):
            self._launch(prog, prog.policy.first_round())
        else:
            self._launch(prog, 1)

    def _launch(self, prog: _Program, n: int) -> None:
        prog.round_left = n
        for _ in range(n):
            if isinstance(prog.policy, SelfConsistency):
                traj = prog.q.samples[len(prog.paths)]
            else:
                traj = prog.q.samples[prog.sample]
            path = _Path(prog, traj, self.next_group)
            self.next_group += 1
            prog.paths.append(path)
            self._send_chunk(path)

    def on_request_done(self, r: Req) -> None:
        """Replica callback: a request finished (or was aborted)."""
        path, kind, position = self.owner[r.idx]
        prog = path.prog
        path.in_flight.discard(r)
        prog.tokens += r.generated
        if kind == _PROBE:
            prog.probe_tokens += r.generated
        else:
            prog.reasoning += r.generated
        if path.ended or r.aborted:
            return
        if kind == _MAIN:
            path.pos += r.generated
            if path.pos >= path.limit:
                if path.pos >= path.traj.reasoning_tokens:
                    self._end_path(path, path.traj.final_answer)
                else:  # budget reached: one probe reads the answer
                    self._send_probe(path, path.pos)
                return
            if path.probe_every and path.pos % path.probe_every == 0:
                self._send_probe(path, path.pos)
            self._send_chunk(path)
            return
        probe, _ = path.probe_at[position]
        if path.pos >= path.limit and position == path.pos and not path.probe_every:
            self._end_path(path, probe.answer or None)  # the budget's answer probe
            return
        path.returned[position] = probe
        while path.next_probe and path.next_probe[0] in path.returned:
            p = path.returned.pop(path.next_probe.pop(0))
            path.probes.append(p)
            if prog.policy.should_stop(path.probes):
                prog.stop_at = p.position_tokens
                self._end_path(path, p.answer)
                return

    def _end_path(self, path: _Path, answer: str | None) -> None:
        path.ended = True
        path.answer = answer
        replica = self.replicas[path.prog.replica]
        for r in list(path.in_flight):  # the chunk and probes still in flight
            replica.abort(r)
        prog = path.prog
        prog.round_left -= 1
        if prog.round_left > 0:
            return
        pol = prog.policy
        if isinstance(pol, SelfConsistency):
            answers = [p.answer for p in prog.paths]
            more = pol.next_round(answers, [p.traj.reasoning_tokens for p in prog.paths])
            if more > 0:
                self._launch(prog, more)
                return
            prog.answer = majority_vote(answers)
        else:
            prog.answer = answer
        prog.finish_s = self.env.now
        self.done_programs += 1
        # Aborted requests report their tokens after this: the SJF history takes what is known.
        self.finished_tokens.append(prog.tokens)
        if self.on_program_done is not None:
            self.on_program_done(prog)


def max_requests(q: Question, method: str, policy, stride: int) -> int:
    """Upper bound on the requests a program of this question sends (buffer sizing)."""
    samples = q.samples if method == "sc" else (max(q.samples, key=lambda t: t.reasoning_tokens),)
    if method == "sc":
        samples = samples[:policy.samples]
    return sum(2 * (-(-t.reasoning_tokens // stride)) + 2 for t in samples)


def plan_programs(wl: ProgramWorkload, bank, seed) -> list:
    """The programs of a workload: arrival, question, cot sample and deadline (sim and live)."""
    from sim.search import SearchBank, SearchRun, checkpoint_groups

    arrival, order, sample = draw_programs(bank, wl.count, wl.rate_per_s,
                                           np.random.default_rng(seed))
    programs = []
    for i in range(wl.count):
        q = bank.questions[order[i]]
        deadline = wl.slo_scale * bank.difficulty_factor.get(q.difficulty or 0, 1.0) * \
            wl.base_deadline_s
        if isinstance(bank, SearchBank):
            groups = checkpoint_groups(q, wl.method, wl.policy.cap, wl.policy.per_round)
            programs.append(SearchRun(i, q, wl.policy, float(arrival[i]), deadline, groups))
        else:
            programs.append(_Program(i, q, wl.policy, float(arrival[i]), deadline,
                                     int(sample[i])))
    return programs


def program_seed(cfg, replicas: int):
    """The seed the program draw uses (after one per replica), so live replays draw the same."""
    return np.random.SeedSequence(cfg.seed).spawn(replicas + 1)[-1]


# ------------------------------------------------------------------ the simulation
def simulate_programs(cfg, fast_forward: bool = True):
    """Run a program workload (config `workload.programs`) and return a SimResult."""
    from sim.cluster import SimResult, _router, _steps_table, build_replicas

    wall0 = time.perf_counter()
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    bank = load_bank(wl)
    search = not isinstance(bank, QuestionBank)
    scheduler = make_scheduler(cfg.scheduler)
    specs = build_replicas(cfg)
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(specs) + 1)
    programs = plan_programs(wl, bank, program_seed(cfg, len(specs)))
    capacity = sum(sum(map(len, p.groups)) if search else
                   max_requests(p.q, wl.method, wl.policy, bank.stride_tokens) for p in programs)
    env = simpy.Environment()
    res = Results(capacity)
    outstanding = np.zeros(len(specs), dtype=np.int64)
    in_flight = np.zeros(len(specs), dtype=np.int64)
    driver: ProgramDriver

    def on_finish(i: int, r: Req) -> None:
        in_flight[i] -= 1
        driver.on_request_done(r)

    replicas = [Replica(env, i, cal, rc, res,
                        np.random.default_rng(seeds[i]) if cfg.latency == "sampled" else None,
                        on_finish=lambda r, i=i: on_finish(i, r), fast_forward=fast_forward)
                for i, (cal, rc) in enumerate(specs)]
    expected = {}

    def on_program_done(prog: _Program) -> None:
        outstanding[prog.replica] -= expected.pop(prog.idx)

    if search:
        from sim.search import SearchDriver

        driver = SearchDriver(env, replicas, res, wl.method, scheduler, on_program_done)
    else:
        driver = ProgramDriver(env, replicas, res, bank, scheduler, on_program_done)
    router = _router(cfg.router)
    view = ClusterView(outstanding_tokens=outstanding, num_requests=in_flight)

    def arrivals():
        for prog in programs:
            gap = prog.arrival_s - env.now
            if gap > 0:
                yield env.timeout(gap)
            tokens = prog.q.expected_tokens
            rid = router.route(RequestView(prog.idx, prog.q.prompt_tokens, tokens), view)
            if not 0 <= rid < len(replicas):
                raise ValueError(f"router returned replica {rid}; cluster has {len(replicas)}")
            prog.replica = rid
            expected[prog.idx] = prog.q.prompt_tokens + tokens
            outstanding[rid] += expected[prog.idx]
            in_flight[rid] += 1
            driver.start(prog)

    env.process(arrivals())
    loop0 = time.perf_counter()
    env.run()
    loop_s = time.perf_counter() - loop0
    unfinished = [p.idx for p in programs if np.isnan(p.finish_s)]
    if unfinished:
        raise RuntimeError(f"simulation ended with program {unfinished[0]} unfinished (a bug: "
                           "please report with the config)")
    n = len(driver.owner)
    requests = _requests_table(driver, res, n)
    progs = programs_table(programs, wl, cfg.scheduler)
    summary = summarize(requests.to_pandas(), cfg.slo_ttft_s, cfg.slo_tpot_s)
    summary.update(program_summary(progs.to_pandas()))
    iters = np.asarray(res.seg["k_iters"], dtype=np.int64)
    busy = np.array([r.busy_s for r in replicas])
    summary.update({"wall_s": round(time.perf_counter() - wall0, 4),
                    "event_loop_s": round(loop_s, 4), "events": int(res.events + wl.count),
                    "iterations": int(iters.sum()), "replicas": len(replicas),
                    "utilization": float(busy.mean() / (summary["makespan_s"] or 1.0)),
                    "preemptions": int(res.preemptions.sum())})
    steps = _steps_table(res) if cfg.write_steps else None
    return SimResult(requests, steps, summary, progs)


def _requests_table(driver: ProgramDriver, res: Results, n: int) -> pa.Table:
    if isinstance(driver, ProgramDriver):
        prog = [program_id(path.prog.idx) for path, _, _ in driver.owner]
        role = ["main" if kind == _MAIN else "probe" for _, kind, _ in driver.owner]
    else:  # search programs: every request is a reasoning step or rollout
        prog = [program_id(p.idx) for p, _ in driver.owner]
        role = ["main"] * n
    return pa.table({
        "request_id": [f"{p}-{'c' if r == 'main' else 'p'}{i}"
                       for i, (p, r) in enumerate(zip(prog, role))],
        "replica_id": res.replica_id[:n], "cell_id": pa.nulls(n, pa.string()),
        "program_id": prog, "role": role,
        "priority": np.clip(driver.req_priority, -2**31, 2**31 - 1).astype(np.int32),
        "arrival_s": np.asarray(driver.req_arrival, dtype=float),
        "scheduled_s": res.scheduled_s[:n], "first_token_s": res.first_token_s[:n],
        "finish_s": res.finish_s[:n], "prompt_tokens": np.asarray(driver.req_prompt, np.int32),
        "output_tokens": res.output_tokens[:n], "cached_prompt_tokens": res.cached_tokens[:n],
        "finish_reason": pa.array(np.where(res.aborted[:n], "abort", "length"), pa.string()),
    })


def program_id(i: int) -> str:
    """The id of the i-th program of a workload."""
    return f"prog-{i:05d}"


def programs_table(programs: list, wl: ProgramWorkload, scheduler) -> pa.Table:
    """One row per program (the `programs` schema, without run_id)."""
    sched = scheduler if isinstance(scheduler, str) else json.dumps(scheduler, sort_keys=True)
    latency = np.array([p.finish_s - p.arrival_s for p in programs])
    deadline = np.array([p.deadline_s for p in programs])
    return pa.table({
        "program_id": [program_id(p.idx) for p in programs],
        "question_id": [p.q.question_id for p in programs],
        "method": [wl.method] * len(programs),
        "policy": [describe_policy(wl.policy)] * len(programs),
        "scheduler": [sched] * len(programs),
        "difficulty": pa.array([p.q.difficulty for p in programs], pa.int32()),
        "arrival_s": [p.arrival_s for p in programs],
        "finish_s": [p.finish_s for p in programs],
        "deadline_s": deadline,
        "paths": pa.array([len(p.paths) for p in programs], pa.int32()),
        "reasoning_tokens": pa.array([p.reasoning for p in programs], pa.int32()),
        "probe_tokens": pa.array([p.probe_tokens for p in programs], pa.int32()),
        "tokens_generated": pa.array([p.tokens for p in programs], pa.int32()),
        "stop_position_tokens": pa.array([p.stop_at for p in programs], pa.int32()),
        "answer": pa.array([p.answer for p in programs], pa.string()),
        "gold_answer": [p.q.gold_answer for p in programs],
        "is_correct": [p.answer == p.q.gold_answer for p in programs],
        "met_deadline": latency <= deadline,
    })


def program_summary(progs: pd.DataFrame) -> dict:
    """Program-level metrics: tokens, accuracy, deadline attainment, latency (sim and live)."""
    latency = progs.finish_s - progs.arrival_s
    return {"programs": int(len(progs)),
            "tokens_generated": int(progs.tokens_generated.sum()),
            "tokens_per_program": float(progs.tokens_generated.mean()),
            "accuracy": float(progs.is_correct.mean()),
            "slo_attainment": float(progs.met_deadline.mean()),
            "program_latency_s": stats(latency),
            "finish_time_fairness": finish_time_fairness(progs)}


def finish_time_fairness(progs: pd.DataFrame) -> dict:
    """Finish-time fair share rho = latency / deadline per program: mean, P90 and max."""
    rho = ((progs.finish_s - progs.arrival_s) / progs.deadline_s).to_numpy()
    return {"mean": float(rho.mean()), "p90": float(np.percentile(rho, 90)),
            "max": float(rho.max())}


def compare(sim_programs, live_programs) -> dict:
    """Decision agreement and sim-vs-live errors of two programs tables (pandas)."""
    s = sim_programs.set_index("program_id").sort_index()
    v = live_programs.set_index("program_id").loc[s.index]
    same_stop = (s.stop_position_tokens.fillna(-1).astype(int) ==
                 v.stop_position_tokens.fillna(-1).astype(int)) & (s.paths == v.paths)
    ss, vs = program_summary(s.reset_index()), program_summary(v.reset_index())

    def err(a: float, b: float) -> float:
        return float((a - b) / b) if b else float("nan")

    return {
        "programs": int(len(s)),
        "decision_agreement": float(same_stop.mean()),
        "answer_agreement": float((s.answer.fillna("") == v.answer.fillna("")).mean()),
        "sim": ss, "live": vs,
        "error": {"tokens_per_program": err(ss["tokens_per_program"], vs["tokens_per_program"]),
                  "accuracy": ss["accuracy"] - vs["accuracy"],
                  "slo_attainment": ss["slo_attainment"] - vs["slo_attainment"],
                  **{f"program_latency_{k}": err(ss["program_latency_s"][k],
                                                 vs["program_latency_s"][k])
                     for k in ("mean", "p50", "p90", "p99")}},
    }

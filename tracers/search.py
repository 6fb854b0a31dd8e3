"""Multi-path reasoning programs (SC, MCTS, Rebase) on real vLLM: `trace branches` and live replay.

A program answers one question by a search over reasoning paths (`policies.search`). Every
request's prompt is the question plus the path it extends (prefix-cached); every request carries
a seed derived from the program's seed and the request's index within the program, so a program
is a deterministic function of its seed and its decisions, and a live replay with the same policy
reproduces the trace request for request unless batching changes the numerics.

- sc: independent samples to the end, `per_round` at a time.
- mcts: one request per iteration, from the UCT-selected node to an answer (the rollout); its
  first reasoning step (line) becomes the new tree node.
- rebase: one request per new node, a single reasoning step (stop at the newline).

Rewards are the model's own path likelihood (`path_reward`, from the sampled tokens' raw
log-probabilities returned with the generation: no extra request), never the gold answer.
`trace branches` runs every program to its cap and records every node (the `branches` table), so
any stop policy can be replayed counterfactually in the simulator.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from policies.search import (NodeStats, SearchBudget, path_reward, program_answer,
                             rebase_children, uct_select)
from traces.provenance import run_row
from traces.store import TraceWriter
from tracers.engine import check_model, reasoning_engine
from tracers.probes import chunk_seed, request_seed
from tracers.testbed import tasks

METHOD_INDEX = {"sc": 1, "mcts": 2, "rebase": 3}  # part of each program's seed


@dataclass(frozen=True)
class SearchSettings:
    """How a search program generates (shared by the tracer and the live replay)."""

    budget_tokens: int = 256
    """reasoning tokens per path"""
    step_tokens: int = 32
    """longest reasoning step (rebase); a step ends at a newline"""
    temperature: float = 0.7
    rebase_temperature: float = 0.05
    """softmax temperature over path rewards (rewards lie in (0, 1])"""
    exploration: float = 0.3
    """UCT exploration constant"""


@dataclass(frozen=True)
class BranchWorkload:
    """Which questions and programs `trace branches` records."""

    questions_per_cell: int = 6
    sc_samples: int = 16
    mcts_iterations: int = 16
    rebase_widths: tuple[int, ...] = (4, 8, 16)
    methods: tuple[str, ...] = ("sc", "mcts", "rebase")
    settings: SearchSettings = SearchSettings()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.questions_per_cell < 1 or self.sc_samples < 1 or self.mcts_iterations < 1 or \
                not self.rebase_widths or min(self.rebase_widths) < 1:
            raise ValueError("trace branches: questions, samples, iterations and widths must be "
                             ">= 1")
        unknown = set(self.methods) - set(METHOD_INDEX)
        if unknown or not self.methods:
            raise ValueError(f"trace branches: unknown method {sorted(unknown)}; expected some "
                             f"of {list(METHOD_INDEX)}")


def program_name(question_id: str, method: str, cap: int) -> str:
    """The id of a traced search program: question, method and resource cap."""
    return f"{question_id}-{method}{cap}"


@dataclass
class _Node:
    node_id: int
    parent: int | None
    depth: int
    ids: list                 # reasoning token ids of the path through this node
    text: str                 # its text
    logprob_sum: float = 0.0  # over every generated token of the path
    tokens: int = 0           # generated tokens of the path
    terminal: bool = False    # an answer, end of sequence or the token budget
    reward: float = 0.0       # path reward (rebase allocation)
    visits: int = 0           # mcts
    value_sum: float = 0.0


@dataclass
class Gen:
    """A request a program wants: extend node `parent` by one step, or to the end."""

    program: "SearchProgram"
    parent: int
    step: bool
    index: int
    """request index within the program (its seed)"""
    prompt_ids: list


@dataclass
class SearchProgram:
    """One SC/MCTS/Rebase program on the engine: decides its requests and when it is done."""

    key: str
    method: str
    policy: SearchBudget
    prompt_ids: list
    seed: int
    settings: SearchSettings
    nodes: dict = field(default_factory=dict)       # node id (request index + 1) -> node
    solutions: list = field(default_factory=list)   # (request index, answer, reward)
    rows: list = field(default_factory=list)        # one branches row per request
    requests: int = 0
    tokens: int = 0
    pending: int = 0
    level: int = 0
    solved_before: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.nodes[0] = _Node(0, None, 0, [], "")

    # Solutions in request order, not completion order: decisions do not depend on timing.
    @property
    def answers(self) -> list:
        return [a for _, a, _ in sorted(self.solutions)]

    @property
    def rewards(self) -> list:
        return [r for _, _, r in sorted(self.solutions)]

    def answer(self) -> str | None:
        """The program's answer from its solutions so far."""
        return program_answer(self.method, self.answers, self.rewards)

    def seed_of(self, gen: Gen) -> int:
        """The sampling seed of one of this program's requests."""
        return chunk_seed(self.seed, gen.index)

    def _gen(self, parent: int, step: bool) -> Gen:
        g = Gen(self, parent, step, self.requests, self.prompt_ids + self.nodes[parent].ids)
        self.requests += 1
        self.pending += 1
        return g

    def start(self) -> list[Gen]:
        """The first requests."""
        if self.method == "sc":
            return [self._gen(0, False) for _ in range(self._sc_round())]
        if self.method == "mcts":
            return [self._gen(0, False)]
        return [self._gen(0, True) for _ in range(self.policy.cap)]

    def _sc_round(self) -> int:
        left = self.policy.cap - self.requests
        return max(0, min(self.policy.per_round or left, left))

    def on_done(self, gen: Gen, token_ids: list, logprobs: list, pieces: list, eos: bool
                ) -> list[Gen]:
        """A request finished (its tokens, their log-probabilities and texts, whether it ended
        with end-of-sequence): record it, then decide what comes next (maybe nothing)."""
        self.pending -= 1
        self.tokens += len(token_ids)
        parent = self.nodes[gen.parent]
        text = "".join(pieces)
        keep = len(token_ids) - 1 if eos and token_ids else len(token_ids)  # EOS is not re-sent
        total = parent.tokens + len(token_ids)
        answer = tasks.extract_boxed(parent.text + text)
        ended = eos or answer is not None or total >= self.settings.budget_tokens
        reward = path_reward(parent.logprob_sum + sum(logprobs), total)
        cut = len(token_ids)
        if self.method == "mcts":
            # The rollout's first step (through its first newline) is the new tree node; the
            # rest of the rollout only scores the solution.
            cut = next((i + 1 for i, p in enumerate(pieces) if "\n" in p), len(token_ids))
        node = _Node(gen.index + 1, gen.parent, parent.depth + 1,
                     parent.ids + token_ids[:min(cut, keep)], parent.text + "".join(pieces[:cut]),
                     parent.logprob_sum + sum(logprobs[:cut]), parent.tokens + cut,
                     terminal=ended and cut == len(token_ids), reward=reward)
        self.nodes[node.node_id] = node
        if ended:
            self.solutions.append((gen.index, answer, reward))
        if self.method == "mcts":
            p = node.node_id
            while p is not None:  # back the solution's reward up to the root
                self.nodes[p].visits += 1
                self.nodes[p].value_sum += reward
                p = self.nodes[p].parent
        self.rows.append({"branch_id": node.node_id, "parent_branch_id": gen.parent or None,
                          "depth": node.depth, "round": self._round(gen),
                          "answer": answer if ended else None,
                          "output_tokens": len(token_ids),
                          "prompt_tokens": len(gen.prompt_ids),
                          "reward": reward, "is_leaf": ended,
                          "request_seed": self.seed_of(gen)})
        if self.pending:
            return []  # a round (sc) or level (rebase) is still in flight
        return self._checkpoint()

    def _round(self, gen: Gen) -> int:
        if self.method == "rebase":
            return self.nodes[gen.parent].depth
        if self.method == "sc" and self.policy.per_round:
            return gen.index // self.policy.per_round
        return gen.index

    def _checkpoint(self) -> list[Gen]:
        n, before = len(self.solutions), self.solved_before
        self.solved_before = n
        if n > before and self.policy.should_stop(self.answers, self.rewards, before):
            self.done = True
            return []
        if self.method == "sc":
            gens = [self._gen(0, False) for _ in range(self._sc_round())]
        elif self.method == "mcts":
            ids = sorted(self.nodes)
            stats = [NodeStats(self.nodes[i].visits, self.nodes[i].value_sum,
                               not self.nodes[i].terminal) for i in ids]
            gens = [] if self.requests >= self.policy.cap or \
                not any(s.expandable for s in stats) else \
                [self._gen(ids[uct_select(stats, self.requests, self.settings.exploration)],
                           False)]
        else:
            self.level += 1
            frontier = [self.nodes[i] for i in sorted(self.nodes)
                        if self.nodes[i].depth == self.level and not self.nodes[i].terminal]
            counts = rebase_children([nd.reward for nd in frontier], max(self.policy.cap - n, 0),
                                     self.settings.rebase_temperature)
            gens = [self._gen(nd.node_id, True) for nd, k in zip(frontier, counts)
                    for _ in range(k)]
        self.done = not gens
        return gens


# ------------------------------------------------------------------ the engine loop
def _params(SamplingParams, g: Gen, settings: SearchSettings):
    prog = g.program
    left = settings.budget_tokens - prog.nodes[g.parent].tokens
    if g.step:
        return SamplingParams(max_tokens=min(settings.step_tokens, left),
                              temperature=settings.temperature, top_p=1.0, seed=prog.seed_of(g),
                              stop=["\n"], include_stop_str_in_output=True, logprobs=0)
    return SamplingParams(max_tokens=left, temperature=settings.temperature, top_p=1.0,
                          seed=prog.seed_of(g), logprobs=0)


def run_programs(rec, programs: list[SearchProgram], arrival_s: list[float], SamplingParams,
                 priority=None, on_done=None) -> None:
    """Drive programs on a recorded engine: submit at arrival, feed completions, until all done.

    `priority(program)` gives each request's priority (vLLM priority scheduling);
    `on_done(program, now_s)` is called once per finished program.
    """
    pending: dict[str, Gen] = {}

    def submit(gens: list[Gen]) -> None:
        for g in gens:
            rid = f"{g.program.key}-r{g.index}"
            pending[rid] = g
            rec.add(rid, g.prompt_ids, _params(SamplingParams, g, g.program.settings),
                    priority=priority(g.program) if priority else 0, program_id=g.program.key,
                    role="main")

    done, next_arrival = 0, 0
    while done < len(programs):
        while next_arrival < len(programs) and arrival_s[next_arrival] <= rec.now_s():
            submit(programs[next_arrival].start())
            next_arrival += 1
        if not pending:  # idle until the next arrival
            if next_arrival == len(programs):
                raise RuntimeError("search programs unfinished with nothing in flight (a bug)")
            time.sleep(max(0.0, arrival_s[next_arrival] - rec.now_s()))
            continue
        for out in rec.step():
            if not out.finished or out.request_id not in pending:
                continue
            g = pending.pop(out.request_id)
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [lp[t] for t, lp in zip(ids, o.logprobs)]
            eos = o.finish_reason == "stop" and o.stop_reason is None
            submit(g.program.on_done(g, ids, [x.logprob for x in lps],
                                     [x.decoded_token or "" for x in lps], eos))
            if g.program.done:
                done += 1
                if on_done is not None:
                    on_done(g.program, rec.now_s())


def program_seed(seed: int, question_index: int, method: str) -> int:
    """A search program's seed: the same whatever its cap, so smaller caps replay a prefix."""
    return request_seed(seed, question_index, 100 + METHOD_INDEX[method])


def question_id(index: int, item: tasks.Item) -> str:
    """The id of the index-th held-out question (as `trace probes` names it)."""
    return f"q{index:04d}-{item.family}-{item.level}"


# ------------------------------------------------------------------ trace branches
def trace_branches(model: str, out_dir: str | Path, workload: BranchWorkload,
                   resume: bool = False, kv_cache_gb: float = 1.0, batch_questions: int = 8,
                   progress: bool = True) -> dict:
    """Run every question's SC/MCTS/Rebase programs to their caps; record every request."""
    model_dir = check_model(model, "auto")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not resume:
        raise ValueError(f"{out_dir}: not empty; pass --resume to continue it or choose a new "
                         "directory")
    from vllm import SamplingParams

    from tracers.recorder import StepRecorder

    engine = reasoning_engine(model_dir, workload.seed, kv_cache_gb)
    params = asdict(workload)
    run = run_row("branches", engine.engine_dist, engine.engine_version, engine.device,
                  engine.device_count, str(model_dir), engine.config_hash, engine.dtype, "auto",
                  workload.seed, {"workload": params, "engine": engine.params()})
    writer = TraceWriter(out_dir, run, resume=resume)
    done_units = writer.done_units()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    held = tasks.items(workload.seed, workload.questions_per_cell * n_cells)
    tok = engine.engine.get_tokenizer()
    t0 = time.perf_counter()
    rec = StepRecorder(engine, writer, t0, record_tokens=False)
    caps = {"sc": (workload.sc_samples,), "mcts": (workload.mcts_iterations,),
            "rebase": workload.rebase_widths}
    stats = {"programs": 0, "requests": 0}
    from rich.progress import Progress

    # One unit per batch of questions: a killed trace resumes at the first unfinished batch.
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("tracing branches", total=len(held))
        for b0 in range(0, len(held), batch_questions):
            unit = f"b{b0:04d}"
            batch = list(enumerate(held))[b0:b0 + batch_questions]
            if unit in done_units:
                bar.advance(task, len(batch))
                continue
            programs, meta = [], []
            for qi, item in batch:
                prompt = tok.encode(item.prompt, add_special_tokens=False)
                for method in workload.methods:
                    for cap in caps[method]:
                        qid = question_id(qi, item)
                        programs.append(SearchProgram(
                            program_name(qid, method, cap), method, SearchBudget(cap), prompt,
                            program_seed(workload.seed, qi, method), workload.settings))
                        meta.append((qid, item, method, cap))
            run_programs(rec, programs, [0.0] * len(programs), SamplingParams)
            for prog, (qid, item, method, cap) in zip(programs, meta):
                for row in prog.rows:
                    writer.add("branches", program_id=prog.key, question_id=qid, method=method,
                               cap=cap, difficulty=item.level, gold_answer=item.answer,
                               is_correct=row["answer"] == item.answer, **row)
                stats["requests"] += len(prog.rows)
            stats["programs"] += len(programs)
            writer.flush(unit)
            bar.advance(task, len(batch))
    stats["wall_s"] = round(time.perf_counter() - t0, 2)
    return stats


# ------------------------------------------------------------------ live replay
def replay_search(plans: list, method: str, policy: SearchBudget, scheduler_spec,
                  trace_dir: str | Path, out_dir: str | Path, max_num_seqs: int | None = None,
                  seed: int = 0, model: str | None = None, config_json: str = "{}") -> list[dict]:
    """Run search programs live on one vLLM engine with the given stop policy; the programs rows.

    `plans` are `tracers.program_replay.ProgramPlan`s (the simulator's draw). Each program runs
    with its traced seed and the trace's settings, so its requests reproduce the traced ones; its
    rewards and answers come from the live outputs.
    """
    from policies.scheduling import ProgramView, make_scheduler
    from traces.store import read_run, read_table
    from tracers.program_replay import _LiveProgram, _write_programs

    scheduler = make_scheduler(scheduler_spec)
    trace_run = read_run(trace_dir)
    params = json.loads(trace_run["params_json"])
    twl = params["workload"]
    settings = SearchSettings(**twl["settings"])
    model_dir = check_model(model or trace_run["model_id"], "auto")
    engine = reasoning_engine(model_dir, int(twl["seed"]), float(params["engine"]["kv_cache_gb"]),
                              max_num_seqs, "fcfs" if scheduler_spec == "fcfs" else "priority")
    run = run_row("program_replay", engine.engine_dist, engine.engine_version, engine.device,
                  engine.device_count, str(model_dir), engine.config_hash, engine.dtype, "auto",
                  seed, {"config": json.loads(config_json), "engine": engine.params(),
                         "branches_trace": str(trace_dir)})
    writer = TraceWriter(Path(out_dir), run)
    from vllm import SamplingParams

    from tracers.recorder import StepRecorder

    tok = engine.engine.get_tokenizer()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(int(twl["seed"]), int(twl["questions_per_cell"]) * n_cells)
    programs, live = [], []
    for i, plan in enumerate(plans):
        qi = int(plan.question_id[1:5])  # question ids are q{index:04d}-family-level
        prompt = tok.encode(items[qi].prompt, add_special_tokens=False)
        programs.append(SearchProgram(plan.program_id, method, policy, prompt,
                                      program_seed(int(twl["seed"]), qi, method), settings))
        live.append(_LiveProgram(i, plan, prompt, items[qi].answer))
    index = {p.key: i for i, p in enumerate(programs)}
    finished: list[int] = []
    engine.warm_up()
    rec = StepRecorder(engine, writer, time.perf_counter(), record_tokens=False)

    def priority(prog: SearchProgram) -> int:
        plan = live[index[prog.key]].plan
        return scheduler.priority(ProgramView(index[prog.key], rec.now_s() - plan.arrival_s,
                                              prog.tokens), finished)

    def on_done(prog: SearchProgram, now_s: float) -> None:
        lp = live[index[prog.key]]
        lp.finish_s, lp.answer = now_s, prog.answer()
        lp.tokens = lp.reasoning = prog.tokens
        lp.paths = [None] * prog.requests
        finished.append(prog.tokens)

    run_programs(rec, programs, [p.arrival_s for p in plans], SamplingParams, priority, on_done)
    writer.flush("all")
    _write_programs(writer, live, method, policy, scheduler_spec)
    writer.flush("programs")
    return read_table(out_dir, "programs").to_pylist()

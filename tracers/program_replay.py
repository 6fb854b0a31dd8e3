"""Live replay of a program workload on real vLLM, driven by the same policy objects as the sim.

The programs (arrivals, questions, samples, deadlines) are drawn exactly as `sim.programs` draws
them. Each reasoning path is decoded in chunks of the probes trace's stride with the trace's
per-chunk seeds, so a path reproduces its traced trajectory token for token unless batching
changes the numerics. Probes are extra requests sharing the prefix (prefix caching); a stop
aborts the path's in-flight chunk and probes; the scheduler's priorities go to vLLM's priority
scheduling. Probe answers and final answers are read from the live text, never from the trace.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from policies.allocation import SelfConsistency, TokenBudget, describe_policy
from policies.certaindex import PROBE_SUFFIX, Probe, ProbeConsistency, probe_from_text
from policies.scheduling import ProgramView, make_scheduler
from policies.search import majority_vote
from traces.provenance import run_row
from traces.store import TraceWriter, read_run, read_table
from tracers.engine import check_model, reasoning_engine
from tracers.probes import chunk_seed
from tracers.testbed import tasks


@dataclass(frozen=True)
class ProgramPlan:
    """One program to run live, as the simulator drew it."""

    program_id: str
    question_id: str
    difficulty: int | None
    arrival_s: float
    deadline_s: float
    sample_ids: tuple[int, ...]
    """traced samples its paths replay, in launch order"""


@dataclass
class _LivePath:
    prog: "_LiveProgram"
    seed: int
    limit: int
    probe_every: int
    ids: list = field(default_factory=list)
    text: str = ""
    tokens: int = 0
    chunks: int = 0
    probes: list = field(default_factory=list)
    next_probe: list = field(default_factory=list)
    returned: dict = field(default_factory=dict)
    in_flight: set = field(default_factory=set)
    ended: bool = False
    answer: str | None = None


@dataclass
class _LiveProgram:
    idx: int
    plan: ProgramPlan
    prompt_ids: list
    gold: str
    paths: list = field(default_factory=list)
    tokens: int = 0
    reasoning: int = 0
    probe_tokens: int = 0
    round_left: int = 0
    started: bool = False
    finish_s: float = float("nan")
    answer: str | None = None
    stop_at: int | None = None


def replay_programs(plans: list[ProgramPlan], method: str, policy, scheduler_spec,
                    trace_dir: str | Path, stride_tokens: int, out_dir: str | Path,
                    max_num_seqs: int | None = None, seed: int = 0, model: str | None = None,
                    config_json: str = "{}") -> list[dict]:
    """Run the programs live on one vLLM engine; write requests/steps/programs; the rows."""
    scheduler = make_scheduler(scheduler_spec)
    trace_run = read_run(trace_dir)
    params = json.loads(trace_run["params_json"])
    twl, teng = params["workload"], params["engine"]
    model_dir = check_model(model or trace_run["model_id"], "auto")
    engine = reasoning_engine(
        model_dir, int(twl["seed"]), float(teng["kv_cache_gb"]), max_num_seqs,
        "fcfs" if scheduler_spec == "fcfs" else "priority", int(teng["max_model_len"]),
        int(teng["block_size"]))
    run = run_row("program_replay", engine.engine_dist, engine.engine_version, engine.device,
                  engine.device_count, str(model_dir), engine.config_hash, engine.dtype, "auto",
                  seed, {"config": json.loads(config_json), "engine": engine.params(),
                         "probes_trace": str(trace_dir)})
    out_dir = Path(out_dir)
    writer = TraceWriter(out_dir, run)
    from vllm import SamplingParams

    from tracers.recorder import StepRecorder

    tok = engine.engine.get_tokenizer()

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    suffix_ids = encode(PROBE_SUFFIX)
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(int(twl["seed"]), int(twl["questions_per_cell"]) * n_cells)
    tr = read_table(trace_dir, "trajectories").to_pandas()
    seeds = dict(zip(zip(tr.question_id, tr.sample_id), tr.request_seed))
    programs = []
    for i, p in enumerate(plans):
        item = items[int(p.question_id[1:5])]  # question ids are q{index:04d}-family-level
        programs.append(_LiveProgram(i, p, encode(item.prompt), item.answer))
    engine.warm_up()
    t0 = time.perf_counter()
    rec = StepRecorder(engine, writer, t0, record_tokens=False)
    pending: dict[str, tuple] = {}   # request id -> (path, kind, position)
    counter = itertools.count()
    finished_tokens: list[int] = []
    done = 0

    def submit(path: _LivePath, kind: str, ids: list, sp, position: int) -> None:
        prog = path.prog
        view = ProgramView(prog.idx, rec.now_s() - prog.plan.arrival_s, prog.tokens)
        rid = f"{prog.plan.program_id}-{kind}{next(counter)}"
        pending[rid] = (path, kind, position)
        path.in_flight.add(rid)
        rec.add(rid, ids, sp, priority=scheduler.priority(view, finished_tokens),
                program_id=prog.plan.program_id, role="main" if kind == "c" else "probe")

    def send_chunk(path: _LivePath) -> None:
        n = min(stride_tokens, path.limit - path.tokens)
        sp = SamplingParams(max_tokens=n, temperature=float(twl["temperature"]), top_p=1.0,
                            seed=chunk_seed(path.seed, path.chunks))
        submit(path, "c", path.prog.prompt_ids + path.ids, sp, path.tokens)

    def send_probe(path: _LivePath) -> None:
        sp = SamplingParams(max_tokens=int(twl["probe_tokens"]),
                            temperature=float(twl["probe_temperature"]),
                            top_p=float(twl["probe_top_p"]),
                            seed=chunk_seed(path.seed, -1 - path.chunks))
        path.next_probe.append(path.tokens)
        submit(path, "p", path.prog.prompt_ids + path.ids + suffix_ids, sp, path.tokens)

    def launch(prog: _LiveProgram, n: int) -> None:
        prog.round_left = n
        pol = policy
        for _ in range(n):
            sample = prog.plan.sample_ids[len(prog.paths)]
            limit = int(twl["budget_tokens"])
            if isinstance(pol, TokenBudget):
                limit = min(limit, pol.budget_tokens)
            path = _LivePath(prog, int(seeds[(prog.plan.question_id, sample)]), limit,
                             pol.every_tokens if isinstance(pol, ProbeConsistency) else 0)
            prog.paths.append(path)
            send_chunk(path)

    def end_path(path: _LivePath, answer: str | None) -> None:
        nonlocal done
        path.ended = True
        path.answer = answer
        for rid in list(path.in_flight):  # its tokens are counted from the requests table
            rec.abort(rid)
            pending.pop(rid)
            path.in_flight.discard(rid)
        prog = path.prog
        prog.round_left -= 1
        if prog.round_left > 0:
            return
        if isinstance(policy, SelfConsistency):
            answers = [p.answer for p in prog.paths]
            more = policy.next_round(answers, [p.tokens for p in prog.paths])
            if more > 0:
                launch(prog, more)
                return
            prog.answer = majority_vote(answers)
        else:
            prog.answer = answer
        prog.finish_s = rec.now_s()
        finished_tokens.append(prog.tokens)
        done += 1

    def account(rid: str, n_tokens: int) -> tuple:
        path, kind, position = pending.pop(rid)
        path.in_flight.discard(rid)
        prog = path.prog
        prog.tokens += n_tokens
        if kind == "p":
            prog.probe_tokens += n_tokens
        else:
            prog.reasoning += n_tokens
        return path, kind, position

    eos = tok.eos_token_id
    next_arrival = 0
    while done < len(programs):
        now = rec.now_s()
        while next_arrival < len(programs) and programs[next_arrival].plan.arrival_s <= now:
            prog = programs[next_arrival]
            prog.started = True
            launch(prog, policy.first_round() if isinstance(policy, SelfConsistency)
                   else 1)
            next_arrival += 1
        if not pending:  # idle until the next arrival
            if next_arrival == len(programs):
                raise RuntimeError("live replay: programs unfinished with nothing in flight")
            time.sleep(max(0.0, programs[next_arrival].plan.arrival_s - rec.now_s()))
            continue
        for out in rec.step():
            if not out.finished or out.request_id not in pending:
                continue
            ids = list(out.outputs[0].token_ids)
            path, kind, position = account(out.request_id, len(ids))
            if path.ended:
                continue
            text = out.outputs[0].text
            if kind == "c":
                path.tokens += len(ids)
                if ids and ids[-1] == eos:
                    ids.pop()
                path.ids += ids
                path.text += text
                path.chunks += 1
                if out.outputs[0].finish_reason == "stop" or path.tokens >= int(
                        twl["budget_tokens"]):
                    end_path(path, tasks.extract_boxed(path.text))
                elif path.tokens >= path.limit:
                    send_probe(path)  # the budget's answer probe
                else:
                    if path.probe_every and path.tokens % path.probe_every == 0:
                        send_probe(path)
                    send_chunk(path)
                continue
            probe = probe_from_text(position, text)
            if not path.probe_every:
                end_path(path, probe.answer or None)
                continue
            path.returned[position] = probe
            while path.next_probe and path.next_probe[0] in path.returned:
                p: Probe = path.returned.pop(path.next_probe.pop(0))
                path.probes.append(p)
                if policy.should_stop(path.probes):
                    path.prog.stop_at = p.position_tokens
                    end_path(path, p.answer)
                    break
    # Aborted requests were emitted by the recorder with their partial output: count them.
    writer.flush("all")
    req = read_table(out_dir, "requests").to_pandas()
    for prog in programs:
        pid = prog.plan.program_id
        got = req[req.program_id == pid]
        prog.tokens = int(got.output_tokens.sum())
        prog.probe_tokens = int(got[got.role == "probe"].output_tokens.sum())
        prog.reasoning = prog.tokens - prog.probe_tokens
    _write_programs(writer, programs, method, policy, scheduler_spec)
    writer.flush("programs")
    return read_table(out_dir, "programs").to_pylist()


def _write_programs(writer: TraceWriter, programs: list, method: str, policy, scheduler) -> None:
    sched = scheduler if isinstance(scheduler, str) else json.dumps(scheduler, sort_keys=True)
    for prog in programs:
        latency = prog.finish_s - prog.plan.arrival_s
        writer.add("programs", program_id=prog.plan.program_id,
                   question_id=prog.plan.question_id, method=method,
                   policy=describe_policy(policy), scheduler=sched,
                   difficulty=prog.plan.difficulty, arrival_s=prog.plan.arrival_s,
                   finish_s=prog.finish_s, deadline_s=prog.plan.deadline_s,
                   paths=len(prog.paths), reasoning_tokens=prog.reasoning,
                   probe_tokens=prog.probe_tokens, tokens_generated=prog.tokens,
                   stop_position_tokens=prog.stop_at, answer=prog.answer,
                   gold_answer=prog.gold, is_correct=prog.answer == prog.gold,
                   met_deadline=bool(latency <= prog.plan.deadline_s))


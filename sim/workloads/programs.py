"""Program workloads in the simulator: traced questions arrive, their programs run on replicas.

Programs (`programs/`) arrive as a Poisson process; each is pinned to one replica by the router
(its prefix cache lives there) and each request gets a priority from the inter-program scheduler
(`policies.scheduling`). Programs are the objects the live runner drives (`programs/`); the
driver (`sim.workloads.program_driver`) answers their requests from the trace: cot/sc on a probes
trace, sc/mcts/rebase search on a branches trace. The cost grows with requests (one per chunk, probe
or search step), not tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from policies.allocation import describe_policy
from policies.scheduling import make_scheduler
from programs.reasoning import ReasoningProgram, ReasoningSetup
from programs.records import describe_scheduler, program_row
from programs.search import SearchProgram, SearchSettings, program_seed
from programs.a1_traced import A1Bank
from programs.tot_traced import ToTBank
from programs.traced import QuestionBank
from programs.workload import draw_seed, load_bank, plan_programs, program_workload
from sim.families.a1.driver import a1_results, build_a1_runs
from sim.families.seed.driver import build_tot_runs, tot_results
from sim.engine.cluster import Cluster, build_replicas
from sim.kernels.plain import why_not_compiled_programs
from sim.metrics import summarize
from sim.workloads.program_driver import ProgramDriver, SimProgram, TracedReasoning, TracedSearch
from sim.program_metrics import program_summary
from sim.engine.request_state import Req, Results
from sim.engine.tables import SimResult, finish_reasons, kv_usage, steps_table
from traces import ids


def max_requests(q, method: str, policy, stride: int) -> int:
    """Upper bound on the requests a cot/sc program of this question sends (buffer sizing)."""
    samples = q.samples if method == "sc" else (max(q.samples, key=lambda t: t.reasoning_tokens),)
    if method == "sc":
        samples = samples[:policy.samples]
    return sum(2 * (-(-t.reasoning_tokens // stride)) + 2 for t in samples)

def reasoning_setup(bank: QuestionBank) -> ReasoningSetup:
    """The generation settings of a probes trace's paths (what the simulator needs of them)."""
    return ReasoningSetup(bank.stride_tokens, bank.budget_tokens, bank.suffix_tokens)


def build_runs(wl, bank, plans) -> tuple[list[SimProgram], int, object]:
    """The program objects of planned programs, a bound on their requests, and their oracle."""
    if isinstance(bank, A1Bank):
        return build_a1_runs(wl, bank, plans)
    if isinstance(bank, ToTBank):
        return build_tot_runs(wl, bank, plans)
    by_id = {q.question_id: q for q in bank.questions}
    if not isinstance(bank, QuestionBank):
        settings = SearchSettings(**bank.settings)
        runs = [SimProgram(p, SearchProgram(p.program_id, wl.method, wl.policy, None,
                                            program_seed(bank.seed,
                                                         ids.question_index(p.question_id),
                                                         wl.method), settings),
                           by_id[p.question_id]) for p in plans]
        return runs, sum(len(r.question.requests) for r in runs), TracedSearch()
    setup = reasoning_setup(bank)
    runs = []
    for p in plans:
        q = by_id[p.question_id]
        seed = {t.sample_id: t.request_seed for t in q.samples}
        runs.append(SimProgram(p, ReasoningProgram(wl.method, wl.policy, setup, q.prompt_tokens,
                                                   p.sample_ids,
                                                   tuple(seed[s] for s in p.sample_ids)), q))
    capacity = sum(max_requests(r.question, wl.method, wl.policy, bank.stride_tokens)
                   for r in runs)
    return runs, capacity, TracedReasoning()


def simulate_programs(cfg, fast_forward: bool = True, lazy: bool = True,
                      compiled: bool = True) -> SimResult:
    """Run a program workload (config `workload.programs`) and return a SimResult; its
    replicas compiled where `sim.kernels.programs` covers them (compiled=False: SimPy)."""
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    bank = load_bank(wl)
    scheduler = make_scheduler(cfg.scheduler)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, sum(g.count for g in cfg.replicas)))
    runs, capacity, oracle = build_runs(wl, bank, plans)

    specs = build_replicas(cfg)
    on_kernel = fast_forward and lazy and compiled and why_not_compiled_programs(
        cfg, specs, isinstance(bank, QuestionBank), capacity) is None
    if on_kernel:
        from sim.kernels.programs import CompiledCluster  # numba: only on this path

        cluster = CompiledCluster(cfg, capacity, specs)
    else:
        def on_finish(_replica_id: int, r: Req) -> None:
            driver.on_request_done(r.idx, r.generated, r.aborted)

        cluster = Cluster(cfg, capacity, on_finish, fast_forward, lazy, specs)
    env = cluster.env

    def on_program_done(run) -> None:
        for rid, tokens in run.booked.items():
            cluster.outstanding[rid] -= tokens
            cluster.in_flight[rid] -= 1

    driver = ProgramDriver(cluster, oracle, scheduler, on_program_done)
    if on_kernel:
        cluster.on_done = driver.on_request_done

    def arrivals():
        for run in runs:
            gap = run.plan.arrival_s - env.now
            if gap > 0:
                yield env.timeout(gap)
            q = run.question
            # Pinned on arrival to a target replica by its expected work (routing estimate).
            driver.pin(run, "target", q.prompt_tokens, q.prompt_tokens + q.expected_tokens)
            driver.start(run)

    # described once: every row of the workload shares them
    policy = describe_policy(wl.policy)
    sched = describe_scheduler(cfg.scheduler)

    def row(run) -> dict:
        return program_row(run.plan, run.program, run.finish_s, wl.method, policy, sched,
                           run.question.gold_answer)

    rows: dict[int, dict] = {}
    if isinstance(bank, QuestionBank):  # nothing reads a cot/sc program after its row
        def closed(run) -> None:
            rows[run.idx] = row(run)
            run.program = run.traced = None  # a million programs' paths need not stay

        driver.on_program_closed = closed
    cluster.run(arrivals())
    unfinished = [r.idx for r in runs if np.isnan(r.finish_s)]
    if unfinished:
        raise RuntimeError(f"simulation ended with program {unfinished[0]} unfinished (a bug: "
                           "please report with the config)")
    requests = _requests_table(driver, cluster.res)
    progs = programs_table([rows[r.idx] if r.idx in rows else row(r) for r in runs])
    # the timing columns only: pandas would make a Python string of every id
    summary = summarize(requests.select(_TIMES).to_pandas(), cfg.slo_ttft_s, cfg.slo_tpot_s)
    summary.update(program_summary(progs.to_pandas()))
    summary.update(cluster.summary(cluster.res.events + wl.count, summary["makespan_s"]))
    summary["kv_usage_mean"] = kv_usage(cluster.res)
    summary["simulator"] = "compiled" if on_kernel else "simpy"
    steps = steps_table(cluster.res) if cfg.write_steps else None
    tables = {}
    if isinstance(bank, A1Bank):
        tables, extra = a1_results(runs, driver, cluster, summary["makespan_s"])
        summary.update(extra)
    if isinstance(bank, ToTBank):
        tables, extra = tot_results(runs, driver, cluster, summary["makespan_s"])
        summary.update(extra)
    cluster.close()
    return SimResult(requests, steps, summary, progs, tables)


_TIMES = ["arrival_s", "first_token_s", "finish_s", "output_tokens"]
"""the requests table's columns `summarize` reads"""


def _requests_table(driver, res: Results) -> pa.Table:
    owner = driver.owner
    n = len(owner)
    at = np.frombuffer(owner.program, np.int64)  # the program of each request
    names = pa.array([ids.program_id(i) for i in range(int(at.max()) + 1 if n else 0)],
                     pa.string())
    prog = names.take(at)
    role = pa.array([table for _, table in owner.roles], pa.string()).take(
        np.frombuffer(bytes(owner.role), np.uint8))  # (model, table) role codes
    # ids.chunk_id for the main role, else ids.probe_id, column-wise: "<program>-c<i>" or
    # "<program>-p<i>" (tests/test_programs.py holds them to traces.ids)
    request_id = pc.binary_join_element_wise(
        prog, pc.if_else(pc.equal(role, "main"), "-c", "-p"),
        pc.cast(pa.array(np.arange(n)), pa.string()), "")
    return pa.table({
        "request_id": request_id,
        "replica_id": res.replica_id[:n], "cell_id": pa.nulls(n, pa.string()),
        "program_id": prog, "role": role,
        "priority": res.priority[:n], "arrival_s": res.arrival_s[:n],
        "scheduled_s": res.scheduled_s[:n], "first_token_s": res.first_token_s[:n],
        "finish_s": res.finish_s[:n], "prompt_tokens": res.prompt_tokens[:n],
        "output_tokens": res.output_tokens[:n], "cached_prompt_tokens": res.cached_tokens[:n],
        "finish_reason": finish_reasons(res.aborted[:n]),
    })


def programs_table(rows: list[dict]) -> pa.Table:
    """One row per program (the `programs` schema, without run_id)."""
    col = {k: [r[k] for r in rows] for k in rows[0]}
    typed = {"difficulty": pa.int32(), "paths": pa.int32(), "reasoning_tokens": pa.int32(),
             "probe_tokens": pa.int32(), "tokens_generated": pa.int32(),
             "stop_position_tokens": pa.int32(), "answer": pa.string()}
    return pa.table({k: pa.array(v, typed[k]) if k in typed else v for k, v in col.items()})


def warm_compiled() -> float:
    """Compile the program kernel (or load it from numba's cache) with a tiny run; seconds."""
    from sim.config import parse_config, read_yaml

    examples = Path(__file__).resolve().parents[2] / "examples"
    d = read_yaml(examples / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"]["count"] = 4
    t0 = time.perf_counter()
    simulate_programs(parse_config(d, examples))
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"program kernel: ready ({warm_compiled():.1f} s)")

"""Program workloads in the simulator: traced questions arrive, their programs run on replicas.

Programs (`programs/`) arrive as a Poisson process; each is pinned to one replica by the router
(its prefix cache lives there) and each request gets a priority from the inter-program scheduler
(`policies.scheduling`). Programs are the objects the live runner drives (`programs/`); the
driver (`sim.workloads.program_driver`) answers their requests from the trace: cot/sc on a probes
trace, sc/mcts/rebase search on a branches trace, whose programs of one question send the same
rounds, decided once per question (`sim.workloads.program_templates`). The cost grows with
requests (one per chunk, probe or search step), not tokens.
"""

from __future__ import annotations

import time
from array import array
from operator import itemgetter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from policies.scheduling import make_scheduler
from programs.families import family_of
from programs.records import describe_policy, describe_scheduler, program_row
from programs.workload import draw_seed, load_bank, plan_programs
from sim.families.registry import sim_family
from sim.engine.cluster import Cluster, build_replicas, gc_paused
from sim.kernels.plain import why_not_compiled_programs
from sim.metrics import summarize, summarize_latencies
from sim.workloads.program_driver import ProgramDriver
from sim.workloads.program_templates import TemplateDriver
from sim.program_metrics import program_summary
from sim.engine.folded_requests import FoldedRequests, fold_results
from sim.engine.request_state import Req, Results
from sim.engine.tables import SimResult, cached_share, finish_reasons, kv_usage, steps_table
from traces import ids


INITIAL_ROWS = 1 << 20
"""result rows a SimPy program run starts with: `capacity` bounds its requests loosely (SC sends
~1/7 of it), so columns start at most this long and grow as requests are sent"""


def simulate_programs(cfg, fast_forward: bool = True, lazy: bool = True,
                      compiled: bool = True, templates: bool = True) -> SimResult:
    """Run a program workload (config `workload.programs`) and return a SimResult; its
    replicas compiled where `sim.kernels.programs` covers them (compiled=False: SimPy), a
    templated family's programs sent from templates (templates=False: request by request, the
    tables they equal)."""
    # the collector paused from the bank's load to the last table, as for the run: the trace's
    # nodes and the tables' columns are many acyclic objects that reference counting frees
    with gc_paused():
        return _simulate_programs(cfg, fast_forward, lazy, compiled, templates)


def _simulate_programs(cfg, fast_forward: bool, lazy: bool, compiled: bool,
                       templates: bool) -> SimResult:
    wl = cfg.programs
    family = sim_family(family_of(wl.method, wl.policy).name)
    bank = load_bank(wl)
    scheduler = make_scheduler(cfg.scheduler)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, sum(g.count for g in cfg.replicas)))
    runs, capacity, oracle = family.build_runs(wl, bank, plans)

    specs = build_replicas(cfg)
    why = why_not_compiled_programs(cfg, specs, family.compiles, capacity) \
        if fast_forward and lazy and compiled else None
    on_kernel = fast_forward and lazy and compiled and why is None
    if on_kernel:
        from sim.kernels.programs import CompiledCluster  # numba: only on this path

        cluster = CompiledCluster(cfg, capacity, specs)
    else:
        def on_finish(_replica_id: int, r: Req) -> None:
            driver.on_request_done(r.idx, r.generated, r.aborted)

        cluster = Cluster(cfg, min(capacity, INITIAL_ROWS), on_finish, fast_forward, lazy, specs)

    driver = (TemplateDriver if family.templated and templates else ProgramDriver)(
        cluster, oracle, scheduler, unbooker(cluster))
    if family.template_rows:
        driver.trows = array("q")
    if on_kernel:
        cluster.on_done = driver.on_request_done

    # described once: every row of the workload shares them
    policy = describe_policy(wl.policy)
    sched = describe_scheduler(cfg.scheduler)

    def row(run) -> dict:
        return program_row(run.plan, run.program, run.finish_s, wl.method, policy, sched,
                           run.question.gold_answer)

    rows: dict[int, dict] = {}
    if family.releases_programs:  # nothing reads such a program after its row
        def closed(run) -> None:
            rows[run.idx] = row(run)
            run.program = run.traced = None  # a million programs' paths need not stay

        driver.on_program_closed = closed
    folded = None if cfg.write_requests else _folded(family, runs, driver, on_kernel)
    _run(cluster, driver, runs, folded, on_kernel)
    requests = _requests_table(driver, cluster.res) if folded is None else None
    progs = programs_table([rows[r.idx] if r.idx in rows else row(r) for r in runs])
    summary = _summary(cfg, cluster, requests, progs)
    summary["simulator"] = "compiled" if on_kernel else "simpy"
    steps = steps_table(cluster.res) if cfg.write_steps else None
    tables = {}
    if family.results is not None:
        tables, extra = family.results(runs, driver, cluster, summary["makespan_s"])
        summary.update(extra)
    cluster.close()
    return SimResult(requests, steps, summary, progs, tables, why_simpy=why)


def _run(cluster, driver, runs: list, folded: FoldedRequests | None, on_kernel: bool) -> None:
    """Run the programs to their ends, folding their requests as they finish where the run
    keeps no requests table (SimPy's replicas keep every column: folded at once at the end)."""
    if on_kernel:
        cluster.folded = folded
    driver.prepare(runs)
    cluster.run(arrivals(runs, driver, cluster.env))
    _all_finished(runs)
    if folded is not None and not on_kernel:
        fold_results(folded, cluster.res, len(driver.owner))
        cluster.res.folded = folded


def _folded(family, runs: list, driver, on_kernel: bool) -> FoldedRequests:
    """Where the run's requests fold as it goes: the summary's, the family's own fold, then
    (compiled, where no eviction reads a cached block's request) who sent them let go."""
    folded = FoldedRequests()
    if family.folds is not None:
        folded.family = family.folds(runs, driver)
        folded.listen(folded.family.fold)
    elif family.results is not None:
        raise ValueError(f"output.requests: false: the {family.name} family's results read "
                         "every request's columns; keep the requests table")
    if on_kernel and not driver.reads_old_owners:
        folded.listen(driver.forget_folded)
    return folded


def _all_finished(runs: list) -> None:
    """Every program finished, else the run is a bug's."""
    unfinished = [r.idx for r in runs if np.isnan(r.finish_s)]
    if unfinished:
        raise RuntimeError(f"simulation ended with program {unfinished[0]} unfinished (a bug: "
                           "please report with the config)")


def unbooker(cluster):
    """The callback of a finished program: the routing load its pinning booked is released."""
    def on_program_done(run) -> None:
        for rid, tokens in run.booked.items():
            cluster.outstanding[rid] -= tokens
            cluster.in_flight[rid] -= 1

    return on_program_done


def arrivals(runs: list, driver: ProgramDriver, env):
    """The programs' arrival process: each arrives at its plan's time, is pinned to a target
    replica by its expected work (the routing estimate) and starts (where the kernel takes
    arrivals, `kernel_arrivals`, those it hands back)."""
    taken, i = driver.kernel_arrivals, 0
    while i < len(runs):
        run = runs[i]
        gap = run.plan.arrival_s - env.now
        if gap > 0:
            yield env.timeout(gap)
            if taken is not None:  # the kernel started the programs before the one it hands
                i = taken.next_program()
                run = runs[i]
        q = run.question
        driver.pin(run, "target", q.prompt_tokens, q.prompt_tokens + q.expected_tokens)
        driver.start(run)
        i += 1
        if taken is not None:
            taken.arrived(i)


_TIMES = ["arrival_s", "first_token_s", "finish_s", "output_tokens"]
"""the requests table's columns `summarize` reads"""


def _summary(cfg, cluster, requests, progs) -> dict:
    """A program run's figures: request latencies, programs, the cluster's load and cache
    (from the requests table, or the requests as they folded where the run kept none)."""
    folded = cluster.res.folded
    if folded is None:
        # the timing columns only: pandas would make a Python string of every id
        summary = summarize(requests.select(_TIMES).to_pandas(), cfg.slo_ttft_s, cfg.slo_tpot_s)
    else:
        summary = summarize_latencies(folded.latencies(), folded.output_tokens, folded.span_s(),
                                      cfg.slo_ttft_s, cfg.slo_tpot_s)
    summary.update(program_summary(progs.to_pandas()))
    summary.update(cluster.summary(cluster.res.events + cfg.programs.count,
                                   summary["makespan_s"]))
    summary["kv_usage_mean"] = kv_usage(cluster.res)
    summary["cached_prompt_share"] = cached_share(requests) if folded is None \
        else folded.cached_share()
    return summary


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
    keys = list(rows[0])
    col = dict(zip(keys, map(list, zip(*map(itemgetter(*keys), rows)))))
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

"""`simulate`: one run of a config, a plain request workload or a program workload.

Event budget per request: one arrival event, plus the replica runs its arrival truncates and its
completion ends. Nothing here runs per token; tables are written once from column buffers. A
plain workload that the compiled kernel covers runs there (`sim.kernels.plain`, equal to the SimPy
run bit for bit); the rest runs under SimPy.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from policies.routing import RequestView
from sim.engine.cluster import Cluster, build_replicas, gc_paused, run_summary
from sim.kernels.plain import simulate_compiled, why_not_compiled
from sim.config import SimConfig
from sim.metrics import summarize
from sim.engine.request_state import Req, Results
from sim.engine.tables import SimResult, finish_reasons, kv_usage, steps_table
from sim.workloads.requests import Workload, workload_from_config
from traces import ids


def simulate(cfg: SimConfig, workload: Workload | None = None, fast_forward: bool = True,
             lazy: bool = True, compiled: bool = True) -> SimResult:
    """Run one simulation of the config (or of an explicit workload) and return its tables.

    fast_forward=False simulates one event per iteration on the reference replica: what the fast
    paths must equal; lazy=False fast-forwards the reference replica (`sim.engine.lazy_replica`);
    compiled=False keeps a plain workload that the compiled kernel covers under SimPy
    (`sim.kernels.plain`).
    """
    with gc_paused():
        return _simulate(cfg, workload, fast_forward, lazy, compiled)


def _simulate(cfg: SimConfig, workload: Workload | None, fast_forward: bool,
              lazy: bool, compiled: bool) -> SimResult:
    if workload is None and "programs" in cfg.workload:
        from sim.workloads.programs import simulate_programs

        return simulate_programs(cfg, fast_forward, lazy, compiled)
    if workload is None:
        workload = workload_from_config(cfg.workload, cfg.seed, cfg.base_dir)
    wall0 = time.perf_counter()
    n = len(workload)
    specs = build_replicas(cfg)
    _check_fits(workload, specs)
    why = why_not_compiled(cfg, specs, workload) if fast_forward and lazy and compiled else None
    on_kernel = fast_forward and lazy and compiled and why is None
    if on_kernel:
        res, busy_s, loop_s = simulate_compiled(cfg, specs, workload)
    else:
        res, busy_s, loop_s = _simulate_simpy(cfg, specs, workload, fast_forward, lazy)
    events = res.events + n
    if n and np.isnan(res.finish_s).any():
        stuck = int(np.flatnonzero(np.isnan(res.finish_s))[0])
        raise RuntimeError(f"simulation ended with request {stuck} unfinished (a bug: please "
                           "report with the config)")
    requests = _requests_table(workload, res)
    steps = steps_table(res) if cfg.write_steps else None
    summary = summarize(requests.to_pandas(), cfg.slo_ttft_s, cfg.slo_tpot_s)
    summary.update(run_summary(res, busy_s, wall0, loop_s, events, summary["makespan_s"]))
    summary.update({"events_per_request": events / n if n else 0.0,
                    "kv_usage_mean": kv_usage(res),
                    "simulator": "compiled" if on_kernel else "simpy"})
    return SimResult(requests, steps, summary, why_simpy=why)


def _check_fits(workload: Workload, specs: list) -> None:
    """Refuse requests a replica could never serve (the engine would reject them)."""
    n = len(workload)
    total = workload.prompt_tokens + workload.output_tokens
    for i, (cal, rc) in enumerate(specs):
        if cal.max_model_len is not None and n and int(total.max()) > cal.max_model_len:
            j = int(np.argmax(total > cal.max_model_len))
            raise ValueError(f"workload: request {j} (prompt {int(workload.prompt_tokens[j])} + "
                             f"output {int(workload.output_tokens[j])} tokens) exceeds the "
                             f"model's max_model_len {cal.max_model_len} (replica {i}'s "
                             f"calibration); the engine would reject it")
        longest = int(workload.prompt_tokens.max() + workload.output_tokens.max()) if n else 0
        if -(-longest // rc.block_size) > rc.usable_blocks:
            raise ValueError(f"replica {i}: a {longest}-token request needs more than its "
                             f"{rc.usable_blocks} usable KV blocks (of {rc.kv_blocks}, one "
                             "the pool's null block); it could never run")


def _simulate_simpy(cfg: SimConfig, specs: list, workload: Workload, fast_forward: bool,
                    lazy: bool) -> tuple[Results, np.ndarray, float]:
    """The SimPy run: (results buffers, busy seconds per replica, event loop seconds)."""
    n = len(workload)

    def on_finish(replica_id: int, r: Req) -> None:
        cluster.outstanding[replica_id] -= r.prompt + r.output
        cluster.in_flight[replica_id] -= 1

    cluster = Cluster(cfg, n, on_finish, fast_forward, lazy, specs)
    env, res, replicas = cluster.env, cluster.res, cluster.replicas
    # Python lists: indexing numpy arrays per request costs more than the conversion
    arrival, prompt, output = (workload.arrival_s.tolist(), workload.prompt_tokens.tolist(),
                               workload.output_tokens.tolist())
    group = workload.prefix_group.tolist() if workload.prefix_group is not None else [-1] * n
    prefix = workload.prefix_tokens.tolist() if workload.prefix_tokens is not None else [0] * n
    replica_of = [0] * n

    def arrivals():
        for i in range(n):
            gap = arrival[i] - env.now
            if gap > 0:
                yield env.timeout(gap)
            p, o = prompt[i], output[i]
            replica_of[i] = rid = cluster.route(RequestView(i, p, o), p + o)
            replicas[rid].submit(Req(i, p, o, group=group[i], prefix_tokens=prefix[i]))

    cluster.run(arrivals())
    res.replica_id[:] = replica_of
    cluster.close()
    return res, np.array([r.busy_s for r in replicas]), cluster.loop_s


def _requests_table(w: Workload, res: Results) -> pa.Table:
    n = len(w)
    return pa.table({
        "request_id": [ids.request_id(i) for i in range(n)],
        "replica_id": res.replica_id, "cell_id": pa.nulls(n, pa.string()),
        "program_id": pa.nulls(n, pa.string()), "role": pa.nulls(n, pa.string()),
        "priority": np.zeros(n, dtype=np.int32), "arrival_s": w.arrival_s.astype(float),
        "scheduled_s": res.scheduled_s, "first_token_s": res.first_token_s,
        "finish_s": res.finish_s, "prompt_tokens": w.prompt_tokens.astype(np.int32),
        "output_tokens": res.output_tokens,
        "cached_prompt_tokens": res.cached_tokens,
        "finish_reason": finish_reasons(res.aborted),
    })

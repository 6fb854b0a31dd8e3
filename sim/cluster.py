"""The SimPy cluster: arrivals, a router, N (possibly heterogeneous) replicas; tables out.

Event budget per request: one arrival event, plus the replica runs its arrival truncates and its
completion ends. Nothing here runs per token; tables are written once from column buffers.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import simpy

from policies.routing import ROUTERS, ClusterView, RequestView
from sim.calibration import Calibration, load_calibration
from sim.config import SimConfig, kv_blocks_from_memory
from sim.metrics import summarize
from sim.replica import Replica, ReplicaConfig, Req, Results
from sim.workload import Workload, workload_from_config


@dataclass
class SimResult:
    """Output of one simulation: the same tables a live run writes, and a summary."""

    requests: pa.Table
    """requests table (traces schema columns, without run_id)"""
    steps: pa.Table | None
    """steps table, expanded from runs of iterations (None if not requested)"""
    summary: dict
    """headline metrics + wall_s, events, replicas"""
    programs: pa.Table | None = None
    """programs table of a program workload"""


def _router(name: str):
    if name in ROUTERS:
        return ROUTERS[name]()
    if ":" in name:  # a user policy: "package.module:Class"
        module, cls = name.split(":", 1)
        try:
            return getattr(importlib.import_module(module), cls)()
        except (ImportError, AttributeError) as e:
            raise ValueError(f"router {name!r}: cannot load ({e})") from None
    raise ValueError(f"router {name!r} unknown; known: {sorted(ROUTERS)} or module:Class")


def build_replicas(cfg: SimConfig) -> list[tuple[Calibration, ReplicaConfig]]:
    """(calibration, replica config) for every replica, in replica-id order."""
    out = []
    cache: dict[Path, Calibration] = {}
    for g in cfg.replicas:
        cal = cache.get(g.calibration) or load_calibration(g.calibration)
        cache[g.calibration] = cal
        kv = g.kv_blocks or cal.kv_blocks_total
        if g.memory_gb is not None:
            kv = kv_blocks_from_memory(g.model_config, g.memory_gb, cal.block_size,
                                       g.gpu_memory_utilization)
        rc = ReplicaConfig(max_num_seqs=g.max_num_seqs or cal.max_num_seqs,
                           max_num_batched_tokens=g.max_num_batched_tokens
                           or cal.max_num_batched_tokens,
                           block_size=cal.block_size, kv_blocks=kv,
                           enable_prefix_caching=g.enable_prefix_caching,
                           priority_scheduling=cfg.scheduler != "fcfs")
        out.extend([(cal, rc)] * g.count)
    return out


def simulate(cfg: SimConfig, workload: Workload | None = None, fast_forward: bool = True,
             ) -> SimResult:
    """Run one simulation of the config (or of an explicit workload) and return its tables.

    fast_forward=False simulates one event per iteration: the reference the fast path must equal.
    """
    if workload is None and "programs" in cfg.workload:
        from sim.programs import simulate_programs

        return simulate_programs(cfg, fast_forward)
    wall0 = time.perf_counter()
    if workload is None:
        workload = workload_from_config(cfg.workload, cfg.seed, cfg.base_dir)
    n = len(workload)
    specs = build_replicas(cfg)
    for i, (_, rc) in enumerate(specs):
        longest = int(workload.prompt_tokens.max() + workload.output_tokens.max()) if n else 0
        if -(-longest // rc.block_size) > rc.kv_blocks:
            raise ValueError(f"replica {i}: a {longest}-token request needs more than its "
                             f"{rc.kv_blocks} KV blocks; it could never run")
    env = simpy.Environment()
    res = Results(n)
    # One generator for the run, split per purpose so adding noise never shifts routing.
    seeds = np.random.SeedSequence(cfg.seed).spawn(len(specs) + 1)
    outstanding = np.zeros(len(specs), dtype=np.int64)
    in_flight = np.zeros(len(specs), dtype=np.int64)

    def on_finish(replica_id: int, r: Req) -> None:
        outstanding[replica_id] -= r.prompt + r.output
        in_flight[replica_id] -= 1

    replicas = [Replica(env, i, cal, rc, res,
                        np.random.default_rng(seeds[i]) if cfg.latency == "sampled" else None,
                        on_finish=lambda r, i=i: on_finish(i, r), fast_forward=fast_forward)
                for i, (cal, rc) in enumerate(specs)]
    router = _router(cfg.router)
    view = ClusterView(outstanding_tokens=outstanding, num_requests=in_flight)
    arrival = workload.arrival_s
    prompt = workload.prompt_tokens
    output = workload.output_tokens
    group = workload.prefix_group if workload.prefix_group is not None else np.full(n, -1)
    prefix = workload.prefix_tokens if workload.prefix_tokens is not None else np.zeros(n, int)

    def arrivals():
        for i in range(n):
            gap = arrival[i] - env.now
            if gap > 0:
                yield env.timeout(gap)
            p, o = int(prompt[i]), int(output[i])
            rid = router.route(RequestView(i, p, o), view)
            if not 0 <= rid < len(replicas):
                raise ValueError(f"router returned replica {rid}; cluster has {len(replicas)}")
            res.replica_id[i] = rid
            outstanding[rid] += p + o
            in_flight[rid] += 1
            replicas[rid].submit(Req(i, p, o, group=int(group[i]), prefix_tokens=int(prefix[i])))

    env.process(arrivals())
    loop0 = time.perf_counter()
    env.run()
    loop_s = time.perf_counter() - loop0
    events = res.events + n
    if n and np.isnan(res.finish_s).any():
        stuck = int(np.flatnonzero(np.isnan(res.finish_s))[0])
        raise RuntimeError(f"simulation ended with request {stuck} unfinished (a bug: please "
                           "report with the config)")
    requests = _requests_table(workload, res)
    steps = _steps_table(res) if cfg.write_steps else None
    summary = summarize(requests.to_pandas(), cfg.slo_ttft_s, cfg.slo_tpot_s)
    busy = np.array([r.busy_s for r in replicas])
    span = summary["makespan_s"] or 1.0
    iters = np.asarray(res.seg["k_iters"], dtype=np.int64)
    summary.update({
        "wall_s": round(time.perf_counter() - wall0, 4), "event_loop_s": round(loop_s, 4),
        "events": int(events), "events_per_request": events / n if n else 0.0,
        "iterations": int(iters.sum()), "replicas": len(replicas),
        "utilization": float(busy.mean() / span),
        "preemptions": int(res.preemptions.sum()),
        "kv_usage_mean": _kv_usage(res),
    })
    return SimResult(requests, steps, summary)


def _kv_usage(res: Results) -> float:
    seg = res.seg
    if not seg["k_iters"]:
        return 0.0
    used = np.asarray(seg["kv_blocks_used"], float) / np.asarray(seg["kv_blocks_total"], float)
    k = np.asarray(seg["k_iters"], float)
    return float((used * k).sum() / k.sum())  # iteration-weighted


def _requests_table(w: Workload, res: Results) -> pa.Table:
    n = len(w)
    return pa.table({
        "request_id": [f"req-{i:06d}" for i in range(n)],
        "replica_id": res.replica_id, "cell_id": pa.nulls(n, pa.string()),
        "program_id": pa.nulls(n, pa.string()), "role": pa.nulls(n, pa.string()),
        "priority": np.zeros(n, dtype=np.int32), "arrival_s": w.arrival_s.astype(float),
        "scheduled_s": res.scheduled_s, "first_token_s": res.first_token_s,
        "finish_s": res.finish_s, "prompt_tokens": w.prompt_tokens.astype(np.int32),
        "output_tokens": res.output_tokens,
        "cached_prompt_tokens": res.cached_tokens,
        "finish_reason": pa.array(np.where(res.aborted, "abort", "length"), pa.string()),
    })


def _steps_table(res: Results) -> pa.Table:
    """Expand runs of iterations into one row per iteration (vectorised, after the run)."""
    seg = {k: np.asarray(v) for k, v in res.seg.items()}
    k = seg["k_iters"].astype(np.int64)
    total = int(k.sum())
    rep = np.repeat(np.arange(len(k)), k)
    j = np.arange(total) - np.repeat(np.cumsum(k) - k, k)  # iteration index within its run
    a, b, f = seg["a_ms"][rep], seg["b_ms"][rep], seg["factor"][rep]
    start = seg["start_s"][rep] + f * (j * a + b * j * (j - 1) / 2.0) / 1e3
    decode = seg["decode_seqs"][rep]
    multi = k[rep] > 1
    order = np.lexsort((start, seg["replica_id"][rep]))
    replica = seg["replica_id"][rep]
    step_id = np.empty(total, dtype=np.int64)
    # step ids count iterations per replica in time order
    sorted_rep = replica[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_rep)) + 1]
    counts = np.diff(np.r_[first, total])
    step_id[order] = np.arange(total) - np.repeat(first, counts)
    return pa.table({
        "replica_id": replica.astype(np.int32), "step_id": step_id,
        "cell_id": pa.nulls(total, pa.string()), "start_s": start,
        "duration_ms": f * (a + b * j),
        "prefill_tokens": seg["prefill_tokens"][rep].astype(np.int32),
        "prefill_seqs": seg["prefill_seqs"][rep].astype(np.int32),
        "decode_seqs": decode.astype(np.int32),
        "num_running": seg["num_running"][rep].astype(np.int32),
        "num_waiting": seg["num_waiting"][rep].astype(np.int32),
        "context_tokens": (seg["context_tokens"][rep] + np.where(multi, decode * j, 0)
                           ).astype(np.int64),
        "kv_blocks_used": seg["kv_blocks_used"][rep].astype(np.int32),  # at the run's start
        "kv_blocks_total": seg["kv_blocks_total"][rep].astype(np.int32),
        "preemptions": np.where(j == 0, seg["preemptions"][rep], 0).astype(np.int32),
        "is_warmup": np.zeros(total, dtype=bool),
    })

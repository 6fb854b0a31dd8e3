"""When a plain request simulation may run compiled (`sim.kernels.plain_kernel`), and running it.

The compiled kernel is the SimPy reference's equal on what it covers (the linear and the
serving step-time models, mean or sampled step time); everything else (program workloads,
speculative or layered replicas, shared devices, prefix caching, priority scheduling, user
routers, other step-time models, several pools) runs under SimPy.
`why_not_compiled` names the first thing that keeps a config off the compiled path.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sim.step_time.calibration import Calibration
from sim.engine.cluster import noise_seeds
from sim.config import SimConfig
from sim.step_time.latency import LatencyModel
from sim.step_time.serving_latency import ServingModel
from sim.engine.replica_config import ReplicaConfig
from sim.engine.request_state import Results
from sim.workloads.requests import Workload

ROUTERS = ("round_robin", "least_outstanding")


def why_not_compiled(cfg: SimConfig, specs: list[tuple[Calibration, ReplicaConfig]],
                     workload: Workload) -> str | None:
    """None if the compiled kernel covers this run; else what keeps it under SimPy."""
    if cfg.router not in ROUTERS:
        return f"router {cfg.router!r}"
    if len({g.pool for g in cfg.replicas}) > 1:
        return "several model pools"
    if any(g.enable_prefix_caching for g in cfg.replicas):
        return "prefix caching"  # a preempted request's recompute finds its own blocks cached
    if any(rc.priority_scheduling for _, rc in specs):
        return "priority scheduling"
    return _replicas_why_not(cfg, specs)


def why_not_compiled_programs(cfg: SimConfig, specs: list[tuple[Calibration, ReplicaConfig]],
                              compiles: bool, capacity: int) -> str | None:
    """None if the program kernel (`sim.kernels.programs`) covers a program run of at most
    `capacity` requests (`compiles`: its family's `SimFamily.compiles`); else what keeps it
    under SimPy."""
    if not compiles:
        return "a program kind whose family does not compile"
    if cfg.latency != "mean":
        return f"{cfg.latency} step time"
    if cfg.kv_eviction != "free_order":
        return f"KV eviction {cfg.kv_eviction!r} (the kernel evicts in free order)"
    why = _replicas_why_not(cfg, specs)
    if why is not None:
        return why
    from sim.kernels.prefix import MAX_BLOCKS  # numba is there: checked above

    if any((cal.max_model_len or 1 << 30) // rc.block_size >= MAX_BLOCKS for cal, rc in specs):
        return "prompts of more blocks than the kernel's block identities hold"
    if capacity * MAX_BLOCKS * len(specs) >= 1 << 62:
        return "more prefix groups than the kernel's block identities hold"
    return None


MODELS = (LatencyModel, ServingModel)
"""the step-time models both kernels price (`sim.kernels.serving` carries the serving model's
engine state)"""


def _replicas_why_not(cfg: SimConfig, specs: list) -> str | None:
    """What either kernel cannot run of the replicas: shared devices, step-time models other
    than MODELS, speculation, or numba missing."""
    if any(g.device is not None for g in cfg.replicas):
        return "a shared device"
    if any(g.scheduler != "reasonsim" for g in cfg.replicas):
        return "a replica group scheduled by other code (`scheduler`)"
    for cal, rc in specs:
        if type(cal.latency) not in MODELS:
            why = getattr(cal.latency, "not_compiled", "") or "not a closed form the kernels price"
            return f"step-time model {cal.latency.kind!r}: {why}"
        if rc.spec is not None:
            return "speculative decoding"
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numba is not installed"
    return None


def simulate_compiled(cfg: SimConfig, specs: list[tuple[Calibration, ReplicaConfig]],
                      workload: Workload) -> tuple[Results, np.ndarray, float]:
    """Run the kernel: (results buffers as the SimPy run fills them, busy seconds per replica,
    event loop seconds)."""
    from sim.kernels import plain_kernel as K
    from sim.kernels import state as S
    from sim.kernels.serving import DRIFT

    n, nrep = len(workload), len(specs)
    rq = np.zeros((n, S.RQ_COLS), dtype=np.int64)
    rq[:, S.PROMPT] = workload.prompt_tokens
    rq[:, S.OUTPUT] = workload.output_tokens
    rq[:, S.TARGET] = workload.prompt_tokens
    rq[:, [S.RNEXT, S.RPREV, S.WNEXT]] = -1
    rp = np.zeros((nrep, S.RP_COLS), dtype=np.int64)
    rf = np.zeros((nrep, S.RF_COLS))
    for j, (cal, rc) in enumerate(specs):
        rp[j, [S.MAX_SEQS, S.BUDGET, S.BS, S.KV_BLOCKS, S.FREE]] = (
            rc.max_num_seqs, rc.max_num_batched_tokens, rc.block_size, rc.kv_blocks,
            rc.usable_blocks)
        rf[j, S.C0:S.CX + 1] = cal.stepping.coef_ms[:S.CX + 1]  # the loop's step gap included
        rf[j, [S.ADD_S, S.ADD_MORE_S, S.WAKE_S]] = (
            cal.add_request_ms / 1e3, cal.add_more_ms / 1e3, cal.wake_ms / 1e3)
    rp[:, [S.RHEAD, S.RTAIL, S.WHEAD, S.WTAIL]] = -1
    rngs, quantiles, eng = _noise(cfg, specs, rp, rf)
    rf[:, S.RUN_FACTOR] = eng[0][:, DRIFT]
    loop0 = time.perf_counter()
    rt, replica_of, seg, events = K.simulate_kernel(
        np.ascontiguousarray(workload.arrival_s, dtype=np.float64), rq, rp, rf, rngs, quantiles,
        eng, cfg.router == "least_outstanding")
    loop_s = time.perf_counter() - loop0
    res = Results(n)
    res.scheduled_s = np.ascontiguousarray(rt[:, S.SCHEDULED_S])
    res.first_token_s = np.ascontiguousarray(rt[:, S.FIRST_TOKEN_S])
    res.finish_s = np.ascontiguousarray(rt[:, S.FINISH_S])
    res.replica_id[:] = replica_of
    res.output_tokens[:] = rq[:, S.GENERATED]
    res.preemptions[:] = rq[:, S.PREEMPTS]
    res.load_segments(seg)
    res.events = int(events)
    return res, rf[:, S.BUSY_S].copy(), loop_s


def _noise(cfg: SimConfig, specs: list, rp: np.ndarray, rf: np.ndarray):
    """Each replica's noise generator (seeded as `Cluster` seeds its replicas'), residual
    quantiles (rows padded, a prefill step's after every replica's; their count in
    rp[:, N_QUANTILES]; their factor's mean and std in rf, `step_noise`) and engine state and
    speed levels (`sim.kernels.serving`, drawn first as `Replica.__init__` draws them)."""
    from numba.typed import List

    from sim.kernels import state as S
    from sim.kernels.serving import serving_state
    from sim.step_time.spells import prefill_noise, step_noise

    sampled = cfg.latency == "sampled"
    seeds = noise_seeds(cfg, len(specs))
    gens = [np.random.default_rng(seeds[j] if sampled else 0) for j in range(len(specs))]
    eng = serving_state(specs, gens, sampled)
    noise = [step_noise(cal.latency, sampled) for cal, _ in specs]
    # a prefill step's quantiles in the rows after every replica's (as many as its others)
    quantiles = np.zeros((2 * len(specs), max(len(q) for q, _, _ in noise)))
    for j, (q, mean, std) in enumerate(noise):
        quantiles[j, :len(q)] = q
        quantiles[len(specs) + j, :len(q)] = prefill_noise(specs[j][0].latency, sampled)
        rp[j, S.N_QUANTILES] = len(q)
        rf[j, S.NOISE], rf[j, S.NOISE_STD] = mean, std
    rp[:, S.SAMPLED] = sampled
    return List(gens), quantiles, eng


def warm() -> float:
    """Compile the kernel (or load it from numba's cache) with a tiny run; the seconds it took."""
    from sim.engine.cluster import build_replicas
    from sim.config import parse_config
    from sim.workloads.requests import workload_from_config

    cal = Path(__file__).resolve().parents[1] / "data" / "testbed-large-cpu.calib.json"
    cfg = parse_config({"workload": {"arrival": {"kind": "poisson", "rate_per_s": 5.0},
                                     "num_requests": 10,
                                     "prompt_tokens": {"kind": "uniform", "low": 8, "high": 64},
                                     "output_tokens": {"kind": "uniform", "low": 1, "high": 16}},
                        "cluster": {"replicas": [{"calibration": str(cal)}]}})
    t0 = time.perf_counter()
    simulate_compiled(cfg, build_replicas(cfg), workload_from_config(cfg.workload, cfg.seed))
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"compiled kernel: ready ({warm():.1f} s)")

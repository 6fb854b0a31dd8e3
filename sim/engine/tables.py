"""Simulator outputs: the same tables a live run writes, built once from column buffers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sim.engine.request_state import Results
from sim.step_time.latency import ECHO_WEIGHTS


@dataclass
class SimResult:
    """Output of one simulation: the same tables a live run writes, and a summary."""

    requests: pa.Table | None
    """requests table (traces schema columns, without run_id); None where a program run folded
    its requests into the summary (`output.requests: false`)"""
    steps: pa.Table | None
    """steps table, expanded from runs of iterations (None if not requested)"""
    summary: dict
    """headline metrics + wall_s, events, replicas"""
    programs: pa.Table | None = None
    """programs table of a program workload"""
    tables: dict = field(default_factory=dict)
    """further tables of a method family (A1: conformity), by name"""
    why_simpy: str | None = None
    """what kept the run off the compiled path (None: it ran there, or the caller asked for
    the SimPy replicas)"""


def finish_reasons(aborted: np.ndarray) -> pa.Array:
    """The requests table's finish_reason column: "abort" or "length" per request (taken from
    two strings: a numpy string array of millions of rows is slow to make and to convert)."""
    return pa.array(["length", "abort"], pa.string()).take(np.asarray(aborted, dtype=np.int8))


def kv_usage(res: Results) -> float:
    """Iteration-weighted mean KV usage over the run."""
    iterations, kv_iterations = res.run_totals()
    return kv_iterations / iterations if iterations else 0.0


def cached_share(requests: pa.Table) -> float:
    """Share of the requests' prompt tokens found in the prefix cache."""
    prompt = pc.sum(requests["prompt_tokens"]).as_py() or 0
    return (pc.sum(requests["cached_prompt_tokens"]).as_py() or 0) / prompt if prompt else 0.0


def _echo_ms(seg: dict, rep: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The after-prefill echo iteration j of run `rep` carries (`sim.step_time.latency.run_ms`)."""
    at = seg["echo_at"][rep].astype(np.int64)
    place = np.where(at > 0, at - 1 + j, len(ECHO_WEIGHTS))  # among ECHO_WEIGHTS (past: none)
    return np.r_[ECHO_WEIGHTS, 0.0][np.minimum(place, len(ECHO_WEIGHTS))] * seg["echo_ms"][rep]


def steps_table(res: Results) -> pa.Table:
    """Expand runs of iterations into one row per iteration (vectorised, after the run)."""
    seg = res.seg
    k = seg["k_iters"].astype(np.int64)
    total = int(k.sum())
    rep = np.repeat(np.arange(len(k)), k)
    j = np.arange(total) - np.repeat(np.cumsum(k) - k, k)  # iteration index within its run
    a, b, f = seg["a_ms"][rep], seg["b_ms"][rep], seg["factor"][rep]
    # the iterations before j, their echo added in `run_ms`'s order
    before_ms = j * a + b * j * (j - 1) / 2.0
    for i in range(len(ECHO_WEIGHTS)):
        before_ms = before_ms + np.where(j > i, _echo_ms(seg, rep, np.full_like(j, i)), 0.0)
    start = seg["start_s"][rep] + f * before_ms / 1e3
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
        "duration_ms": f * (a + b * j + _echo_ms(seg, rep, j)),
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

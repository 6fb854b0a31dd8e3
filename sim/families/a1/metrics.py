"""A1 metrics of a run (sim or live): rejection rate, tokens by model, where paths spend time,
asynchronous arithmetic intensity (sim-vs-live: `validation.a1`).

Asynchronous arithmetic intensity (A1 eq. 10: r = T_c / (T_m + T_s), with T_s the
synchronisation overhead) is measured on the timeline, per path: T_c is the time the path has a
request being computed (scheduled to finished), T_s the time it waits without one: held at a
barrier (the gap between a request's finish and the path's next request) plus queued in an
engine (arrival to scheduled). Memory time is inside T_c (the step time is measured whole).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from programs.a1 import A1Program


def path_times(log: pd.DataFrame) -> dict:
    """Compute / queue / barrier seconds summed over paths, and r = compute / (queue + barrier).

    `log`: one row per request with program_id, sample, arrival_s, scheduled_s, finish_s."""
    log = log.sort_values(["program_id", "sample", "arrival_s"], kind="stable")
    compute = float((log.finish_s - log.scheduled_s).sum())
    queue = float((log.scheduled_s - log.arrival_s).sum())
    prev_finish = log.groupby(["program_id", "sample"]).finish_s.shift()
    barrier = float((log.arrival_s - prev_finish).clip(lower=0).sum())
    wait = queue + barrier
    return {"path_compute_s": compute, "path_queue_s": queue, "path_barrier_s": barrier,
            "async_arithmetic_intensity": compute / wait if wait > 0 else float("inf")}


class FoldedPathTimes:
    """`path_times` of a run's requests added as they fold (`sim.engine.folded_requests`):
    the same sums to rounding (added block by block, not in the log's sorted order). A path's
    requests fold in the order they were sent, which is their arrival order."""

    def __init__(self, owner, programs: int, samples: int):
        self._owner, self._samples = owner, samples  # the driver's program and path per idx
        self._last_finish_s = np.full(programs * samples, np.nan)  # per path, so far
        self.compute_s = self.queue_s = self.barrier_s = 0.0

    def fold(self, first_idx: int, columns: dict) -> None:
        """Add requests first_idx, ... (their columns as `FoldedRequests.add` takes them)."""
        n = len(columns["arrival_s"])
        if len(self._owner) < first_idx + n:
            raise RuntimeError("requests folded before the driver read who sent them (a bug)")
        a = first_idx - self._owner.base
        path = np.frombuffer(self._owner.program, np.int64)[a:a + n] * self._samples + \
            np.frombuffer(self._owner.path, np.int64)[a:a + n]
        arrival, finish = columns["arrival_s"], columns["finish_s"]
        self.compute_s += float(np.nansum(finish - columns["scheduled_s"]))
        self.queue_s += float(np.nansum(columns["scheduled_s"] - arrival))
        order = np.argsort(path, kind="stable")  # each path's requests in the order sent
        p, a, f = path[order], arrival[order], finish[order]
        prev = np.empty(n)
        prev[1:] = f[:-1]
        first = np.ones(n, dtype=bool)
        first[1:] = p[1:] != p[:-1]
        prev[first] = self._last_finish_s[p[first]]  # the path's last request folded before
        self.barrier_s += float(np.nansum(np.clip(a - prev, 0.0, None)))
        last = np.ones(n, dtype=bool)
        last[:-1] = p[1:] != p[:-1]
        self._last_finish_s[p[last]] = f[last]

    def totals(self) -> dict:
        """`path_times`' figures."""
        wait = self.queue_s + self.barrier_s
        return {"path_compute_s": self.compute_s, "path_queue_s": self.queue_s,
                "path_barrier_s": self.barrier_s,
                "async_arithmetic_intensity": self.compute_s / wait if wait > 0 else float("inf")}


def a1_summary(programs: list[A1Program], log: pd.DataFrame | dict, busy_s: dict,
               makespan_s: float) -> dict:
    """Rejection rate, tokens by role, pool utilisation and path times of A1 programs (`log`:
    the requests' log, or `path_times`' figures where the run folded them)."""
    scored = [d for p in programs if p.policies[0].needs_score for d in p.decisions[0]]
    tokens = {k: sum(p.tokens_by_role[k] for p in programs) for k in ("draft", "target", "score")}
    out = {"rejection_rate": (sum(not d.accepted for d in scored) / len(scored)
                              if scored else None),
           "draft_tokens": tokens["draft"], "target_tokens": tokens["target"],
           "score_prefill_tokens": tokens["score"],
           **{f"{pool}_utilisation": s / makespan_s for pool, s in busy_s.items()}}
    out.update(path_times(log) if isinstance(log, pd.DataFrame) else log)
    out["takeovers_by_turn"] = takeovers_by_turn(programs)
    return out


def takeovers_by_turn(programs: list[A1Program]) -> list[int]:
    """The target's take-overs of scored draft steps at each turn (the workload's policy)."""
    counts: dict[int, int] = {}
    for p in programs:
        name = p.policies[0].name
        rows = p.rows
        for score, turn, names, accepted_by in zip(
                rows.column("score"), rows.column("turn"), rows.column("policies"),
                rows.column("accepted_by")):
            if score is not None and name in names and name not in accepted_by:
                counts[turn] = counts.get(turn, 0) + 1
    return [counts.get(t, 0) for t in range(max(counts, default=-1) + 1)]


def request_log(programs: dict, requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request timeline of live A1 programs (keyed by program id) from a requests table; a
    score re-run without the prefix cache finishes when its re-run does."""
    from traces import ids

    req = requests.set_index("request_id")
    rows = []
    for key, prog in programs.items():
        log = prog.request_log
        for index, sample in zip(log.column("index"), log.column("sample")):
            rid = ids.search_request_id(key, index)
            r = req.loc[rid]
            finish = req.loc[f"{rid}~full"].finish_s if f"{rid}~full" in req.index else r.finish_s
            rows.append((key, sample, r.arrival_s, r.scheduled_s, finish))
    return pd.DataFrame(rows, columns=["program_id", "sample", "arrival_s", "scheduled_s",
                                       "finish_s"])


def pool_intensity(cfg, steps, pool: str = "target") -> float | None:
    """Mean arithmetic intensity (FLOP per byte, a roofline estimate from the model's shape:
    `sim.model_shape.step_intensity`) of a pool's steps (A1 Fig 4a); None where the pool's
    model config is not found (`model_config`, or the calibration's model in this checkout)."""
    import numpy as np

    from sim.model_shape import DTYPE_BYTES, model_config_of, step_intensity
    from sim.step_time.calibration import load_calibration

    first, ids = 0, []
    config = dtype = None
    for g in cfg.replicas:
        if g.pool == pool:
            ids += range(first, first + g.count)
            prov = load_calibration(g.calibration).provenance
            config = g.model_config or model_config_of(str(prov.get("model_id", "")))
            dtype = DTYPE_BYTES.get(str(prov.get("dtype")), 2)
        first += g.count
    if config is None or steps is None:
        return None
    s = steps.to_pandas()
    s = s[np.isin(s.replica_id, ids)]
    tokens = s.prefill_tokens + s.decode_seqs
    return float(np.mean(step_intensity(config, dtype, tokens, s.context_tokens)))

"""A1 simulated against live: the same decision per path, and program latency and throughput."""

from __future__ import annotations

import numpy as np
import pandas as pd


def decision_strings(conformity: pd.DataFrame) -> dict:
    """(program id, sample) -> its path's decision string, from the nodes a run visited (one
    policy: a node's step was the draft's when the policy accepted it)."""
    last = conformity.sort_values("turn").groupby(["program_id", "sample"]).tail(1)
    return {(p, int(k)): path + ("A" if len(acc) else "R")
            for p, k, path, acc in zip(last.program_id, last["sample"], last.path,
                                       last.accepted_by)}


def compare_a1(sim: dict, live: dict, sim_progs: pd.DataFrame, live_progs: pd.DataFrame) -> dict:
    """Decision agreement (same decision string per path) and sim-vs-live latency errors."""
    same = [sim[k] == live.get(k) for k in sim]
    lat = {}
    s = sim_progs.set_index("program_id").sort_index()
    v = live_progs.set_index("program_id").loc[s.index]
    ls, lv = (s.finish_s - s.arrival_s).to_numpy(), (v.finish_s - v.arrival_s).to_numpy()
    for q in (50, 90):
        a, b = np.percentile(ls, q), np.percentile(lv, q)
        lat[f"program_latency_p{q}"] = {"sim": float(a), "live": float(b),
                                        "error": float((a - b) / b)}
    span_s = float(s.finish_s.max() - s.arrival_s.min())
    span_v = float(v.finish_s.max() - v.arrival_s.min())
    lat["throughput_programs_per_s"] = {"sim": len(s) / span_s, "live": len(v) / span_v,
                                        "error": span_v / span_s - 1}
    return {"paths": len(same), "decision_agreement": float(np.mean(same)),
            "answer_agreement": float((s.answer.fillna("") == v.answer.fillna("")).mean()),
            **lat}

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


def replay_result(cfg, out, lives: list) -> tuple[dict, pd.DataFrame]:
    """Simulate the config into `out/sim` and compare it with each live run (`lives`: per run,
    its programs and conformity tables and its a1.json), and the live runs with each other;
    the result (also written to `out/compare.json`) and the simulated programs."""
    import json

    from sim.output import write_sim
    from sim.simulate import simulate
    from traces.store import read_table

    sim = simulate(cfg)
    write_sim(cfg, sim, out / "sim")
    s_progs = sim.programs.to_pandas()
    s_dec = decision_strings(read_table(out / "sim", "conformity").to_pandas())
    result = {"sim": {k: v for k, v in sim.summary.items() if not isinstance(v, dict)},
              "live": [lv[2] for lv in lives], "compare": []}
    for progs, conf, _ in lives:
        result["compare"].append(compare_a1(s_dec, decision_strings(conf), s_progs, progs))
    if len(lives) > 1:
        result["live_vs_live"] = compare_a1(decision_strings(lives[0][1]),
                                            decision_strings(lives[1][1]), lives[0][0],
                                            lives[1][0])
    result["error_vs_live_mean"] = {}
    for key in ("program_latency_p50", "program_latency_p90", "throughput_programs_per_s"):
        mean = sum(c[key]["live"] for c in result["compare"]) / len(lives)
        result["error_vs_live_mean"][key] = result["compare"][0][key]["sim"] / mean - 1
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    return result, s_progs

"""SEED (ToT) simulated against live: decision agreement, program latency, speedups over ar and sd.

Both sides read `tot_requests` and `programs` tables, which the simulator and the live runner
write alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from validation.judge import judge

SPEEDUP_TOLERANCE = 0.10
"""a simulated speedup is judged within this of live (or the live repeats' spread, if larger)"""


def decision_agreement(sim: pd.DataFrame, live: pd.DataFrame) -> dict:
    """Share of live requests the simulation made with the same identity, and of live
    verifications that kept the same number of drafted tokens; same set of thoughts per tree."""
    key = ["program_id", "node", "kind", "round"]
    s, lv = sim.set_index(key), live.set_index(key)
    common = lv.index.intersection(s.index)
    vl = lv[lv.index.get_level_values("kind") == "verify"]
    vc = vl.index.intersection(s.index)
    same_accept = (s.loc[vc].accepted_tokens.to_numpy() == vl.loc[vc].accepted_tokens.to_numpy())
    nodes = lambda d: d[d.kind == "eval"].groupby("program_id").node.apply(frozenset)
    ns, nl = nodes(sim), nodes(live)
    return {"requests_matched": float(len(common) / max(1, len(lv))),
            "verify_agreement": float(same_accept.sum() / len(vl)) if len(vl) else None,
            "tree_agreement": float((ns.reindex(nl.index) == nl).mean()) if len(nl) else 1.0}


def program_latency_errors(sim_programs: pd.DataFrame, live_programs: pd.DataFrame) -> dict:
    """Relative error of the simulated program latency (mean, P50, P90) against live."""
    lat = lambda p: (p.finish_s - p.arrival_s).to_numpy(dtype=float)
    s, lv = lat(sim_programs), lat(live_programs)
    out = {}
    for name, f in (("mean", np.mean), ("p50", np.median),
                    ("p90", lambda x: np.quantile(x, 0.9))):
        out[f"latency_{name}_sim_s"], out[f"latency_{name}_live_s"] = float(f(s)), float(f(lv))
        out[f"latency_{name}_error"] = float(f(s) / f(lv) - 1.0)
    return out


def _mean_latency_s(programs: pd.DataFrame) -> float:
    return float((programs.finish_s - programs.arrival_s).mean())


def compare_modes(results: dict) -> dict:
    """Per mode: simulated and live mean program latency, the error against the live mean, the
    live-vs-live spread, decision agreement, and speedups over ar and sd (sim and live; `judged`
    against each repeat's own live speedup: within SPEEDUP_TOLERANCE or the repeats' spread).
    `results`: mode -> ((sim programs, sim tot_requests), [(live programs, tot_requests)...])."""
    modes = {}
    for mode, ((sp, st), lives) in results.items():
        live = [_mean_latency_s(p) for p, _ in lives]
        live_mean = float(np.mean(live))
        r = {"sim_mean_s": _mean_latency_s(sp), "live_mean_s": live,
             "error": _mean_latency_s(sp) / live_mean - 1.0,
             "agreement": [decision_agreement(st, t) for _, t in lives]}
        r["decision_agreement"] = min(min(v for v in a.values() if v is not None)
                                      for a in r["agreement"])
        if len(live) > 1:
            r["live_vs_live"] = live[1] / live[0] - 1.0
            r["live_vs_live_agreement"] = decision_agreement(lives[0][1], lives[1][1])
        modes[mode] = r
    for mode, r in modes.items():
        for base in ("ar", "sd"):
            b = modes.get(base)
            r[f"speedup_vs_{base}"] = {
                "sim": b["sim_mean_s"] / r["sim_mean_s"] if b else None,
                "live": float(np.mean(b["live_mean_s"])) / float(np.mean(r["live_mean_s"]))
                if b else None}
            if b and mode != base:
                # each repeat's modes ran minutes apart: the speedup's own live-vs-live spread
                runs = [x / y for x, y in zip(b["live_mean_s"], r["live_mean_s"])]
                r[f"speedup_vs_{base}"]["judged"] = judge(r[f"speedup_vs_{base}"]["sim"], runs,
                                                          SPEEDUP_TOLERANCE)
    return {"modes": modes}


def add_at_live_speed(result: dict, sims: dict) -> None:
    """Add to `compare_modes`' result each mode's simulation at its live runs' step speed:
    `sims`: mode -> per live run {"step_speed": pool -> factor, "programs": simulated}. Per
    mode: mean latency per run, the error against that run (mean over runs) and the speedups
    over ar and sd between the modes so simulated (each at its own runs' speed, as live)."""
    modes = result["modes"]
    for mode, runs in sims.items():
        r = modes[mode]
        sim = [_mean_latency_s(run["programs"]) for run in runs]
        r["at_live_speed"] = {
            "step_speed": [run["step_speed"] for run in runs], "sim_mean_s": sim,
            "error": float(np.mean([s / live - 1.0 for s, live in zip(sim, r["live_mean_s"])]))}
    for mode, r in modes.items():
        for base in ("ar", "sd"):
            if base in sims and mode in sims:
                r[f"speedup_vs_{base}"]["sim_at_live_speed"] = float(
                    np.mean(modes[base]["at_live_speed"]["sim_mean_s"])
                    / np.mean(r["at_live_speed"]["sim_mean_s"]))
                judged = r[f"speedup_vs_{base}"].get("judged")
                if judged is not None:  # the same judgement at each live run's step speed
                    judged["at_live_speed"] = judge(
                        r[f"speedup_vs_{base}"]["sim_at_live_speed"], judged["live"],
                        SPEEDUP_TOLERANCE)


def add_judged(result: dict, sims: dict) -> None:
    """Add to `compare_modes`' result each mode's mean latency judged at the speed checks beside
    its live runs (`sims`: mode -> per live run {"step_speed": pool -> level, "programs":
    simulated}, as `add_at_live_speed` reads): `judged`, with its levels and verdict."""
    from validation.beside_checks import judge_quantiles

    for mode, runs in sims.items():
        r = result["modes"][mode]
        sim = [{"mean_latency_s": _mean_latency_s(run["programs"])} for run in runs]
        live = [{"mean_latency_s": v} for v in r["live_mean_s"]]
        r["judged"] = {"levels": [run["step_speed"] for run in runs],
                       "metrics": judge_quantiles(sim, live)}

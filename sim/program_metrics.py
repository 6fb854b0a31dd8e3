"""Program-level metrics of a programs table (sim or live), and sim-vs-live comparison."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.metrics import stats


def program_summary(progs: pd.DataFrame) -> dict:
    """Program-level metrics: tokens, accuracy, deadline attainment, latency (sim and live)."""
    latency = progs.finish_s - progs.arrival_s
    return {"programs": int(len(progs)),
            "tokens_generated": int(progs.tokens_generated.sum()),
            "tokens_per_program": float(progs.tokens_generated.mean()),
            "accuracy": float(progs.is_correct.mean()),
            "slo_attainment": float(progs.met_deadline.mean()),
            "program_latency_s": stats(latency),
            "latency_over_deadline": latency_over_deadline(progs)}


def latency_over_deadline(progs: pd.DataFrame) -> dict:
    """Each program's latency over its deadline: mean, P90 and max (Dynasor's finish-time
    fairness, T_shared over T_independent, is `reasonsim dynasor fairness`)."""
    rho = ((progs.finish_s - progs.arrival_s) / progs.deadline_s).to_numpy()
    return {"mean": float(rho.mean()), "p90": float(np.percentile(rho, 90)),
            "max": float(rho.max())}


def compare(sim_programs, live_programs) -> dict:
    """Decision agreement and sim-vs-live errors of two programs tables (pandas)."""
    s = sim_programs.set_index("program_id").sort_index()
    v = live_programs.set_index("program_id").loc[s.index]
    same_stop = (s.stop_position_tokens.fillna(-1).astype(int) ==
                 v.stop_position_tokens.fillna(-1).astype(int)) & (s.paths == v.paths)
    ss, vs = program_summary(s.reset_index()), program_summary(v.reset_index())

    def err(a: float, b: float) -> float:
        return float((a - b) / b) if b else float("nan")

    return {
        "programs": int(len(s)),
        "decision_agreement": float(same_stop.mean()),
        "answer_agreement": float((s.answer.fillna("") == v.answer.fillna("")).mean()),
        "sim": ss, "live": vs,
        "error": {"tokens_per_program": err(ss["tokens_per_program"], vs["tokens_per_program"]),
                  "accuracy": ss["accuracy"] - vs["accuracy"],
                  "slo_attainment": ss["slo_attainment"] - vs["slo_attainment"],
                  **{f"program_latency_{k}": err(ss["program_latency_s"][k],
                                                 vs["program_latency_s"][k])
                     for k in ("mean", "p50", "p90", "p99")}},
    }

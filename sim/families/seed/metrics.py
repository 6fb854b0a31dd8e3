"""ToT metrics: acceptance, verify queue waits, target idle time (sim-vs-live: `validation.seed`).

Both read `tot_requests` tables, which the simulator and the live runner write alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def queue_waits_s(t: pd.DataFrame) -> np.ndarray:
    """Per verification: seconds from its draft's finish to reaching the target."""
    key = ["program_id", "node", "round"]
    d = t[t.kind == "draft"].set_index(key).finish_s
    v = t[t.kind == "verify"].set_index(key).sent_s
    w = (v - d.reindex(v.index)).dropna().to_numpy(dtype=float)
    return np.maximum(w, 0.0)


def tot_summary(t: pd.DataFrame, busy_s: dict, makespan_s: float) -> dict:
    """Acceptance, tokens per round, verify queue waits and pool busy fractions."""
    v = t[t.kind == "verify"]
    out = {"tot_requests": int(len(t)), "tot_thoughts": int((t.kind == "eval").sum())}
    if len(v):
        waits = queue_waits_s(t)
        out.update(acceptance_rate=float(v.accepted_tokens.sum() / max(1, v.drafted_tokens.sum())),
                   tokens_per_round=float(v.output_tokens.mean()),
                   verify_queue_wait_p50_s=float(np.median(waits)) if len(waits) else 0.0,
                   verify_queue_wait_p90_s=float(np.quantile(waits, 0.9)) if len(waits) else 0.0)
    for pool, s in busy_s.items():
        out[f"{pool}_busy_fraction"] = float(s / makespan_s) if makespan_s > 0 else 0.0
    return out

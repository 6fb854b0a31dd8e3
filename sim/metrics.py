"""Summary metrics of a requests table: the same code scores simulated and live runs."""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = {"mean": None, "p50": 50, "p90": 90, "p99": 99}


def stats(values) -> dict:
    """Mean, P50, P90 and P99 of finite values (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {k: float("nan") for k in PERCENTILES}
    return {k: float(v.mean()) if p is None else float(np.percentile(v, p))
            for k, p in PERCENTILES.items()}


def latency_columns(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT and end-to-end latency per request (seconds)."""
    ttft = requests.first_token_s - requests.arrival_s
    tpot = (requests.finish_s - requests.first_token_s) / (requests.output_tokens - 1).where(
        requests.output_tokens > 1)
    e2e = requests.finish_s - requests.arrival_s
    return pd.DataFrame({"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e})


def summarize(requests: pd.DataFrame, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None) -> dict:
    """Headline metrics: latency stats, throughput, and SLO attainment when SLOs are given."""
    lat = latency_columns(requests)
    span = float(requests.finish_s.max() - requests.arrival_s.min()) if len(requests) else 0.0
    return summarize_latencies({k: lat[k].to_numpy() for k in lat.columns},
                               int(requests.output_tokens.sum()), span, slo_ttft_s, slo_tpot_s)


def summarize_latencies(lat: dict, output_tokens: int, span: float,
                        slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """`summarize` of requests given as their latency columns (`latency_columns`' ttft_s, tpot_s,
    e2e_s), their output tokens and first arrival to last finish (seconds)."""
    n = len(lat["e2e_s"])
    out = {"requests": n,
           "output_tokens": output_tokens,
           "makespan_s": span,
           "throughput_tok_s": float(output_tokens / span) if span > 0 else 0.0,
           "throughput_req_s": float(n / span) if span > 0 else 0.0}
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        out[col] = stats(lat[col])
    if slo_ttft_s is not None or slo_tpot_s is not None:
        ok = np.ones(n, dtype=bool)
        if slo_ttft_s is not None:
            ok &= lat["ttft_s"] <= slo_ttft_s
        if slo_tpot_s is not None:
            tpot = lat["tpot_s"]
            ok &= np.where(np.isnan(tpot), 0.0, tpot) <= slo_tpot_s
        out["slo_attainment"] = float(ok.mean()) if len(ok) else float("nan")
        out["goodput_req_s"] = float(ok.sum() / span) if span > 0 else 0.0
    return out

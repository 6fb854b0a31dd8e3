"""HELIOS simulated against live: the same model and depth per prompt, the same events and exits,
and each figure's error, raw and at the live runs' step speed."""

from __future__ import annotations

import math

import numpy as np

from sim.families.helios.serving import HeliosResult
from validation.judge import speed_warning

METRICS = ("throughput_tok_s", "ttft_p50_s", "tpot_p50_s", "mean_batch", "perplexity",
           "full_model_agreement")
"""the figures a replay compares"""
# How a metric scales with step time: throughput inversely, latencies along, the rest not at all
TIME_POWER = {"throughput_tok_s": -1, "ttft_p50_s": 1, "tpot_p50_s": 1}


def compare(sim: HeliosResult, lives: list[HeliosResult]) -> dict:
    """Decision agreement and, per metric, sim, live median, error and live-vs-live spread; for
    time metrics also the error at the live runs' step speed (`step_speed`: a live run's step
    time over the simulated, summed over rounds; the simulated times scaled by its median,
    loads included), beside the raw error."""
    s = sim.summary()
    sim_busy_ms = float(sim.rounds.busy_ms.sum())
    speed = [float(lv.rounds.busy_ms.sum()) / sim_busy_ms if sim_busy_ms else math.nan
             for lv in lives]
    level = float(np.median(speed))
    out: dict = {"decisions": agreement(sim, lives[0]), "step_speed": speed, "metrics": {},
                 "speed_warning": speed_warning({"exits calibration": level})}
    for m in METRICS:
        vals = [lv.summary()[m] for lv in lives]
        live = float(np.median(vals))
        spread = (max(vals) - min(vals)) / live if len(vals) > 1 and live else math.nan
        out["metrics"][m] = row = {"sim": s[m], "live": live, "error": (s[m] - live) / live
                                   if live else math.nan, "live_spread": spread}
        if m in TIME_POWER and live:
            row["error_at_live_speed"] = s[m] * level ** TIME_POWER[m] / live - 1.0
    return out


def agreement(a: HeliosResult, b: HeliosResult) -> dict:
    """Share of prompts served by the same model and depth; equal event lists; equal output
    lengths; share of tokens (by prompt and position) leaving at the same exit layer."""
    m = a.requests.merge(b.requests, on="prompt", suffixes=("_a", "_b"))
    same = (m.model_a == m.model_b) & (m.depth_a == m.depth_b)
    ev_a = [(i, s.event, s.model, s.depth) for i, s in a.events]
    ev_b = [(i, s.event, s.model, s.depth) for i, s in b.events]
    tokens = same_exit = 0
    for xa, xb in zip(m.exit_layers_a, m.exit_layers_b):
        tokens += max(len(xa), len(xb))
        same_exit += sum(x == y for x, y in zip(xa, xb))
    return {"prompts": float(same.mean()), "events_equal": ev_a == ev_b,
            "events": len(ev_a), "same_output_tokens": float(
                (m.output_tokens_a == m.output_tokens_b).mean()),
            "same_exit_layers": same_exit / tokens if tokens else math.nan}

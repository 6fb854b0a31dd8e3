"""HELIOS simulated against live: the same model and depth per prompt, the same events and exits,
and each figure's error, raw, at the live runs' step speed, and at the machine's speed around
each round (`at_local_speed`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.families.helios.serving import HeliosResult
from validation.judge import speed_warning

METRICS = ("throughput_tok_s", "ttft_p50_s", "tpot_p50_s", "mean_batch", "perplexity",
           "full_model_agreement")
"""the figures a replay compares"""
# How a metric scales with step time: throughput inversely, latencies along, the rest not at all
TIME_POWER = {"throughput_tok_s": -1, "ttft_p50_s": 1, "tpot_p50_s": 1}
LOCAL_WINDOW = 2
"""rounds each side of a round whose live step speed re-times it (`at_local_speed`)"""


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
    _judge_at_local_speed(out, sim, lives)
    return out


def _judge_at_local_speed(out: dict, sim: HeliosResult, lives: list[HeliosResult]) -> None:
    """Each time metric's error with the simulation re-timed per live run (`at_local_speed`),
    its median against the live median; nothing where a live run served other rounds (or one
    round only)."""
    try:
        local = [at_local_speed(sim, lv).summary() for lv in lives]
    except ValueError:
        return
    for m in TIME_POWER:
        row = out["metrics"][m]
        if row["live"]:
            row["error_at_local_speed"] = float(np.median([x[m] for x in local])) / row["live"] \
                - 1.0


def check_same_rounds(sim_rounds, live_rounds) -> None:
    """Raise unless both runs served the same rounds (model, depth, prompts) in the same order:
    what comparing them round by round needs (equal decisions give it)."""
    shape = ["model", "depth", "batch"]
    if sim_rounds[shape].values.tolist() != live_rounds[shape].values.tolist():
        raise ValueError("the live run served other rounds than the simulation")


def local_levels(sim_busy_ms, live_busy_ms, window: int = LOCAL_WINDOW) -> np.ndarray:
    """Per round, the live over the simulated step time of the `window` rounds each side of it,
    itself left out: the machine's speed at that moment, measured on other rounds."""
    sim_ms, live_ms = np.asarray(sim_busy_ms, float), np.asarray(live_busy_ms, float)
    n = len(sim_ms)
    if n < 2 or len(live_ms) != n:
        raise ValueError(f"local levels need two or more rounds, alike in both runs "
                         f"({n} simulated, {len(live_ms)} live)")
    levels = np.empty(n)
    for i in range(n):
        near = np.r_[max(0, i - window):i, i + 1:min(n, i + window + 1)]
        levels[i] = live_ms[near].sum() / sim_ms[near].sum()
    return levels


def at_local_speed(sim: HeliosResult, live: HeliosResult,
                   window: int = LOCAL_WINDOW) -> HeliosResult:
    """The simulation re-timed round by round at the live run's step speed around each round
    (`local_levels`): every time inside a round scaled by its level, the time between rounds
    (loads, the loop's last host time) kept. A shared machine's speed moves within a run (it
    can halve within seconds), so one level per run judges the model on the machine's drift;
    a level from the rounds around each one judges the round's own price, its prefill against
    its decode, and its neighbours' shapes against each other."""
    if sim.rounds.get("replica_id", pd.Series([0])).nunique() > 1:
        raise ValueError("re-timing per round needs one replica's rounds")
    rounds = sim.rounds.sort_values("start_s").reset_index(drop=True)
    check_same_rounds(rounds, live.rounds)
    levels = local_levels(rounds.busy_ms, live.rounds.busy_ms, window)
    req = sim.requests
    starts = rounds.start_s.to_numpy()
    ends = rounds.start_s.map(req.groupby("arrival_s").finish_s.max()).to_numpy()
    between = np.r_[starts[0], starts[1:] - ends[:-1]]
    new_starts = np.cumsum(between + np.r_[0.0, ((ends - starts) * levels)[:-1]])
    k = req.arrival_s.map(dict(zip(starts, range(len(starts))))).to_numpy()
    f, t0 = levels[k], new_starts[k]
    requests = req.assign(arrival_s=t0, first_token_s=t0 + (req.first_token_s - req.arrival_s) * f,
                          finish_s=t0 + (req.finish_s - req.arrival_s) * f)
    return HeliosResult(requests, rounds.assign(start_s=new_starts,
                                                busy_ms=rounds.busy_ms * levels),
                        sim.events, sim.candidates)


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

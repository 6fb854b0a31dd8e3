"""Log-probability rows: recorded per step from vLLM, fitted as a step-time term, charged by the
simulator."""

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
from sim.calibration import load_calibration
from sim.latency import fit
from sim.logprob_cost import fit_logprob_cost, logprob_ms
from sim.replica import Replica, ReplicaConfig
from sim.request_state import Req, Results

CALIB = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"

# Three requests in one engine: plain, prompt log-probabilities (k = 1), sampled ones (k = 2).
_RECORD = """
import json, sys, time
from pathlib import Path
from traces.store import TraceWriter
from tracers.engine import Engine, EngineSpec
from tracers.recorder import StepRecorder
from vllm import SamplingParams
out = Path(sys.argv[1])
e = Engine(EngineSpec(model="models/testbed/target-large", kv_cache_gb=0.25, max_model_len=256))
rec = StepRecorder(e, TraceWriter(out, e.run_row("live", 0, {})), time.perf_counter())
rec.add("plain", list(range(5, 35)), SamplingParams(max_tokens=3, ignore_eos=True))
rec.add("scored", list(range(5, 45)), SamplingParams(max_tokens=1, prompt_logprobs=1,
                                                      detokenize=False))
rec.add("sampled", list(range(5, 25)), SamplingParams(max_tokens=3, logprobs=2, ignore_eos=True))
while e.engine.has_unfinished_requests():
    rec.step()
rec.writer.flush("all")
"""


@pytest.mark.engine
def test_the_recorder_counts_the_log_probability_rows_vllm_returns(tmp_path):
    from traces import check_trace, read_table

    proc = subprocess.run([sys.executable, "-c", _RECORD, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert check_trace(tmp_path) == []
    steps = read_table(tmp_path, "steps").to_pandas()
    rows = read_table(tmp_path, "step_logprobs").to_pandas().sort_values("step_id")
    assert steps.prefill_tokens.iloc[0] == 30 + 40 + 20
    # step 0: 40 scored prompt positions at k = 1, and the sampled request's first token (k = 2);
    # then its two decode tokens. The plain request adds none.
    assert rows[["step_id", "logprob_tokens", "logprob_top_k"]].values.tolist() == \
        [[0, 41, 42], [1, 1, 2], [2, 1, 2]]


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
                          "duration_ms": (plain_ms + 0.005 * tokens + 0.004 * top_k) * noise})
    cols = ["prefill_tokens", "decode_seqs", "context_tokens"]

    def fit_rows(rows):
        return fit(*(rows[c] for c in cols), rows.duration_ms)

    def predict_ms(m, rows):
        return m.predict_ms(*(rows[c] for c in cols)) * m.residual_sampler()[0]

    per_token, per_k = fit_logprob_cost(steps, fit_rows, predict_ms)
    assert per_token == pytest.approx(0.005, rel=0.25) and per_k == pytest.approx(0.004, rel=0.05)
    assert np.allclose(logprob_ms(steps, (per_token, per_k)),
                       per_token * tokens + per_k * top_k)
    # every step has rows: not separable from the step time
    assert fit_logprob_cost(steps[steps.logprob_tokens > 0], fit_rows, predict_ms) is None
    assert fit_logprob_cost(steps[steps.logprob_tokens == 0], fit_rows, predict_ms) == (0, 0)


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

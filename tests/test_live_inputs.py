"""The commands that start an engine refuse a bad input before it starts: a number no engine
can take (NaN, inf, negative, zero counts), a config of another family, a used output
directory, an output inside an input trace, a request longer than the calibration's engine
took. None of these cases starts an engine (each would have taken 10-30 s to fail inside one)."""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO, run_cli

DATA, EX = REPO / "traces" / "data", REPO / "examples"


@pytest.mark.parametrize("args, message", [
    (["trace", "probes", "-o", "{tmp}/p", "--temperature", "-1"],
     "--temperature: expected a finite number in [0, 100], got '-1'"),
    (["trace", "probes", "-o", "{tmp}/p", "--probe-temperature", "nan"],
     "expected a finite number in [0, 100], got 'nan'"),
    (["trace", "steps", "-o", "{tmp}/s", "--kv-cache-gb", "inf"],
     "--kv-cache-gb: expected a finite number in (0, 10000], got 'inf'"),
    (["trace", "steps", "-o", "{tmp}/s", "--max-num-seqs", "0"],
     "--max-num-seqs: expected an integer >= 1, got '0'"),
    (["trace", "branches", "-o", "{tmp}/b", "--budget", "0"], "--budget: expected an integer"),
    (["trace", "branches", "-o", "{tmp}/b", "--methods", "sc,sc"], "a name repeats in 'sc,sc'"),
    (["trace", "serve", "--rate", "nan", "-o", "{tmp}/v", "--url", "http://127.0.0.1:1"],
     "--rate: expected a finite number in [1e-05, inf]"),
    (["trace", "spec", "-o", "{tmp}/k", "--temperatures", "0,0"], "a value repeats"),
    (["trace", "exits", "-o", "{tmp}/e", "--ee-thresholds", "0.9,0.9"], "0.9 repeats"),
    (["trace", "probes", "-o", "{tmp}/p", "--device", "cuda"], "--device cuda: only with --engine "
                                                             "torch"),
    (["trace", "steps", "-o", "{tmp}/s", "--dtype", "foo"], "argument --dtype: invalid choice"),
    (["helios", "replay", str(EX / "helios-testbed.yaml"), "--policies", "a,a"],
     "a name repeats in 'a,a'"),
    (["testbed", "eval", "--save", "{tmp}/no/such/dir/x.json"], "no directory"),
    (["helios", "replay", str(EX / "helios-opt-whatif.yaml")], "a what-if config"),
    (["a1", "replay", str(EX / "a1-async.yaml"), "--repeats", "0"], "--repeats: expected"),
    (["a1", "replay", str(EX / "replay-small.yaml")],
     "not a a1 program config: needs workload.programs.method: a1"),
    (["seed", "replay", str(EX / "a1-async.yaml"), "-o", "{tmp}/r"], "not a tot program config"),
    (["seed", "replay", str(EX / "seed-greedy-small.yaml"), "--modes", "ar,foo", "-o", "{tmp}/r"],
     "'foo' is not a tot policy"),
    (["a1", "replay", str(EX / "a1-async.yaml"), "-o", "{used}"], "not empty"),
    (["seed", "replay", str(EX / "seed-greedy-small.yaml"), "-o", "{used}"], "not empty"),
    (["replay", str(EX / "replay-small.yaml"), "-o", "{used}"], "not empty"),
    (["replay", str(EX / "replay-small.yaml"), "-o", "{tmp}/r", "--model",
      str(REPO / "models" / "testbed" / "draft")], "not the model"),
    (["replay", str(EX / "replay-small.yaml"), "-o", "{tmp}/r", "--model", "/nonexistent"],
     "--model: model directory /nonexistent does not exist"),
    (["dynasor", "replay", str(EX / "dynasor-cot-certaindex.yaml"), "-o", "{tmp}/d", "--model",
      str(REPO / "models" / "testbed" / "draft")], "testbed-probes-cpu was recorded on"),
    (["dynasor", "replay", str(EX / "dynasor-cot-certaindex.yaml"), "-o", "{tmp}/d", "--url",
      "notaurl"], "expected a server URL such as http://127.0.0.1:8000, got 'notaurl'"),
    (["trace", "serve", "-o", "{tmp}/v", "--url", "http://127.0.0.1:port"],
     "expected a server URL"),
    (["testbed", "build", "-o", "{tmp}/t", "--init-from", "{tmp}/none"],
     "--init-from: model directory"),
    (["trace", "spec", "-o", "{tmp}/k", "--target", "{tmp}/none"], "none does not exist"),
    (["trace", "steps", "-o", "{tmp}/s", "--max-model-len", "100000"],
     "max_model_len 100000 exceeds the model's max_position_embeddings 2048"),
    (["trace", "tot", "-o", "{tmp}/t", "--draft", str(REPO / "models" / "testbed" / "eval.json")],
     "eval.json is a file, not a directory"),
    (["replay", str(EX / "dynasor-cot-certaindex.yaml"), "-o", "{tmp}/r"],
     "a program workload (workload.programs); `reasonsim dynasor replay` replays"),
])
def test_a_bad_input_is_refused_before_any_engine_starts(tmp_path, args, message):
    used = tmp_path / "used"
    used.mkdir()
    (used / "earlier.txt").write_text("a run's output\n")
    args = [a.format(tmp=tmp_path, used=used) for a in args]
    proc = run_cli(*args, check=False, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and (used / "earlier.txt").exists()


def test_an_output_inside_an_input_trace_is_refused(tmp_path):
    """calibrate's output over a trace's manifest, a replay writing into its programs' trace."""
    trace = tmp_path / "steps"
    shutil.copytree(DATA / "testbed-large-cpu", trace)
    proc = run_cli("calibrate", str(trace), "-o", str(trace / "_manifest.json"), check=False)
    assert proc.returncode == 2 and "inside the input trace" in proc.stderr, proc.stderr
    probes = tmp_path / "probes"
    shutil.copytree(DATA / "testbed-probes-cpu", probes)
    text = (EX / "dynasor-cot-certaindex.yaml").read_text()
    config = tmp_path / "cot.yaml"
    config.write_text(text.replace("../traces/data/testbed-probes-cpu", str(probes))
                      .replace("../", f"{REPO}/"))
    proc = run_cli("dynasor", "replay", str(config), "-o", str(probes / "out"), check=False)
    assert proc.returncode == 2 and "inside the input trace" in proc.stderr, proc.stderr
    assert not (probes / "out").exists()


def test_a_resumed_step_trace_of_another_kind_or_grid_is_refused_before_the_engine(tmp_path):
    for name, message in (("testbed-probes-cpu", "a probes trace, not a steps trace"),
                          ("testbed-large-cpu", "traced with another grid (differs in")):
        shutil.copytree(DATA / name, tmp_path / name)
        proc = run_cli("trace", "steps", "-o", str(tmp_path / name), "--resume",
                       check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_retrace_into_its_own_input_trace_is_refused(tmp_path):
    exits = tmp_path / "exits"
    shutil.copytree(DATA / "testbed-exits-target-small-cpu", exits)
    config = tmp_path / "helios.yaml"
    config.write_text((EX / "helios-testbed.yaml").read_text()
                      .replace("../traces/data/testbed-exits-target-large-cpu", str(exits))
                      .replace("../traces/data/testbed-exits-target-small-cpu", str(exits))
                      .replace("../", f"{REPO}/"))
    proc = run_cli("helios", "replay", str(config), "--retrace", str(exits), check=False)
    assert proc.returncode == 2 and "inside the input trace" in proc.stderr, proc.stderr


def test_a_request_longer_than_the_calibrations_engine_is_refused_before_replay(tmp_path):
    cfg = tmp_path / "long.yaml"
    cal = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
    cfg.write_text("seed: 1\nworkload: {arrival: {kind: poisson, rate_per_s: 3}, num_requests: 4,"
                   f" prompt_tokens: 3000, output_tokens: 8}}\ncluster: {{replicas: "
                   f"[{{calibration: {cal}}}]}}\n")
    proc = run_cli("replay", str(cfg), "-o", str(tmp_path / "r"), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "request 0 (prompt 3000 + output 8 tokens) exceeds max_model_len 1280 of " \
        f"{cal}, the engine it was traced on" in proc.stderr
    assert not (tmp_path / "r").exists()

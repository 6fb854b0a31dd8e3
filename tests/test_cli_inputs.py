"""The family commands' flags: a value that would give a wrong answer with exit 0 (a repeated
row, a flag the trace's kind never reads, a target or threshold outside its range, a config of
the wrong family or role) is a one-line error naming it."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli

DATA, EX = REPO / "traces" / "data", REPO / "examples"
PROBES, BRANCHES = str(DATA / "testbed-probes-cpu"), str(DATA / "testbed-branches-cpu")
EXITS = str(DATA / "testbed-exits-target-large-cpu")


@pytest.mark.parametrize("args, message", [
    (["dynasor", "correlate", PROBES, "--window", "0"], "expected an integer >= 1, got '0'"),
    (["dynasor", "online", str(EX / "dynasor-certaindex.yaml"), "--target", "1.5"],
     "--target: expected a number in (0, 1], got '1.5'"),
    (["helios", "offline", EXITS, "--breach-threshold", "nan"], "expected a number in (0, 1]"),
    (["dynasor", "offline", PROBES, "--windows", "3,3"], "a value repeats in '3,3'"),
    (["traces", "check", PROBES, "--max-errors=-1"], "expected an integer >= 0"),
    (["seed", "modes", str(EX / "seed-greedy-small.yaml"), "--modes", "ar,ar"],
     "a name repeats in 'ar,ar'"),
    (["a1", "offline", str(DATA / "testbed-conformity-cpu"), "--calib-samples", "0"],
     "expected an integer >= 1"),
    (["dynasor", "offline", PROBES, "--per-round", "3"],
     "--per-round: not read on a probes trace (" + PROBES + ")"),
    (["dynasor", "offline", BRANCHES, "--windows", "2"], "--windows: not read on a branches"),
    (["dynasor", "correlate", PROBES, "--method", "mcts"], "--method: not read on a probes"),
    (["dynasor", "correlate", BRANCHES, "--window", "5"], "--window: not read on a branches"),
    (["dynasor", "calibrate", BRANCHES, "--method", "sc", "--cap", "16"],
     "certaindex would never stop a program"),
    (["helios", "offline", EXITS, str(DATA / "testbed-exits-target-large-h100")],
     "a second trace of model 'target-large'"),
    (["a1", "samples", str(EX / "a1-target-only.yaml")], "its policy is target_only"),
    (["a1", "budget", str(EX / "demo.yaml")], "not an A1 program config"),
    (["dynasor", "ablation", str(EX / "dynasor-certaindex.yaml"),
      str(EX / "dynasor-baseline-even.yaml")], "must allocate evenly (no early stop)"),
])
def test_a_flag_that_would_answer_wrongly_is_refused(args, message):
    """Each is refused before it writes anything (no -o needed)."""
    proc = run_cli(*args, check=False, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_online_refuses_two_configs_of_one_policy(tmp_path):
    """Its table keys by policy: two clusters of one policy would be pooled into one row."""
    text = (EX / "dynasor-certaindex.yaml").read_text().replace("../", f"{REPO}/").replace(
        "count: 256", "count: 12")
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(text)
    two.write_text(text.replace("count: 1\n", "count: 2\n"))
    proc = run_cli("dynasor", "online", str(one), str(two), "--rates", "1", "--slo-scales", "1",
                   "--schedulers", "fcfs", "-o", str(tmp_path / "o"), check=False, timeout=600)
    assert proc.returncode == 2 and "run the same policy" in proc.stderr, proc.stderr


def test_files_a_config_names_are_checked_where_they_are_read(tmp_path):
    """A model config with a zero or missing shape key, a calibration without its device, a
    Mooncake block id out of range, a trace's arrival beyond the clock's precision: one-line
    errors naming the file, not a ZeroDivisionError, KeyError or OverflowError (or latencies of
    0) later."""
    import json

    from policies.scheduling import make_scheduler
    from sim.model_shape import read_model_config
    from sim.step_time.calibration import load_calibration
    from sim.workloads.traces import replay
    from sim.workloads.schema import workload_spec

    shape = {"hidden_size": 64, "num_attention_heads": 0, "num_hidden_layers": 2,
             "vocab_size": 100}
    (tmp_path / "m.json").write_text(json.dumps(shape))
    with pytest.raises(ValueError, match="m.json: num_attention_heads is 0, must be a whole"):
        read_model_config(tmp_path / "m.json")
    (tmp_path / "m.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="m.json: no num_attention_heads"):
        read_model_config(tmp_path / "m.json")
    cal = json.loads((REPO / "sim" / "data" / "testbed-large-cpu.calib.json").read_text())
    cal["provenance"] = {}
    (tmp_path / "c.json").write_text(json.dumps(cal))
    with pytest.raises(ValueError, match="c.json: provenance.device: required"):
        load_calibration(tmp_path / "c.json")
    with pytest.raises(ValueError, match="default_remaining_tokens must be a whole number"):
        make_scheduler({"type": "dynasor", "default_remaining_tokens": "abc"})
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [-1, 2]},
            {"timestamp": 5, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="hash_ids' holds -1..2; block ids are integers"):
        replay(workload_spec({"trace": {"format": "mooncake", "path": "m.jsonl"}}).trace,
               tmp_path)
    (tmp_path / "v.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                    "0,100,20\n1e17,100,20\n")
    with pytest.raises(ValueError, match=r"v.csv \(time_scale 1\): Workload.arrival_s row 1"):
        replay(workload_spec({"trace": {"format": "vidur", "path": "v.csv"}}).trace, tmp_path)
    proc = run_cli("traces", "seal", str(tmp_path), check=False)
    assert proc.returncode == 2 and "not a trace directory" in proc.stderr, proc.stderr


def test_an_engines_validation_error_names_its_first_field():
    """vLLM's own config errors ("2 validation errors for ModelConfig") name the field."""
    from pydantic import BaseModel, ValidationError

    from reasonsim.cli import _one_line

    class ModelConfig(BaseModel):
        max_model_len: int
        dtype: str

    with pytest.raises(ValidationError) as e:
        ModelConfig(max_model_len="long", dtype=3)
    assert _one_line(e.value) == ("2 validation errors for ModelConfig: max_model_len: Input "
                                  "should be a valid integer, unable to parse string as an "
                                  "integer")
    assert _one_line(ValueError("first\nsecond")) == "first"

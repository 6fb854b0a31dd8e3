"""Live replay on the real vLLM engine (CPU build) and sim-vs-live validation of the same workload."""

from __future__ import annotations

import json
import math

import pytest

from conftest import REPO, run_cli, speed_figure as _speed
from engines.host_cpu import trace_stolen_share
from traces import check_trace, read_run, read_table

pytestmark = pytest.mark.engine


def test_replay_then_validate(tmp_path, local_calibration):
    # Simulate with a calibration of this machine: the shipped one belongs to another CPU.
    cfg = tmp_path / "small.yaml"
    cfg.write_text((REPO / "examples" / "replay-small.yaml").read_text()
                   .replace("../sim/data/testbed-large-cpu.calib.json", str(local_calibration)))
    assert str(local_calibration) in cfg.read_text()
    live, sim = tmp_path / "live", tmp_path / "sim"
    # stdout is the summary alone: vLLM's warnings go to stderr
    assert json.loads(run_cli("replay", str(cfg), "-o", str(live), "-q", "--json").stdout)[
        "requests"] == 60
    run_cli("simulate", str(cfg), "-o", str(sim), "--json")
    assert check_trace(live) == [] and check_trace(sim) == []
    assert read_run(live)["kind"] == "replay" and read_run(sim)["kind"] == "sim"
    lr, sr = read_table(live, "requests").to_pandas(), read_table(sim, "requests").to_pandas()
    # Same workload: same ids, prompt and output lengths, arrivals.
    m = lr.merge(sr, on="request_id", suffixes=("_live", "_sim"))
    assert len(m) == 60
    assert (m.prompt_tokens_live == m.prompt_tokens_sim).all()
    assert (m.output_tokens_live == m.output_tokens_sim).all()
    assert (m.arrival_s_live - m.arrival_s_sim).abs().max() < 1e-6
    result = json.loads(run_cli("validate", str(sim), str(live), "-o", str(tmp_path / "v"),
                                "--json").stdout)
    rows = result["metrics"]
    assert {"ttft_s.p50", "tpot_s.p90", "e2e_s.p99", "throughput_tok_s"} <= set(rows)
    for v in rows.values():
        assert math.isfinite(v["sim"]) and math.isfinite(v["live"]) and v["live"] > 0
        assert v["rel_err"] == pytest.approx(v["sim"] / v["live"] - 1)
    assert (tmp_path / "v" / "validate_cdf.png").stat().st_size > 0
    # Calibrated here: the devices match by name. Whether the live run's steps ran at the
    # calibration's speed depends on what else the machine ran meanwhile (the suite does not
    # bound it, nor the errors it moves: `reasonsim fidelity` reports them); the ratios are
    # measured, and far from a units error.
    assert result["device"]["match"]
    assert result["speed"]["prefill_steps"] > 0
    assert _speed(result["speed"]["decode_step_ratio"])
    assert _speed(result["speed"]["prefill_step_ratio"])
    # a verdict where the step speed matches; refused (and said why) where it does not
    same = result["speed"]["match"] and result["speed"]["probe_match"] is not False
    want = ("pass", "fail") if same else ("refused",)
    assert result["verdict"]["status"] in want, result["verdict"]
    # The speed probe ran on the warmed engine just before and after the run: its fixed decode
    # batches, priced by the same calibration, give the machine's speed level of the moment.
    probe = read_table(live, "speed_probe").to_pandas()
    assert set(probe.phase) == {"before", "after"}
    # The host's CPU ticks, sampled about once a second while serving and once at its end:
    # cumulative counts, so any span of the run has the share the hypervisor stole
    host = read_table(live, "host_cpu").to_pandas().sort_values("sample_index")
    assert len(host) >= 2 and list(host.sample_index) == list(range(len(host)))
    assert (host.at_s.diff().dropna() > 0).all() and (host.cpu_ticks.diff().dropna() >= 0).all()
    assert (host.steal_ticks.diff().dropna() >= 0).all()
    assert 0 <= trace_stolen_share(live) == result["speed"]["host_steal"] <= 1
    assert set(probe[probe.prefill_tokens == 0].decode_seqs) == {1, 4, 8}
    level = result["speed"]["probe"]
    # the levels are the machine's speed against the calibration's: figures, never bounds
    assert set(level) == {"before", "after", "level", "prefill"} and _speed(level["level"])
    # then one-prompt prefills of fixed lengths, repeated (the first of each a new shape, left
    # out): the machine's prefill speed, which moves apart from its decode speed
    one = probe[(probe.decode_seqs == 0) & (probe.prefill_seqs == 1)]
    assert (one.groupby("phase").prefill_tokens.value_counts() >= 4).sum() >= 2 * 2
    # the prefill factor is a fit of the moment's probe: None where it came out non-positive
    factor = level["prefill"]["factor"]
    assert _speed(level["prefill"]["level"]) and (factor is None or factor > 0)
    assert "speed probe" in run_cli("validate", str(sim), str(live), "-o",
                                    str(tmp_path / "v1")).stdout

    # A calibration traced on another device: flagged, and no verdict unless allowed.
    other = json.loads(local_calibration.read_text())
    other["provenance"]["device"] = "Another CPU 9000"
    (tmp_path / "other.calib.json").write_text(json.dumps(other))
    cfg.write_text(cfg.read_text().replace(str(local_calibration),
                                           str(tmp_path / "other.calib.json")))
    run_cli("simulate", str(cfg), "-o", str(tmp_path / "sim-other"), "--json")
    args = ("validate", str(tmp_path / "sim-other"), str(live), "-o", str(tmp_path / "v2"))
    flagged = json.loads(run_cli(*args, "--json").stdout)
    assert not flagged["device"]["match"] and "Another CPU 9000" in \
        flagged["device"]["calibrated_on"]
    assert flagged["verdict"]["status"] == "refused"
    assert "DEVICE MISMATCH" in run_cli(*args).stdout
    allowed = json.loads(run_cli(*args, "--json", "--allow-device-mismatch").stdout)
    assert allowed["verdict"]["status"] in ("pass", "fail")

    # Same device name, another speed (a VM's CPU name says little): the live decode steps
    # against a calibration three times slower than they ran are flagged by their speed. The
    # factor is taken against the live run's own measured ratio: a busy machine's live run may
    # itself run slower than the calibration (a fixed 3x once left the ratio inside tolerance).
    slow = json.loads(local_calibration.read_text())
    ratio = result["speed"]["decode_step_ratio"]
    slow["step_time_model"]["coef_ms"] = [3 * ratio * c
                                          for c in slow["step_time_model"]["coef_ms"]]
    (tmp_path / "slow.calib.json").write_text(json.dumps(slow))
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "other.calib.json"),
                                           str(tmp_path / "slow.calib.json")))
    run_cli("simulate", str(cfg), "-o", str(tmp_path / "sim-slow"), "--json")
    args = ("validate", str(tmp_path / "sim-slow"), str(live), "-o", str(tmp_path / "v3"))
    slowed = json.loads(run_cli(*args, "--json").stdout)
    assert slowed["device"]["match"] and not slowed["speed"]["match"]
    assert slowed["speed"]["decode_step_ratio"] < 1 / 1.5
    # the probe is leveled against the calibration's own probe (its grid ran one): the
    # machine's speed since, whatever the coefficients say, and the same as measured above
    assert slowed["speed"]["probe_against"] == "the calibration's own probe"
    assert slowed["speed"]["probe"]["level"] == pytest.approx(level["level"])
    # without one, against the prediction: then the level over the coefficients' factor
    del slow["provenance"]["speed_probe_ms"]
    (tmp_path / "slow.calib.json").write_text(json.dumps(slow))
    run_cli("simulate", str(cfg), "-o", str(tmp_path / "sim-slow2"), "--json")
    unref = json.loads(run_cli("validate", str(tmp_path / "sim-slow2"), str(live), "-o",
                               str(tmp_path / "v4"), "--json").stdout)["speed"]
    assert unref["probe_against"] == "prediction"
    from sim.step_time import registry as step_time
    from sim.step_time.live_speed import probe_level

    model = step_time.from_json(json.loads(local_calibration.read_text())["step_time_model"])
    assert unref["probe"]["level"] == pytest.approx(
        probe_level(model, live)["level"] / (3 * ratio), rel=0.05)
    assert slowed["verdict"]["status"] == "refused" and "SPEED MISMATCH" in run_cli(*args).stdout

    # The same step-time model with a reference probe four times faster (a calibration from a
    # faster machine than the live run's own probe measured): the probe, model-free, refuses a
    # verdict whatever the model predicts.
    fast = json.loads(local_calibration.read_text())
    fast["provenance"]["speed_probe_ms"] = {k: v * level["level"] / 4 for k, v in
                                            fast["provenance"]["speed_probe_ms"].items()}
    (tmp_path / "fast.calib.json").write_text(json.dumps(fast))
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "slow.calib.json"),
                                           str(tmp_path / "fast.calib.json")))
    run_cli("simulate", str(cfg), "-o", str(tmp_path / "sim-fast"), "--json")
    args = ("validate", str(tmp_path / "sim-fast"), str(live), "-o", str(tmp_path / "v5"))
    probed = json.loads(run_cli(*args, "--json").stdout)
    assert probed["device"]["match"] and probed["speed"]["probe_match"] is False
    assert probed["speed"]["probe"]["level"] == pytest.approx(4)
    assert probed["verdict"]["status"] == "refused" and "speed probe" in \
        probed["verdict"]["reason"]
    assert "PROBE MISMATCH" in run_cli(*args).stdout


def _report(path: str) -> int:
    import os
    import sys

    from pathlib import Path

    Path(path).write_text(json.dumps({"pid": os.getpid(), "var": os.environ.get("RS_JOB_VAR"),
                                      "preloaded": "vllm.entrypoints.llm" in sys.modules}))
    return os.getpid()


def _exit_3() -> None:
    raise SystemExit(3)


def _refuse(value: int) -> None:
    raise ValueError(f"value {value}: refused")


def test_engine_jobs_fork_from_a_preloaded_server_in_the_callers_environment(tmp_path,
                                                                               monkeypatch):
    from validation.replay import fresh_process

    seen = []
    for value in ("1", "2"):  # the server started with the first; the second job sees "2"
        monkeypatch.setenv("RS_JOB_VAR", value)
        pid = fresh_process(_report, str(tmp_path / f"{value}.json"))
        seen.append(json.loads((tmp_path / f"{value}.json").read_text()))
        assert pid == seen[-1]["pid"]  # what the job returned, back in this process
    assert [s["var"] for s in seen] == ["1", "2"]
    assert all(s["preloaded"] for s in seen) and seen[0]["pid"] != seen[1]["pid"]
    with pytest.raises(RuntimeError, match="_exit_3 failed in its own process"):
        fresh_process(_exit_3)
    # a job's bad-input error is the caller's one-line error, not a child's traceback
    with pytest.raises(ValueError, match="^value 7: refused$"):
        fresh_process(_refuse, 7)


def test_replay_refuses_multi_replica_config(tmp_path):
    proc = run_cli("replay", str(REPO / "examples" / "demo.yaml"), "-o", str(tmp_path / "x"),
                   check=False)
    assert proc.returncode == 2 and "live replay drives one engine" in proc.stderr

"""A live run's speed probe against a calibration: decode level, prefill level, and a serving
calibration scaled with its prefill terms apart."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from sim.step_time import registry as step_time
from sim.step_time.live_speed import own_level, probe_level, scaled_calibration
from sim.step_time.serving_features import PREFILL_FEATURES, engine_features

SERVING = REPO / "sim" / "data" / "testbed-large-tot-cpu.calib.json"
LINEAR = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"


def _model(path):
    return step_time.from_json(json.loads(path.read_text())["step_time_model"])


def _probe_steps() -> pd.DataFrame:
    """A probe phase's shapes, as `engines.speed_probe` runs them: decode batches, then
    one-prompt prefills of three lengths, four times each."""
    rows = []
    for batch in (1, 4, 8):
        rows.append((32 * batch, batch, 0, 32 * batch))
        rows += [(0, 0, batch, batch * (33 + i)) for i in range(100)]
    for tokens in (64, 256, 1024):
        rows += [(tokens, 1, 0, tokens)] * 4
    return pd.DataFrame(rows, columns=["prefill_tokens", "prefill_seqs", "decode_seqs",
                                       "context_tokens"])


def _write_probe(path, phases: dict[str, pd.DataFrame]) -> None:
    from traces import TraceWriter

    run = {"kind": "replay", "engine": "vllm-cpu", "engine_version": "0", "device": "cpu",
           "device_count": 2, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
           "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
           "created_at": datetime.now(timezone.utc), "params_json": "{}"}
    w = TraceWriter(path, run)
    for phase, p in phases.items():
        for i, r in enumerate(p.itertuples()):
            w.add("speed_probe", phase=phase, step_index=i, duration_ms=float(r.duration_ms),
                  prefill_tokens=int(r.prefill_tokens), prefill_seqs=int(r.prefill_seqs),
                  decode_seqs=int(r.decode_seqs), context_tokens=int(r.context_tokens))
    w.flush("all")
    w.seal()


def _timed(model, steps: pd.DataFrame, decode: float, prefill: float) -> pd.DataFrame:
    """The probe's steps taking the model's time, the prefill terms at `prefill` x and the
    rest at `decode` x (steps back to back, as the probe runs them)."""
    est = steps.assign(replica_id=0, step_id=range(len(steps)), run_id="p", is_warmup=False,
                       start_s=0.0, duration_ms=0.0)
    rest, own = model.prefill_split_ms(engine_features(est))  # all but its warm-up rows
    ms = np.concatenate([np.ones(len(steps) - len(rest)), decode * rest + prefill * own])
    return steps.assign(duration_ms=ms)


def test_the_probe_prefill_factor_recovers_how_much_slower_prefills_ran(tmp_path):
    model = _model(SERVING)
    steps = _probe_steps()
    own = own_level(model)  # levels read against the calibration's own steps, not the bare fit
    _write_probe(tmp_path, {"before": _timed(model, steps, 1.1 * own, 1.5 * own),
                            "after": _timed(model, steps, 0.9 * own, 1.3 * own)})
    level = probe_level(model, tmp_path)
    assert level["before"] == pytest.approx(1.1) and level["after"] == pytest.approx(0.9)
    assert level["level"] == pytest.approx(1.0)
    # the prefill steps' ratio lies between the two speeds: their fixed part ran at decode's
    pre = level["prefill"]
    assert 1.1 < pre["before"] < 1.5 and 0.9 < pre["after"] < 1.3
    # the factor on the prefill terms that, with the rest at the decode level, gives their time
    assert pre["factor"] == pytest.approx(1.4)
    # prefills faster than their fixed part allows (noise under short prompts' own terms): no
    # factor, not a negative one (a calibration scaled by it would price prefills below zero)
    noisy = _timed(model, steps, 1.1, 1.0)
    one = noisy.prefill_tokens.gt(0) & noisy.decode_seqs.eq(0)
    _write_probe(tmp_path / "noisy", {"before": noisy.assign(
        duration_ms=noisy.duration_ms.where(~one, noisy.duration_ms * 0.1))})
    assert probe_level(model, tmp_path / "noisy")["prefill"]["factor"] is None


def test_a_serving_calibration_scales_its_prefill_terms_apart(tmp_path):
    out = scaled_calibration(SERVING, 1.2, tmp_path / "s.json", prefill_factor=1.8)
    base, scaled = _model(SERVING), _model(out)
    names = json.loads(SERVING.read_text())["step_time_model"]["features"]
    for name, a, b in zip(names, base.coef_ms, scaled.coef_ms):
        assert b == pytest.approx(a * (1.8 if name in PREFILL_FEATURES else 1.2)), name
    probe = _probe_steps()
    steps = engine_features(probe.assign(replica_id=0, step_id=range(len(probe)), run_id="p",
                                         is_warmup=False, start_s=np.arange(len(probe)) * 0.01,
                                         duration_ms=1.0))
    rest, own = base.prefill_split_ms(steps)
    assert np.allclose(scaled.predict_ms(steps), 1.2 * rest + 1.8 * own)
    assert np.allclose(rest + own, base.predict_ms(steps))
    # a model without prefill terms of its own: refused, not scaled as if it had them
    with pytest.raises(ValueError, match="only a serving model"):
        scaled_calibration(LINEAR, 1.2, tmp_path / "l.json", prefill_factor=1.8)


def test_a_scaled_config_reads_and_writes_its_calibration_wherever_it_runs(tmp_path,
                                                                           monkeypatch):
    """A config's calibration is relative to its own directory and the output directory to
    the working directory (`replay -o reports/...` beside a config elsewhere): the scaled
    config reads the one and names the other so that either resolves."""
    import shutil
    from pathlib import Path

    from validation.fidelity_judging import scaled_config

    config_dir, work = tmp_path / "configs", tmp_path / "work"
    config_dir.mkdir(), work.mkdir()
    shutil.copy(SERVING, config_dir / "own.calib.json")
    monkeypatch.chdir(work)
    d = {"workload": {"arrival": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 2,
                      "prompt_tokens": 16, "output_tokens": 4},
         "cluster": {"replicas": [{"calibration": "own.calib.json", "count": 1}]}}
    cfg = scaled_config(d, 1.5, Path("out"), config_dir)
    written = cfg.replicas[0].calibration
    assert written.is_absolute() and written == (work / "out" / "calibration.json").resolve()
    assert np.allclose(_model(written).coef_ms, 1.5 * np.array(_model(SERVING).coef_ms))


def test_the_probe_is_leveled_against_the_calibrations_own_probe(tmp_path):
    # A grid's reference probe (`trace steps` runs it after its cells), then a live run whose
    # decodes ran 1.2x and prefills 1.5x of it: the levels say so whatever the model predicts.
    from sim.step_time.live_speed import probe_reference

    model = _model(SERVING)
    steps = _probe_steps()
    ref = _timed(model, steps, 0.8, 0.7)  # the model is off at these shapes: no matter
    _write_probe(tmp_path / "grid", {"reference": ref})
    reference = probe_reference([tmp_path / "grid", tmp_path / "no-probe"])
    assert reference["p0s0d4"] == pytest.approx(ref.duration_ms[ref.decode_seqs == 4].iloc[1:]
                                                .median())
    assert "p1024s1d0" in reference and "p32s1d0" not in reference  # repeats only
    slow = ref.duration_ms * np.where(ref.prefill_tokens > 0, 1.5, 1.2)
    _write_probe(tmp_path / "live", {"before": ref.assign(duration_ms=slow)})
    level = probe_level(model, tmp_path / "live", reference)
    assert level["level"] == pytest.approx(1.2) and level["prefill"]["level"] == pytest.approx(1.5)
    # the prefill terms move further than 1.5x: the rest of a prefill's time moved 1.2x only
    assert level["prefill"]["factor"] > 1.5
    assert probe_reference([tmp_path / "no-probe"]) is None
    # Calibration traffic probed before and after itself, at 0.9x and 1.6x of the grid's: the
    # reference pools every probe (a median per shape), not the one moment the grid ended.
    _write_probe(tmp_path / "traffic", {"before": ref.assign(duration_ms=0.9 * ref.duration_ms),
                                        "after": ref.assign(duration_ms=1.6 * ref.duration_ms)})
    pooled = probe_reference([tmp_path / "grid", tmp_path / "traffic"])
    assert pooled["p0s0d4"] == pytest.approx(reference["p0s0d4"], rel=0.02)
    assert pooled["p1024s1d0"] == pytest.approx(reference["p1024s1d0"])
    between = probe_reference([tmp_path / "traffic"])["p0s0d4"] / reference["p0s0d4"]
    assert 1.0 < between < 1.5  # two probes alone: between them


def test_a_probe_beyond_the_tolerance_and_its_own_noise_is_another_machine():
    from validation.judge import SPEED_TOLERANCE, probe_match, speed_warning

    assert probe_match(None) is None
    assert probe_match({"before": 1.1, "after": 1.2, "level": 1.15})
    assert not probe_match({"before": 2.0, "after": 2.1, "level": 2.05})
    assert not probe_match({"before": 0.4, "after": 0.42, "level": 0.41})
    # phases far apart (the machine moved during the run): the tolerance widens with them
    assert probe_match({"before": 1.2, "after": 2.2, "level": 1.7})
    assert speed_warning({"draft": 1.0, "target": 1.3}) is None
    warning = speed_warning({"draft": 1.0, "target": 2.0 * SPEED_TOLERANCE})
    assert warning.startswith("warning:") and "(target)" in warning and "draft" not in warning


def test_a_failing_verdict_says_when_the_hosts_steal_alone_could_explain_it():
    from validation.judge import verdict

    rows = {"e2e_s.p50": {"rel_err": 0.08}, "ttft_s.p50": {"rel_err": 0.02}}
    device = {"match": True}
    speed = {"match": True, "decode_step_ratio": 1.0}
    quiet = verdict(rows, device, speed={**speed, "host_steal": 0.01})
    assert quiet["status"] == "fail" and "stole" not in quiet["reason"]
    # 5% stolen: about 10% of the step time, over e2e's 5% tolerance
    stolen = verdict(rows, device, speed={**speed, "host_steal": 0.05})
    assert stolen["status"] == "fail" and "stole 5.0% of the CPU" in stolen["reason"]
    assert "stole" not in verdict(rows, device, speed={**speed, "host_steal": None})["reason"]
    ok = verdict({"e2e_s.p50": {"rel_err": 0.01}}, device, speed={**speed, "host_steal": 0.2})
    assert ok == {"status": "pass", "reason": "every metric within tolerance"}


def test_host_steal_is_the_stolen_share_of_the_ticks_between_the_samples_nearest(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from host_steal import read_samples, sample, steal_share

    log = tmp_path / "stat.log"
    sample(log, 0.01, count=2)  # this machine's own /proc/stat lines parse
    t, steal, total = read_samples(log)
    assert len(t) == 2 and t[1] > t[0] and total[1] >= total[0] > 0 and steal[1] >= steal[0]
    # user nice system idle iowait irq softirq steal, cumulative: 30 of 100 ticks stolen
    log.write_text("100.0 cpu 100 0 0 100 0 0 0 0 0 0\n"
                   "101.0 cpu 130 0 0 140 0 0 0 30 0 0\n"
                   "102.0 cpu 200 0 0 140 0 0 0 30 0 0\n")
    samples = read_samples(log)
    assert steal_share(samples, 100.0, 101.0) == pytest.approx(0.3)
    assert steal_share(samples, 100.0, 102.0) == pytest.approx(30 / 170)
    assert steal_share(samples, 99.0, 101.0) is None  # before the log began: not measured


def test_the_host_probe_level_is_its_median_within_a_span(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from host_probe import read_probes, sample, span_median

    log = tmp_path / "probe.log"
    sample(log, 0.01, count=3)  # this machine times the fixed product
    t, ms = read_probes(log)
    assert len(t) == 3 and (np.diff(t) > 0).all() and (ms > 0).all()
    log.write_text("".join(f"{100 + k}.0 {v}\n" for k, v in enumerate([2, 2, 3, 9, 4, 4])))
    probes = read_probes(log)
    assert span_median(probes, (100.0, 102.0)) == 2.0
    assert span_median(probes, (102.0, 105.0)) == 4.0  # 3, 9, 4, 4
    assert span_median(probes, (104.0, 105.0)) is None  # two probes: not a level
    assert span_median(probes, None) is None


def test_the_stolen_share_of_a_span_is_its_samples_tick_differences(tmp_path):
    from engines.host_cpu import cpu_ticks, stolen_share

    steal, total = cpu_ticks()  # this machine's own /proc/stat
    assert 0 <= steal <= total and total > 0
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 5 80 0 0 0 5 0 0\ncpu0 5 0 2 40 0 0 0 3 0 0\n")
    assert cpu_ticks(stat) == (5, 100)
    stat.write_text("intr 1 2 3\n")
    assert cpu_ticks(stat) is None and cpu_ticks(tmp_path / "absent") is None
    rows = pd.DataFrame({"at_s": [0.0, 1.0, 2.0], "steal_ticks": [5, 25, 25],
                         "cpu_ticks": [100, 200, 400]})
    assert stolen_share(rows) == pytest.approx(20 / 300)
    assert stolen_share(rows, 0.5, 2.0) == 0.0 and stolen_share(rows, 0.0, 1.0) == 0.2
    assert stolen_share(rows, 0.5, 1.5) is None  # one sample: no span measured

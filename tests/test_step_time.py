"""Step-time models plug into the replica by kind; calibration artifacts name theirs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from conftest import REPO
from inputs.strict import Strict
from sim.step_time import registry as step_time
from sim.step_time.calibration import load_calibration
from sim.config import parse_config
from sim.step_time.latency import LatencyModel
from sim.simulate import simulate

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
SERVING_CAL = REPO / "sim" / "data" / "testbed-large-tot-cpu.calib.json"


class PerStepJson(Strict):
    """What a registered kind declares: its parameters' types."""

    coef_ms: list[float]
    residual_log_quantiles: list[float]


@dataclasses.dataclass(frozen=True)
class PerStepOnly:
    """The linear model's arithmetic without its closed form: the replica must step each
    iteration as its own event (what a per-layer or draft/verify model may need)."""

    kind: ClassVar[str] = "test-per-step"
    version: ClassVar[int] = 1
    schema: ClassVar[type] = PerStepJson
    coef_ms: tuple
    residual_log_quantiles: tuple = (0.0,)

    def step_ms(self, prefill_tokens, decode_seqs, context_tokens) -> float:
        return LatencyModel(self.coef_ms).step_ms(prefill_tokens, decode_seqs, context_tokens)

    def decode_run(self, n_seqs, context0):
        return None

    def residual_sampler(self):
        return LatencyModel(self.coef_ms, self.residual_log_quantiles).residual_sampler()

    def to_json(self) -> dict:
        return {"coef_ms": list(self.coef_ms),
                "residual_log_quantiles": list(self.residual_log_quantiles)}

    @classmethod
    def from_json(cls, d: dict) -> "PerStepOnly":
        return cls(tuple(d["coef_ms"]), tuple(d["residual_log_quantiles"]))


def _config(calibration) -> dict:
    wl = {"arrival": {"kind": "poisson", "rate_per_s": 8}, "num_requests": 120,
          "prompt_tokens": {"kind": "uniform", "low": 32, "high": 256},
          "output_tokens": {"kind": "uniform", "low": 16, "high": 128}}
    return parse_config({"seed": 3, "workload": wl, "output": {"steps": False},
                         "cluster": {"replicas": [{"calibration": str(calibration)}]}})


def test_a_model_without_closed_form_runs_per_iteration_and_agrees(tmp_path):
    step_time.register(PerStepOnly)
    cal = load_calibration(CAL)
    d = cal.to_json()
    d["step_time_model"] = step_time.to_json(PerStepOnly(cal.latency.coef_ms,
                                                          cal.latency.residual_log_quantiles))
    (tmp_path / "per_step.json").write_text(json.dumps(d))
    linear = simulate(_config(CAL))
    per_step = simulate(_config(tmp_path / "per_step.json"))
    assert per_step.summary["events"] > linear.summary["events"]  # no fast-forward
    a = linear.requests.to_pandas()
    b = per_step.requests.to_pandas()
    assert np.allclose(a.finish_s, b.finish_s, rtol=1e-9, atol=1e-9)


def test_version_1_artifacts_load_as_the_linear_model_and_unknown_kinds_fail(tmp_path):
    cal = load_calibration(CAL)
    d = cal.to_json()
    v1 = {k: v for k, v in d.items() if k != "step_time_model"}
    v1.update(version=1, features=d["step_time_model"]["features"],
              coef_ms=d["step_time_model"]["coef_ms"],
              residual_log_quantiles=d["step_time_model"]["residual_log_quantiles"])
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    assert load_calibration(tmp_path / "v1.json").latency == cal.latency
    d["step_time_model"]["kind"] = "per-layer"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="unknown step-time model kind 'per-layer'"):
        load_calibration(tmp_path / "bad.json")
    d["step_time_model"].update(kind="linear", version=7)
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="re-run reasonsim calibrate"):
        load_calibration(tmp_path / "bad.json")


def _broken(tmp_path, edit, cal: Path = CAL) -> str:
    d = load_calibration(cal).to_json()
    edit(d)
    (tmp_path / "c.json").write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        load_calibration(tmp_path / "c.json")
    text = str(e.value)
    assert text.startswith(str(tmp_path / "c.json")) and "\n" not in text
    return text


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("engine_limits"), "engine_limits: required"),
    (lambda d: d["engine_limits"].pop("block_size"), "engine_limits.block_size: required"),
    (lambda d: d["engine_limits"].update(block_size=0), "engine_limits.block_size: Input should"),
    (lambda d: d.pop("provenance"), "provenance: required"),
    (lambda d: d.pop("heldout"), "heldout: required"),
    (lambda d: d["step_time_model"].update(coef_ms=None),
     "step_time_model.coef_ms: Input should be a valid list"),
    (lambda d: d["step_time_model"]["coef_ms"].__setitem__(0, "fast"),
     "step_time_model.coef_ms[0]: Input should be a valid number"),
    (lambda d: d["step_time_model"]["coef_ms"].__setitem__(1, float("nan")),
     "step_time_model.coef_ms[1]: Input should be a finite number"),
    (lambda d: d["step_time_model"]["coef_ms"].__setitem__(2, -0.1),
     "step_time_model.coef_ms[2]: Input should be greater than or equal to 0"),
    (lambda d: d["step_time_model"].update(coef_ms=[1.0, 2.0, 3.0, 4.0]),
     "step_time_model.coef_ms: List should have at least 5 items"),
    (lambda d: d["step_time_model"].update(coef_ms=[0.0] * 5), "makes iterations free"),
    (lambda d: d["step_time_model"].pop("residual_log_quantiles"),
     "step_time_model.residual_log_quantiles: required"),
    (lambda d: d["step_time_model"].update(coef_ms=[1e15, 0.1, 0.1, 0.0, 0.0]),
     "step_time_model.coef_ms[0]: Input should be less than or equal to 1000000"),
    (lambda d: d["step_time_model"].update(residual_log_quantiles=[0.0, 50.0]),
     "step_time_model.residual_log_quantiles[1]: Input should be less than or equal to 10"),
    (lambda d: d["step_time_model"].update(residual_log_quantile=[0.0]),
     "step_time_model: unknown key 'residual_log_quantile'"),
    # a misspelled top-level key would drop what it holds (the host terms: -13% latency)
    (lambda d: d.update(hosts=d.pop("host")), "calibration: unknown key 'hosts'"),
    (lambda d: d["host"].update(step_gap_ms=1e15), "host.step_gap_ms: Input should be less"),
    (lambda d: d["host"].update(add_request_ms=5e3), "host.add_request_ms: Input should be less"),
])
def test_broken_calibrations_are_one_line_errors_naming_the_key(tmp_path, edit, message):
    assert message in _broken(tmp_path, edit)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["step_time_model"]["coef_ms"].__setitem__(0, 1e15),
     "step_time_model.coef_ms[0]: Input should be less than or equal to 1000000"),
    (lambda d: d["step_time_model"]["coef_ms"].__setitem__(8, 1e15),
     "step_time_model.coef_ms[8]: Input should be less than or equal to 1000000"),
    (lambda d: d["step_time_model"].update(run_log_quantiles=[0.0, 50.0]),
     "step_time_model.run_log_quantiles[1]: Input should be less than or equal to 10"),
    (lambda d: d["step_time_model"].update(spell_log_quantiles=[float("inf")]),
     "step_time_model.spell_log_quantiles[0]: Input should be a finite number"),
    (lambda d: d["step_time_model"].update(prefill_pairs="yes"),
     "step_time_model.prefill_pairs: Input should be a valid boolean"),
])
def test_broken_serving_calibrations_name_the_key(tmp_path, edit, message):
    """The serving model's coefficients and speed levels are bounded as the linear model's."""
    assert message in _broken(tmp_path, edit, SERVING_CAL)


def test_a_serving_fit_priced_by_its_context_term_alone_loads(tmp_path):
    """A `calibrate --calibrate-here` fit on a busy machine put const, prefill and decode at 0
    and the context term above 0: a decode step still costs time, so it loads; with the context
    term 0 as well no decode step would, and it is refused."""
    d = load_calibration(SERVING_CAL).to_json()
    d["step_time_model"]["coef_ms"][:4] = [0.0, 0.0, 0.0, 0.0066]
    (tmp_path / "c.json").write_text(json.dumps(d))
    model = load_calibration(tmp_path / "c.json").latency
    assert model.step_ms(0, 1, 500) > 0
    zero = _broken(tmp_path, lambda d: d["step_time_model"]["coef_ms"].__setitem__(
        slice(0, 4), [0.0] * 4), SERVING_CAL)
    assert "makes iterations free" in zero


def test_a_linear_fit_priced_by_its_context_term_alone_loads_and_a_free_fit_is_refused(
        tmp_path):
    """The linear model's loader, as the serving one's: the context term alone prices a decode
    step; and a fit that would price none (here steps timed by prefill x context alone, which
    NNLS fits with that term only) is refused when fitted, not written and refused on loading."""
    from sim.step_time.latency import fit

    d = load_calibration(CAL).to_json()
    assert d["step_time_model"]["kind"] == "linear"
    d["step_time_model"]["coef_ms"][:4] = [0.0, 0.0, 0.0, 0.0066]
    (tmp_path / "c.json").write_text(json.dumps(d))
    assert load_calibration(tmp_path / "c.json").latency.step_ms(0, 1, 500) > 0
    zero = _broken(tmp_path, lambda d: d["step_time_model"]["coef_ms"].__setitem__(
        slice(0, 4), [0.0] * 4), CAL)
    assert "makes iterations free" in zero
    prefill = np.array([1, 1000, 100, 30, 500, 7])
    context = np.array([1000, 1, 100, 300, 20, 700])
    with pytest.raises(ValueError, match="makes iterations free"):
        fit(prefill, np.zeros(6), context, prefill * context / 1e3)


def test_a_calibration_with_a_key_twice_is_refused(tmp_path):
    """json keeps the last of two equal keys: a hand-edited calibration would silently change."""
    text = CAL.read_text().replace('"engine_limits": {', '"engine_limits": {"max_num_seqs": 4, ', 1)
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ValueError, match="c.json: duplicate key 'max_num_seqs'"):
        load_calibration(tmp_path / "c.json")


def test_a_calibration_that_is_a_list_is_refused(tmp_path):
    (tmp_path / "c.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a version-1 or -2 reasonsim calibration"):
        load_calibration(tmp_path / "c.json")


def _steps_trace(path, max_num_seqs: int, warmup: bool = False, **engine):
    from datetime import datetime, timezone

    from traces import TraceWriter

    run = {"kind": "steps", "engine": "vllm-cpu", "engine_version": "0", "device": "cpu",
           "device_count": 2, "model_id": "m", "model_config_hash": "h", "dtype": "float32",
           "load_format": "dummy", "seed": 0, "git_rev": "x", "command": "c",
           "created_at": datetime.now(timezone.utc),
           "params_json": json.dumps({"engine": {"max_num_seqs": max_num_seqs,
                                                 "max_num_batched_tokens": 2048,
                                                 "block_size": 16, "kv_blocks_total": 100,
                                                 **engine}})}
    w = TraceWriter(path, run)
    for i in range(40):
        w.add("steps", replica_id=0, step_id=i, cell_id=f"c{i % 8}", start_s=float(i),
              duration_ms=5.0 + i % 7 + 0.01 * (i % 5) * 64, prefill_tokens=(i % 5) * 64,
              prefill_seqs=int(i % 5 > 0), decode_seqs=i % 4, num_running=1, num_waiting=0,
              context_tokens=100 + 10 * i, kv_blocks_used=1, kv_blocks_total=100,
              preemptions=0, is_warmup=warmup)
    w.flush("all")
    w.seal()
    return path


def test_calibrate_refuses_mixed_engine_limits_and_all_warm_up_steps(tmp_path):
    from sim.step_time.calibration import calibrate

    a = _steps_trace(tmp_path / "a", 64)
    assert calibrate([a]).max_num_seqs == 64
    b = _steps_trace(tmp_path / "b", 8)
    with pytest.raises(ValueError, match="different engine limits"):
        calibrate([a, b])
    warm = _steps_trace(tmp_path / "w", 64, warmup=True)
    with pytest.raises(ValueError, match="every step is a warm-up step"):
        calibrate([warm], model="linear")
    # The serving model keeps first-of-shape steps (they are its data); only run start-up goes.
    assert calibrate([warm]).heldout["train_rows"] + calibrate([warm]).heldout["rows"] == 37
    # the same run twice would count its steps twice
    with pytest.raises(ValueError, match="the same run as"):
        calibrate([a, a])
    # max_model_len may differ (a replay's engine is sized to its workload): the longest is
    # kept, whatever the traces' order
    long = _steps_trace(tmp_path / "long", 64, max_model_len=4096)
    short = _steps_trace(tmp_path / "short", 64, max_model_len=1024)
    assert calibrate([short, long]).max_model_len == calibrate([long, short]).max_model_len \
        == 4096
    # a limit the trace does not record is refused, never invented
    blind = _steps_trace(tmp_path / "blind", 64, kv_blocks_total=None)
    with pytest.raises(ValueError, match="records no engine kv_blocks_total"):
        calibrate([blind])


def test_calibrate_refuses_a_simulations_output(tmp_path):
    from conftest import run_cli
    from sim.step_time.calibration import calibrate

    text = (REPO / "examples" / "replay-small.yaml").read_text().replace(
        "../sim/data/testbed-large-cpu.calib.json", str(CAL))
    (tmp_path / "c.yaml").write_text(text)
    run_cli("simulate", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "sim"), "--json")
    with pytest.raises(ValueError, match="a simulation's output"):
        calibrate([tmp_path / "sim"])


def test_calibrate_fits_through_the_registry_that_loads(tmp_path):
    """A kind fits by the class registered under its name, the one loading finds; a kind that is
    unknown or fitted elsewhere (the layered model, from a helios: config) is refused by name."""
    from sim.step_time.calibration import calibrate

    trace = _steps_trace(tmp_path / "a", 64)
    for kind in ("linear", "serving"):
        cal = calibrate([trace], model=kind)
        assert type(cal.latency) is step_time.fitter(kind) is step_time.STEP_TIME_MODELS[kind]
        assert step_time.from_json(step_time.to_json(cal.latency)) == cal.latency
    for kind in ("layered", "nonesuch"):
        with pytest.raises(ValueError, match=rf"step-time model '{kind}': calibrate fits "
                                             r"\['linear', 'serving'\]"):
            calibrate([trace], model=kind)
    with pytest.raises(ValueError, match="the linear model has no optional terms"):
        calibrate([trace], model="linear", without=("prefill_step",))


def test_a_step_plan_is_priced_whole():
    """The plan's price: the model's mean step, then the log-probability and seeded terms."""
    from dataclasses import replace

    from sim.step_time.calibration import load_calibration
    from sim.step_time.plan import StepPlan, StepPricer, prefill_spans

    cal = replace(load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json"),
                  logprob_step_ms=0.5, seeded_step_ms=0.2, seeded_seq_ms=0.01)
    pricer = StepPricer(cal)
    plain = StepPlan([], 0, 0, 8, 800)
    mean_ms, is_plain = pricer.mean_ms(plain)
    assert is_plain and mean_ms == cal.stepping.step_ms(0, 8, 800)
    assert pricer.extra_ms(plain) == 0.0
    # returned log-probabilities: once a step plus the requests' own; seeded: once plus each
    both = StepPlan([], 0, 0, 8, 800, logprob_ms=1.5, seeded_seqs=4)
    assert pricer.extra_ms(both) == pytest.approx(1.5 + 0.5 + 0.2 + 4 * 0.01)

    class Chunk:  # a prefill chunk of 64 tokens after 32 computed (cached or earlier chunks)
        computed, target = 32, 200

    assert prefill_spans([(Chunk(), 64)]) == {"span_context_tokens": 32,
                                             "prefill_pair_tokens": 64 * 96,
                                             "span_pair_tokens": 64 * 32}


def test_a_kind_without_a_parameter_schema_cannot_register():
    """Every kind's calibration parameters are checked by its declared schema: a kind that
    would parse its own JSON by hand is refused at registration."""

    class Unchecked:
        kind, version = "test-unchecked", 1

    with pytest.raises(TypeError, match="registers no schema"):
        step_time.register(Unchecked)
    assert "test-unchecked" not in step_time.STEP_TIME_MODELS

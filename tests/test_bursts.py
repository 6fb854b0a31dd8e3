"""A burst of other work beside a run (`validation.bursts`): a real live trace against its
calibration, and the same trace with a few seconds of its steps slowed as a neighbour does."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from conftest import REPO
from sim.step_time import latency, serving_latency  # noqa: F401  (the kinds register)
from sim.step_time import registry as step_time
from traces import read_run, read_table
from traces.store import write_tables
from validation.bursts import BURST_TOLERANCE, burst_warning, calibration_tail, step_tail

TRACE = REPO / "traces" / "data" / "testbed-programs-cpu"
CAL = REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json"


def _model(d: dict):
    return step_time.from_json(d["step_time_model"])


def _with_burst(tmp_path, factor: float, seconds: float):
    """The trace's steps with those of `seconds` in its middle `factor` times as long."""
    table = read_table(TRACE, "steps")
    steps = table.to_pandas()
    t0, t1 = steps.start_s.min(), steps.start_s.max()
    mid = (t0 + t1) / 2
    burst = (steps.start_s >= mid) & (steps.start_s < mid + seconds)
    steps.loc[burst, "duration_ms"] *= factor
    run = {k: v for k, v in read_run(TRACE).items() if k not in ("params", "run_id")}
    durations = pa.array(steps.duration_ms.to_numpy(), table.schema.field("duration_ms").type)
    slowed = table.drop_columns(["run_id"]).set_column(
        table.schema.get_field_index("duration_ms") - 1, "duration_ms", durations)
    write_tables(tmp_path / "burst", run, {"steps": slowed})
    return tmp_path / "burst", float(burst.mean())


def test_a_quiet_run_and_its_calibration_have_no_tail_and_no_warning():
    cal = json.loads(CAL.read_text())
    model = _model(cal)
    quiet = step_tail(model, TRACE)
    assert 0.95 < quiet < 1.0 + BURST_TOLERANCE
    assert 0.95 < calibration_tail(model) < 1.0 + BURST_TOLERANCE
    assert burst_warning([{"target": quiet}], {"target": calibration_tail(model)}) is None


def test_a_burst_beside_the_live_run_or_the_calibration_is_warned_of(tmp_path):
    """Four seconds of the run's steps at 4x (a neighbour's burst; the run's median step
    untouched): its total over its median speed rises past the calibration's, and the warning
    names the run; a calibration whose residuals carry such a tail is named in turn."""
    cal = json.loads(CAL.read_text())
    model = _model(cal)
    slowed, share = _with_burst(tmp_path, 4.0, 4.0)
    assert 0.03 < share < 0.3
    tail = step_tail(model, slowed)
    assert tail > step_tail(model, TRACE) * (1 + BURST_TOLERANCE)
    cal_tail = calibration_tail(model)
    warning = burst_warning([{"target": 1.01}, {"target": tail}], {"target": cal_tail})
    assert warning.startswith("warning: live run 1's steps on target") and "run 0" not in warning
    # the calibration's residual quantiles with their top tenth four times as slow
    q = np.asarray(cal["step_time_model"]["residual_log_quantiles"])
    q[q >= np.quantile(q, 0.9)] += np.log(4.0)
    burst_fit = _model({"step_time_model": {**cal["step_time_model"],
                                            "residual_log_quantiles": list(q)}})
    warning = burst_warning([{"target": 1.01}], {"target": calibration_tail(burst_fit)})
    assert warning.startswith("warning: the calibration's steps on target")

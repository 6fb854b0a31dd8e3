"""A burst of other work beside a run (`validation.bursts`): a real live trace against its
calibration, and the same trace with a few seconds of its steps slowed as a neighbour does."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa

from conftest import REPO
from sim.step_time import latency, serving_latency  # noqa: F401  (the kinds register)
from sim.step_time import registry as step_time
from traces import read_run, read_table
from traces.store import write_tables
from validation.bursts import (BURST_TOLERANCE, RERUNS_DIR, burst_warning, calibration_tail,
                              replay_quietly, step_tail, tails_against)

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


TRACES = REPO / "traces" / "data"
CALIBRATION = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"


def _replays(names: list[str]):
    """A replay that writes the shipped traces `names`, one an attempt, where it is asked."""
    queue = list(names)

    def replay(live):
        shutil.copytree(TRACES / queue.pop(0), live)
    return replay


def _same(live, name: str) -> bool:
    return (live / "_manifest.json").read_text() == \
        (TRACES / name / "_manifest.json").read_text()


def test_a_quiet_live_run_is_kept_as_it_ran(tmp_path):
    tails = tails_against(CALIBRATION)
    tail, own = tails(TRACES / "testbed-large-cpu")
    assert tail < own * (1 + BURST_TOLERANCE)  # quiet against this calibration
    live = tmp_path / "w" / "live1"
    live.parent.mkdir()
    got = replay_quietly(_replays(["testbed-large-cpu"]), live, tails, reruns=2,
                         clock=lambda: 5.0)
    assert got == {"tails": [tail], "kept": 0, "started": 5.0}
    assert _same(live, "testbed-large-cpu") and not (tmp_path / "w" / RERUNS_DIR).exists()


def test_a_live_run_in_a_burst_runs_again_and_the_quietest_attempt_is_judged(tmp_path):
    """Every attempt counted as served through a burst (a tolerance of -1): each runs again up
    to the reruns, the one of the lowest step tail takes the live run's place (when it
    started with it), the others lie aside, each whole."""
    tails = tails_against(CALIBRATION)
    names = ["testbed-spec-replay-cpu", "testbed-large-cpu", "testbed-probes-cpu"]
    by_tail = [tails(TRACES / n)[0] for n in names]
    assert by_tail[0] > by_tail[1] > by_tail[2]  # the last the quietest
    live = tmp_path / "w" / "live2"
    live.parent.mkdir()
    clock = iter([1.0, 2.0, 3.0])
    got = replay_quietly(_replays(names), live, tails, reruns=2, tolerance=-1,
                         clock=lambda: next(clock))
    assert got == {"tails": by_tail, "kept": 2, "started": 3.0}
    aside = tmp_path / "w" / RERUNS_DIR
    assert _same(live, names[2]) and _same(aside / "live2_1", names[0]) and \
        _same(aside / "live2_2", names[1])
    # an earlier attempt quieter than the last: it moves back to the live run's place
    live = tmp_path / "v" / "live1"
    live.parent.mkdir()
    clock = iter([1.0, 2.0])
    got = replay_quietly(_replays(names[1::-1]), live, tails, reruns=1, tolerance=-1,
                         clock=lambda: next(clock))
    assert got == {"tails": by_tail[1::-1], "kept": 0, "started": 1.0}
    aside = tmp_path / "v" / RERUNS_DIR
    assert _same(live, names[1]) and _same(aside / "live1_2", names[0]) and \
        not (aside / "live1_1").exists()


def test_the_report_names_each_live_run_run_again():
    from validation.fidelity_report import reruns_text

    rows = [{"workload": "poisson", "live_attempts": [{"tails": [1.02], "kept": 0},
                                                       {"tails": [1.19, 1.03], "kept": 1}]},
            {"workload": "bursty", "live_attempts": [{"tails": [1.01], "kept": 0}] * 2}]
    text = reruns_text({"live_reruns": 1, "workloads": rows})
    assert "up to 1 time(s): poisson live2 (step tails 1.19, 1.03; attempt 2 kept)." in text
    assert "bursty" not in text and f"WORKLOAD/{RERUNS_DIR}/" in text
    assert reruns_text({"live_reruns": 1, "workloads": rows[1:]}).startswith(
        "No live run served through a burst")
    assert reruns_text({"live_reruns": 0, "workloads": rows}) == ""

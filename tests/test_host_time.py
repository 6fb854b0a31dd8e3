"""The engine loop's host time fitted from a real live replay (shipped Parquet traces)."""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO
from sim.step_time.calibration import calibrate
from sim.step_time.host_time import HostTimes, fit_host_ms
from traces.store import read_table

REPLAY = REPO / "traces" / "data" / "testbed-spec-replay-cpu"
TOT = REPO / "traces" / "data" / "testbed-tot-cpu"
PROGRAMS = REPO / "traces" / "data" / "testbed-programs-cpu"


def test_a_live_replay_gives_the_loops_add_and_wake_times():
    """Requests of a replay arrive while a step runs and are added after it: the gaps that add
    one cost a fraction of a millisecond more than those that add none (the fit once counted
    only arrivals after the step's end and found none), a second one added in the same gap
    less, an idle loop wakes before its step, and a little passes between any two steps."""
    host = fit_host_ms([REPLAY])
    assert 0.1 < host.add_request_ms < 2.0
    assert host.add_next_ms is None  # no gap of this replay added two
    assert 0.1 < host.wake_ms < 2.0
    assert 0.005 < host.step_gap_ms < 0.2
    # a live tree-of-thought run (two engines, one loop) adds several requests in one gap
    tot = fit_host_ms([TOT])
    assert tot.add_next_ms is not None and 0.0 <= tot.add_next_ms < tot.add_request_ms



def test_a_loop_that_adds_requests_in_waves_still_pays_for_the_first():
    """A program run's loop adds its requests two or more at a time (no gap added one alone):
    the first add is priced from the line through the gaps' medians per number added (once it
    was left at 0 and the further ones carried all), so a pair costs what its gaps took."""
    host = fit_host_ms([PROGRAMS])
    assert host.add_request_ms > 0.2
    assert host.add_next_ms is not None and 0.0 < host.add_next_ms < host.add_request_ms
    assert 0.7 < host.add_request_ms + host.add_next_ms < 1.5  # its pairs' gaps: ~1 ms

def test_calibrate_takes_the_host_time_from_the_live_replays_it_is_given(tmp_path):
    cal = calibrate([REPLAY], spec_k=4)
    host = fit_host_ms([REPLAY])
    assert (cal.add_request_ms, cal.add_next_ms, cal.wake_ms, cal.step_gap_ms) == (
        host.add_request_ms, host.add_next_ms, host.wake_ms, host.step_gap_ms)
    assert cal.to_json()["host"]["wake_ms"] == cal.wake_ms
    assert "add_next_ms" not in cal.to_json()["host"]  # not measured: as the first
    assert cal.add_more_ms == cal.add_request_ms
    # the step gap is charged with every step the simulator plans, not in the fitted model
    assert cal.stepping.coef_ms[0] == pytest.approx(cal.latency.coef_ms[0] + cal.step_gap_ms)
    # The same steps without their requests' arrivals: nothing to fit the host time from.
    bare = tmp_path / "bare"
    shutil.copytree(REPLAY, bare)
    reqs = read_table(bare, "requests")
    assert reqs.num_rows
    shutil.rmtree(bare / "requests")
    from traces.manifest import seal

    seal(bare, reqs.column("run_id")[0].as_py())
    assert fit_host_ms([bare]) == HostTimes(0.0, None, 0.0, 0.0)


def test_host_times_come_from_live_runs_of_the_calibrations_engine_and_device(tmp_path):
    """`calibrate --host-from` checks what it is given as the traces are checked: another
    device's run, a step grid, a simulation's output or a directory with no engine trace is
    refused."""
    from traces.store import read_run

    run = read_run(REPLAY)
    here = (run["engine"], run["device"])
    assert fit_host_ms([REPLAY], here) == fit_host_ms([REPLAY])
    h100 = REPO / "traces" / "data" / "testbed-large-h100"
    with pytest.raises(ValueError, match="ran on torch on NVIDIA H100.*host times are the "
                                         "engine's and the device's"):
        fit_host_ms([h100], here)
    grid = REPO / "traces" / "data" / "testbed-large-cpu"  # a profiler's gaps: no loop's
    with pytest.raises(ValueError, match="a step grid \\(runs kind 'steps'\\)"):
        fit_host_ms([grid], here)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no engine trace"):
        fit_host_ms([tmp_path / "empty"], here)
    from conftest import run_cli

    run_cli("simulate", str(REPO / "examples" / "replay-small.yaml"), "-o", str(tmp_path / "s"),
            "--json")
    with pytest.raises(ValueError, match="a simulation's output .* host times come from live"):
        fit_host_ms([tmp_path / "s"])

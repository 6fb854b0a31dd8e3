"""The engine loop's host time fitted from a real live replay (shipped Parquet traces)."""

from __future__ import annotations

import shutil

from conftest import REPO
from sim.calibration import calibrate
from sim.host_time import fit_host_ms
from traces.store import read_table

REPLAY = REPO / "traces" / "data" / "testbed-spec-replay-cpu"


def test_a_live_replay_gives_the_loops_add_and_wake_times():
    """Requests of a replay arrive while a step runs and are added after it: the gaps that add
    one cost a fraction of a millisecond more than those that add none (the fit once counted
    only arrivals after the step's end and found none), and an idle loop wakes before its step."""
    add_ms, wake_ms = fit_host_ms([REPLAY])
    assert 0.1 < add_ms < 2.0
    assert 0.1 < wake_ms < 2.0


def test_calibrate_takes_the_host_time_from_the_live_replays_it_is_given(tmp_path):
    cal = calibrate([REPLAY], spec_k=4)
    assert (cal.add_request_ms, cal.wake_ms) == fit_host_ms([REPLAY])
    assert cal.to_json()["host"]["wake_ms"] == cal.wake_ms
    # The same steps without their requests' arrivals: nothing to fit the host time from.
    bare = tmp_path / "bare"
    shutil.copytree(REPLAY, bare)
    reqs = read_table(bare, "requests")
    assert reqs.num_rows
    shutil.rmtree(bare / "requests")
    assert fit_host_ms([bare]) == (0.0, 0.0)

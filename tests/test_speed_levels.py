"""A live run's speed level from the machine's speed around it, on hand-made levels: the
speed checks' traffic states (`live_factor`), the runs beside it (`neighbour_factors`), and
the history variant of `benchmarks/level_variants.py`. The levels a real run measures are
checked in `test_fidelity.py`."""

from __future__ import annotations

import json
import math
import sys

import pytest

from conftest import REPO


def test_a_live_run_takes_the_level_of_the_traffic_nearest_it():
    from validation.speed_checks import live_factor

    levels = [{"pass": 0, "at_s": 0.0, "decode": 0.9}, {"pass": 1, "at_s": 100.0, "decode": 1.2},
              {"pass": 2, "at_s": 200.0, "decode": 1.5}]
    assert live_factor(levels, 40.0) == 1.0  # the calibration's own state
    assert live_factor(levels, 60.0) == pytest.approx(1.2 / 0.9)
    assert live_factor(levels, 60.0, relative=False) == 1.2
    assert live_factor(levels, 150.0, relative=False) == 1.2  # a tie: the earlier state
    assert live_factor(levels, 150.0, "interpolated", relative=False) == pytest.approx(1.35)
    assert live_factor(levels, 999.0, "interpolated", relative=False) == 1.5  # held at the end
    assert live_factor([], 10.0) is None
    with pytest.raises(ValueError, match="nearest or interpolated"):
        live_factor(levels, 10.0, "mean")


def test_a_live_run_takes_the_mean_level_of_the_runs_beside_it():
    """`neighbour_factors`: the runs just before and after in time, whatever their workload;
    the speed checks (over the calibration traffic's own level) at the suite's two ends."""
    from validation.speed_checks import neighbour_factors

    rows = [{"workload": "a", "live_started_s": [0.0, 30.0],
             "step_speed": [{"decode": 1.0}, {"decode": 1.4}]},
            {"workload": "b", "live_started_s": [10.0, 40.0],
             "step_speed": [{"decode": 1.2}, {"decode": None}]}]
    checks = [{"pass": 0, "decode": 0.8}, {"pass": 1, "decode": 1.0},
              {"pass": 2, "decode": 1.2}]
    near = neighbour_factors(rows, checks)
    assert near[("a", 0)] == pytest.approx((1.0 + 1.2) / 2)  # the check at calibration, b
    assert near[("b", 0)] == pytest.approx((1.0 + 1.4) / 2)  # a's two runs around it
    assert near[("a", 1)] == pytest.approx(1.2)  # b's second run measured nothing
    assert near[("b", 1)] == pytest.approx((1.4 + 1.5) / 2)  # the last check, 1.2 / 0.8
    alone = neighbour_factors(rows, [])  # no speed check: the one neighbour at either end
    assert alone[("a", 0)] == pytest.approx(1.2) and alone[("b", 1)] == pytest.approx(1.4)
    # never the judged workload's own other run: one workload alone has no neighbour
    assert neighbour_factors(rows[:1], []) == {("a", 0): 1.0, ("a", 1): 1.0}
    # two runs a side: a's two runs before b's second, each side's mean weighing alike
    two = neighbour_factors(rows, checks, per_side=2)
    assert two[("b", 1)] == pytest.approx(((1.0 + 1.4) / 2 + 1.5) / 2)
    assert two[("a", 0)] == near[("a", 0)]  # b's second run measured nothing


def test_history_variant_draws_the_run_level_from_earlier_live_runs(tmp_path):
    """`benchmarks/level_variants.py`'s history variants: the run level's quantiles from the
    decode levels earlier fidelity runs recorded, with (history) or without (history0) their
    median; nothing else of the calibration changes."""
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    from level_variants import history_levels, variant

    levels = [[0.8, 1.0], [1.2, None], [1.25, 1.1]]
    runs = []
    for k, pair in enumerate(levels):
        runs.append(tmp_path / f"run{k}")
        runs[-1].mkdir()
        (runs[-1] / "fidelity.json").write_text(json.dumps({"workloads": [
            {"workload": "w", "step_speed": [{"decode": v, "prefill": None} for v in pair]},
            {"workload": "programs", "step_speed": []}]}))
    history = history_levels(runs)
    assert sorted(np.exp(history).round(6)) == [0.8, 1.0, 1.1, 1.2, 1.25]
    cal = json.loads((REPO / "sim" / "data" / "testbed-large-cpu.calib.json").read_text())
    q = np.array(variant(cal, "history", history)["step_time_model"]["run_log_quantiles"])
    q0 = np.array(variant(cal, "history0", history)["step_time_model"]["run_log_quantiles"])
    assert len(q) == 21 and math.log(0.8) <= q.min() < q.max() <= math.log(1.25)
    assert np.median(q) == pytest.approx(math.log(1.1))
    assert q0 == pytest.approx(q - math.log(1.1))
    rest = {k: v for k, v in cal["step_time_model"].items() if k != "run_log_quantiles"}
    got = variant(cal, "history", history)["step_time_model"]
    assert {k: v for k, v in got.items() if k != "run_log_quantiles"} == rest
    with pytest.raises(ValueError, match="--history"):
        variant(cal, "history", np.array([]))


def test_a_request_span_level_is_the_median_of_the_steps_in_it_over_the_runs():
    """`benchmarks/request_tails.py`: each request's level over its own span's steps."""
    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(REPO / "benchmarks"))
    from request_tails import span_levels

    steps = pd.DataFrame({"start_s": [0.3, 0.1, 0.2, 0.4, 0.5, 0.6]})
    ratio = np.array([2.0, 1.0, 1.0, 2.0, 1.0, 1.0])  # the run's median: 1.0
    requests = pd.DataFrame({"arrival_s": [0.0, 0.05, 0.0], "first_token_s": [0.15, 0.25, 0.7],
                             "finish_s": [0.45, 0.6, 0.9]})
    tpot = span_levels(requests, ratio, steps, "tpot_s")
    assert tpot[0] == 2.0 and tpot[1] == 1.5  # steps at 0.2-0.4 / at 0.3-0.6
    assert math.isnan(tpot[2])  # no step starts between its first token and its finish
    assert list(span_levels(requests, ratio, steps, "ttft_s")[:2]) == [1.0, 1.0]

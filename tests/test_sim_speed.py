"""The simulator-speed benchmarks run and report what they say (`benchmarks/sim_speed.py`,
`benchmarks/program_decisions.py`); their figures are the benchmarks' own, not asserted."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import sim_speed  # noqa: E402
from program_decisions import decisions_alone  # noqa: E402


def test_program_scale_row_reports_a_compiled_run():
    row = sim_speed.programs(24, 2, "cot")
    assert row["simulator"] == "compiled"
    assert row["programs"] == 24 and row["requests"] > 24
    assert row["programs_per_cpu_s"] > 0 and row["simulated_s"] > 0


@pytest.mark.parametrize("family", sorted(sim_speed.FAMILIES))
def test_decisions_alone_finishes_every_program(family):
    example, _, _ = sim_speed.FAMILIES[family]
    cfg = sim_speed.program_config(example, 6, 1)
    out = decisions_alone(cfg)  # raises if a program is left unfinished or a request undelivered
    assert out["requests"] > 6 and out["requests_per_cpu_s"] > 0
    assert len(out["answers"]) == 6


def test_decisions_alone_runs_the_simulated_programs():
    # Dynasor CoT decides from the trace alone (its probes' answers at their positions): on
    # instant replicas its programs stop where the simulated ones do, with the same answers.
    cfg = sim_speed.program_config("dynasor-cot-certaindex.yaml", 40, 1)
    res = sim_speed.simulate(cfg)
    simulated = res.programs.column("answer").to_pylist()
    assert decisions_alone(cfg)["answers"] == simulated


def test_speed_drift_reads_a_trace_against_its_calibration():
    # benchmarks/speed_drift.py on the shipped testbed trace and the calibration fitted on it
    from speed_drift import drift, load_model

    r = drift(load_model(REPO / "sim" / "data" / "testbed-large-cpu.calib.json"),
              REPO / "traces" / "data" / "testbed-large-cpu")
    assert r["steps"] > 1000 and len(r["thirds"]) == 3
    assert min(r["thirds"]) <= r["median"] <= max(r["thirds"])
    assert r["max_over_min"] == max(r["thirds"]) / min(r["thirds"]) >= 1
    # the steps a calibration was fitted on run at its own level (`live_speed.own_level`), not
    # at its bare prediction's (which the relative fit puts below them)
    assert abs(r["median"] - 1) < 0.02

"""The simulator-speed benchmarks run and report what they say (`benchmarks/sim_speed.py`,
`benchmarks/family_speed.py`, `benchmarks/program_decisions.py`); their figures are the
benchmarks' own, not asserted."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import family_speed  # noqa: E402
import sim_speed  # noqa: E402
from program_decisions import decisions_alone  # noqa: E402


def test_program_scale_row_reports_a_compiled_run():
    row = sim_speed.programs(24, 2, "cot")
    assert row["simulator"] == "compiled"
    assert row["programs"] == 24 and row["requests"] > 24
    assert row["programs_per_cpu_s"] > 0 and row["simulated_s"] > 0


def test_helios_rows_time_the_what_if_stream_they_name():
    import helios_speed

    row = sim_speed.programs(300, 3, "helios")
    assert (row["programs"], row["requests"], row["replicas"]) == (300, 300, 3)
    assert row["simulated_s"] > 0
    five = helios_speed.helios_row(200, 2, 1)  # the example's five policies, each the stream
    assert five["prompts"] == 5 * 200 and five["double_tokens_token_ratio"] == 2.0
    assert five["simpy_prompts_per_cpu_s"] > 0 and five["cpu_s"] > 0


@pytest.mark.parametrize("family", sorted(family_speed.FAMILIES))
def test_decisions_alone_finishes_every_program(family):
    example, _, _ = family_speed.FAMILIES[family]
    cfg = family_speed.program_config(example, 6, 1)
    out = decisions_alone(cfg)  # raises if a program is left unfinished or a request undelivered
    assert out["requests"] > 6 and out["requests_per_cpu_s"] > 0
    assert len(out["answers"]) == 6


def test_decisions_alone_runs_the_simulated_programs():
    # Dynasor CoT decides from the trace alone (its probes' answers at their positions): on
    # instant replicas its programs stop where the simulated ones do, with the same answers.
    cfg = family_speed.program_config("dynasor-cot-certaindex.yaml", 40, 1)
    res = sim_speed.simulate(cfg)
    simulated = res.programs.column("answer").to_pylist()
    assert decisions_alone(cfg)["answers"] == simulated


@pytest.mark.parametrize("family", ["cot", "mcts", "a1", "seed"])
def test_doubled_outputs_run_the_same_programs_twice_as_long(family):
    # the doubling's cost ratio means something only if the programs decide as they do at
    # traced lengths: the same requests and answers, each request generating twice the tokens
    example, _, _ = family_speed.FAMILIES[family]
    cfg = family_speed.program_config(example, 8, 1, longer_limit=True)
    base = sim_speed.simulate(cfg)
    with family_speed.doubled_outputs():
        double = sim_speed.simulate(cfg)
    assert double.programs.column("answer").to_pylist() == \
        base.programs.column("answer").to_pylist()
    assert double.summary["requests"] == base.summary["requests"]
    b, d = base.requests.to_pandas(), double.requests.to_pandas()
    assert (b.groupby("program_id").size() == d.groupby("program_id").size()).all()
    # twice the tokens but for aborts, whose tokens follow the timing
    assert 1.98 <= d.output_tokens.sum() / b.output_tokens.sum() <= 2.0
    assert double.summary["makespan_s"] > base.summary["makespan_s"]


def test_a_family_row_times_every_column_of_the_same_programs():
    row = family_speed.family_row("dynasor-mcts-certaindex.yaml", 6, 1, 1)
    assert row["step_time_models"] == ["linear"]
    assert row["other_kind"]["step_time_models"] == ["serving"]
    assert row["other_kind"]["requests"] == row["requests"] > 6
    rates = [row[k] for k in ("requests_per_cpu_s", "simpy_requests_per_cpu_s",
                              "request_by_request_per_cpu_s",
                              "decisions_alone_requests_per_cpu_s")]
    assert all(r > 0 for r in rates + [row["other_kind"]["requests_per_cpu_s"]])
    assert row["double_tokens_token_ratio"] == pytest.approx(2.0, rel=0.05)


def test_other_kind_swaps_every_calibrations_model_and_keeps_the_replicas():
    from sim.engine.cluster import build_replicas

    example, _, _ = family_speed.FAMILIES["a1"]
    cfg = family_speed.program_config(example, 4, 1)
    other = family_speed.program_config(example, 4, 1, other_kind=True)
    specs, swapped = build_replicas(cfg), build_replicas(other)
    assert {c.latency.kind for c, _ in specs} == {"serving"}
    assert {c.latency.kind for c, _ in swapped} == {"linear"}
    assert [rc for _, rc in specs] == [rc for _, rc in swapped]
    assert [c.max_model_len for c, _ in specs] == [c.max_model_len for c, _ in swapped]
    assert sim_speed.simulate(other).summary["simulator"] == "compiled"


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

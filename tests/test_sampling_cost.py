"""Seeded sampling's step time: fitted from a grid's greedy twins (`sim.step_time.sampling_cost`),
charged by the simulator once a step with seeded sequences and per one, on the lazy replica as on
the reference."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import simpy

from conftest import REPO
from sim.step_time.calibration import load_calibration
from sim.config import parse_config, read_yaml
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.request_state import Req, Results
from sim.simulate import simulate
from traces.ids import cell_id, cell_regime

CALIB = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"


def test_cell_regimes_are_read_from_grid_cell_ids():
    for regime in ("greedy", "seeded", "logprobs"):
        assert cell_regime(cell_id(8, 64, 16, 1, regime)) == regime
    assert cell_regime("k2-b1-q3") == "greedy" and cell_regime(None) == "greedy"


def test_a_step_with_seeded_sequences_pays_once_and_per_sequence():
    cal = load_calibration(CALIB)
    assert (cal.seeded_step_ms, cal.seeded_seq_ms) == (0.0, 0.0)  # older artifacts: nothing

    def finish(step_ms: float, seq_ms: float, seeded: bool) -> tuple[float, int]:
        env = simpy.Environment()
        res = Results(3)
        replica = Replica(env, 0, replace(cal, seeded_step_ms=step_ms, seeded_seq_ms=seq_ms),
                          ReplicaConfig(8, 2048, 16, 1000), res, None)
        for i in range(3):
            replica.submit(Req(i, 40, 5, seeded=seeded))
        env.run()
        return float(res.finish_s.max()), int(res.seg["k_iters"].sum())

    plain, steps = finish(0.0, 0.0, False)
    # the idle replica starts the first at once; the others join its second step: sequences
    # sampling a token per step 1, 3, 3, 3, 3, 2
    assert steps == 6
    assert finish(0.3, 0.1, False)[0] == plain  # greedy requests pay nothing
    assert finish(0.3, 0.1, True)[0] - plain == pytest.approx((6 * 0.3 + 15 * 0.1) / 1e3,
                                                             rel=1e-6)


def test_seeded_programs_pay_it_and_the_lazy_replica_equals_the_reference(tmp_path):
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"].update(count=40, rate_per_s=6)
    d["output"] = {"steps": True}
    source = REPO / "examples" / d["cluster"]["replicas"][0]["calibration"]
    cal = json.loads(source.read_text())
    cal.setdefault("host", {}).update(seeded_step_ms=0.15, seeded_seq_ms=0.02)
    seeded_cal = tmp_path / "seeded.calib.json"
    seeded_cal.write_text(json.dumps(cal))

    def run(calibration, lazy=True):
        d["cluster"]["replicas"][0]["calibration"] = str(calibration)
        return simulate(parse_config(d, REPO / "examples"), lazy=lazy)

    base, seeded = run(source.resolve()), run(seeded_cal)
    ref = run(seeded_cal, lazy=False)
    for a, b in ((seeded.requests, ref.requests), (seeded.steps, ref.steps)):
        assert a.to_pandas().equals(b.to_pandas())
    assert seeded.summary["program_latency_s"]["mean"] > base.summary["program_latency_s"]["mean"]
    # every chunk and probe samples with a seed: a decode step of n sequences costs the
    # step-time model's time (at its mean) plus 0.15 + 0.02 n ms
    model = load_calibration(source).latency
    steps = seeded.steps.to_pandas()
    decode = steps[steps.prefill_tokens == 0]
    plain_ms = [model.step_ms(0, n, c) * model.residual_sampler()[0]
                for n, c in zip(decode.decode_seqs, decode.context_tokens)]
    assert len(decode) > 100
    assert (decode.duration_ms - plain_ms).to_numpy() == pytest.approx(
        0.15 + 0.02 * decode.decode_seqs.to_numpy(), abs=1e-6)


def test_live_steps_take_the_seeded_counts_the_engine_recorded(tmp_path):
    """A live replay's `step_seeded` rows set its steps' seeded sequences (0 for its steps
    without a row); a run that recorded none keeps the grid-regime count; no live step is a
    greedy twin (it has no regime: it would be its own)."""
    import pandas as pd
    import pyarrow as pa

    from sim.step_time.sampling_cost import attach_seeded
    from traces import read_run, write_tables

    run = {k: v for k, v in read_run(REPO / "traces" / "data" / "testbed-large-cpu").items()
           if k not in ("params", "run_id")}
    rid = write_tables(tmp_path / "live", run, {"step_seeded": {
        "replica_id": pa.array([0, 0], pa.int32()), "step_id": pa.array([1, 3], pa.int64()),
        "seeded_seqs": pa.array([2, 1], pa.int32())}})
    steps = pd.DataFrame({"run_id": [rid] * 4 + ["older"] * 2, "replica_id": 0,
                          "step_id": [0, 1, 2, 3, 0, 1], "cell_id": None, "decode_seqs": 2,
                          "prefill_seqs": 0, "prefill_tokens": 0, "duration_ms": 1.0})
    out = attach_seeded(steps, [], [tmp_path / "live"])
    assert out.seeded_seqs.tolist() == [0, 2, 0, 1, 0, 0]
    assert out.greedy_twin_ms.isna().all()

"""The program core: one program object per method, driven by the simulator and the live runner."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from conftest import example_config as _config
from live.families import live_family
from programs.base import Abort, Outcome, RequestSpec
from programs.workload import draw_seed, load_bank, plan_programs, program_workload
from sim.config import parse_config
from programs.families import family_of
from sim.families.registry import sim_family
from traces import ids
from traces.store import read_run


def sim_runs(wl, bank, plans):
    """The simulator's program objects, built by the workload's family."""
    return sim_family(family_of(wl.method, wl.policy).name).build_runs(wl, bank, plans)


def live_runs(wl, bank, plans, twl, encode):
    """The live runner's program objects, built by the workload's family."""
    return live_family(family_of(wl.method, wl.policy).name).build_runs(wl, bank, plans, twl,
                                                                        encode)


@pytest.mark.parametrize("config,method", [
    ("dynasor-cot-certaindex.yaml", "cot"), ("dynasor-certaindex.yaml", "sc"),
    ("dynasor-mcts-certaindex.yaml", "mcts"), ("dynasor-rebase-certaindex.yaml", "rebase")])
def test_simulator_and_live_runner_build_the_same_program_classes(config, method):
    cfg = parse_config(_config(config, count=4), REPO / "examples")
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    assert wl.method == method
    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, 1))
    sim, _, _ = sim_runs(wl, bank, plans)
    twl = json.loads(read_run(wl.trace)["params_json"])["workload"]
    live, gold = live_runs(wl, bank, plans, twl, lambda text: [ord(c) % 128 for c in text])
    assert [type(r.program) for r in sim] == [type(r.program) for r in live]
    assert [r.plan for r in sim] == [r.plan for r in live] and len(gold) == 4
    # The same object answers the same first requests, the live one with token ids.
    first_sim, first_live = sim[0].program.start(), live[0].program.start()
    assert [(s.kind, s.index, s.sampling) for s in first_sim] == \
        [(s.kind, s.index, s.sampling) for s in first_live]
    assert all(s.prompt_ids is None for s in first_sim)
    assert all(len(s.prompt_ids) == s.prompt_tokens for s in first_live)


def test_a_stopping_probe_aborts_what_is_in_flight_and_ends_the_program():
    cfg = parse_config(_config("dynasor-cot-certaindex.yaml", count=1), REPO / "examples")
    wl = program_workload(cfg.workload["programs"], cfg.base_dir)
    bank = load_bank(wl)
    (run,), _, _ = sim_runs(wl, bank, plan_programs(wl, bank, draw_seed(0, 1)))
    prog = run.program
    (chunk,) = prog.start()
    actions = []
    # Answer every chunk in full and every probe with the same confident answer.
    while not prog.done:
        assert isinstance(chunk, RequestSpec) and chunk.kind == "chunk"
        actions = prog.on_done(chunk, Outcome(chunk.sampling.max_tokens))
        specs = [a for a in actions if isinstance(a, RequestSpec)]
        probes = [s for s in specs if s.kind == "probe"]
        chunk = next(s for s in specs if s.kind == "chunk")
        for p in probes:
            actions = prog.on_done(p, Outcome(3, answer="7"))
    window = wl.policy.window
    assert prog.answer == "7" and prog.stop_at == window * wl.policy.every_tokens
    # The chunk sent with the last probe was still in flight: the stop aborts it.
    assert [a.spec for a in actions if isinstance(a, Abort)] == [chunk]
    assert prog.probe_tokens == 3 * window


def test_an_outcome_is_an_immutable_value_an_oracle_may_share():
    # the probes oracle hands one Outcome object to every request with the same result
    out = Outcome(5, ended=True, answer="7")
    assert out == Outcome(5, False, True, "7") and hash(out) == hash(Outcome(5, ended=True,
                                                                          answer="7"))
    assert (out.aborted, out.score, out.token_ids, out.cached_tokens) == (False, None, (), 0)
    with pytest.raises(AttributeError):
        out.tokens = 6


def test_ids_round_trip_and_reject_what_they_did_not_make():
    qid = ids.question_id(17, "mod", 3)
    assert qid == "q0017-mod-3" and ids.question_index(qid) == 17
    assert ids.probe_number(ids.probe_id(ids.trajectory_id(qid, 2), 5)) == 5
    assert ids.probe_number(ids.chunk_id("prog-00001", 5)) is None
    assert ids.search_request_id(ids.search_program_id(qid, "mcts", 16), 3) == \
        "q0017-mod-3-mcts16-r3"
    with pytest.raises(ValueError, match="not a question id"):
        ids.question_index("prog-00001")


def test_a_row_log_keeps_rows_as_typed_columns_and_refuses_a_wrong_row():
    """A program's row log (`programs.rowlog`): rows read back as added, column by column or
    as dictionaries; an integer column refuses None rather than storing a stand-in."""
    from programs.rowlog import RowLog

    log = RowLog({"index": "q", "kind": "", "value": ""})
    log.add(0, "draft", None)
    log.add(300, "verify", 0.5)
    assert len(log) == 2 and log.column("index") == [0, 300]
    assert list(log) == [{"index": 0, "kind": "draft", "value": None},
                         {"index": 300, "kind": "verify", "value": 0.5}]
    with pytest.raises(ValueError, match="2 values for 3 fields"):
        log.add(1, "eval")
    with pytest.raises(TypeError):
        log.add(None, "eval", 1.0)


@pytest.mark.parametrize("example", ["a1-async-separate.yaml", "a1-sync.yaml",
                                     "seed-separate.yaml", "seed-evaluator.yaml"])
def test_a1_and_seed_programs_send_the_same_requests_under_other_step_times(example, tmp_path):
    """A1 and SEED programs decide from their requests' outcomes alone: with the draft pool's
    steps twice as fast and the target's twice as slow, requests finish in another order, yet
    each program sends the same requests (prompt and output tokens), in another order."""
    from sim.simulate import simulate
    from sim.step_time.live_speed import scaled_calibration

    def requests(d: dict) -> tuple[list, list]:
        """The run's request ids in the table's (send) order; each program's requests."""
        t = simulate(parse_config(d, REPO / "examples")).requests
        rids, programs, prompt, output = (t[c].to_pylist() for c in (
            "request_id", "program_id", "prompt_tokens", "output_tokens"))
        return rids, sorted(zip(programs, prompt, output))

    d = _config(example, count=24)
    scaled = json.loads(json.dumps(d))
    for i, group in enumerate(scaled["cluster"]["replicas"]):
        factor = 0.5 if group["pool"] == "draft" else 2.0
        group["calibration"] = str(scaled_calibration(
            REPO / "examples" / group["calibration"], factor, tmp_path / f"cal{i}.json"))
    (order, sent), (other_order, other_sent) = requests(d), requests(scaled)
    assert other_order != order  # the requests went in another order
    assert other_sent == sent

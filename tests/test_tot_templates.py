"""ToT programs sent from their question's template (`sim.workloads.request_templates` with the
program's target queue), in the program kernel (`sim.kernels.template_calls`: the queue per
program) and in Python, equal the same programs driven request by request, table for table
(`tot_requests` too): every mode (the serial `ar` and `sd`, the batched modes, SEED's queue of
one), every inter-program scheduler the kernel prices, one and several replicas, KV pressure,
few slots, prefix caching on and off, the kernel taking every request, handing many back, or
starting the programs at their arrivals; a multi-candidate program keeps the plain driver.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from conftest import REPO, example_config
from test_kernel_templates import _counted, _started
from test_program_templates import _equal
from programs.seed import ToTProgram
from sim.config import parse_config
from sim.kernels import program_room
from sim.workloads import program_templates
from sim.workloads.programs import simulate_programs

EXAMPLE = "seed-separate.yaml"


def _config(count: int, mode: str = "seed", replicas: int = 1, scheduler: str = "fcfs",
            example: str = EXAMPLE, rate: float = 8.0, seed: int = 1, **group):
    """The ToT example under `mode` with `count` programs, both pools `replicas` wide (each
    group's settings updated by `group`)."""
    d = example_config(example, count=count, rate_per_s=rate) | {"seed": seed, "output": {}}
    for g in d["cluster"]["replicas"]:
        g.update({"count": replicas, "max_num_seqs": 3} | group)
    d["cluster"]["scheduler"] = scheduler
    d["workload"]["programs"]["policy"]["type"] = mode
    return parse_config(d, REPO / "examples")


@pytest.mark.parametrize("mode,scheduler,replicas", [
    ("seed", "fcfs", 1), ("seed", "dynasor", 3), ("sd", "app_fifo", 1), ("ar", "lpm", 3),
    ("ar_batched", "dynasor", 1), ("seed_batched", "fcfs", 3)])
@pytest.mark.parametrize("compiled", [True, False])
def test_tot_templates_equal_the_plain_driver(monkeypatch, mode, scheduler, replicas, compiled):
    """Every mode from templates: the tables of the plain driver; on the kernel, the driver
    sends only each question's first program's first requests."""
    cfg = _config(32, mode, replicas, scheduler)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg, compiled=compiled)
    assert res.summary["simulator"] == ("compiled" if compiled else "simpy")
    if compiled:
        assert seen["kernel"] and seen["python"] <= 3 * 32 < len(res.requests) / 10
    _equal(res, simulate_programs(cfg, compiled=compiled, templates=False))


@settings(max_examples=12, deadline=None)
@given(mode=st.sampled_from(["seed", "sd", "ar", "seed_batched", "ar_batched"]),
       scheduler=st.sampled_from(["fcfs", "dynasor", "lpm", "app_fifo"]),
       kv=st.sampled_from([None, 14, 40]), seqs=st.sampled_from([2, 8]), caching=st.booleans(),
       replicas=st.sampled_from([1, 2]), rate=st.sampled_from([2.0, 16.0]),
       seed=st.integers(0, 3), compiled=st.booleans())
def test_tot_templates_under_pressure_equal_the_plain_driver(mode, scheduler, kv, seqs, caching,
                                                            replicas, rate, seed, compiled):
    """KV pressure (preemptions), few sequence slots, prefix caching on and off, other rates
    and draws: the tables of the plain driver."""
    group = {"max_num_seqs": seqs, "enable_prefix_caching": caching} | (
        {"kv_blocks": kv} if kv else {})
    cfg = _config(24, mode, replicas, scheduler, rate=rate, seed=seed, **group)
    _equal(simulate_programs(cfg, compiled=compiled),
           simulate_programs(cfg, compiled=compiled, templates=False))


@pytest.mark.parametrize("mode", ["seed", "ar_batched"])
def test_tot_templates_with_preemptions_equal_the_plain_driver(mode):
    """14 KV blocks a replica: requests are preempted and run again, as the plain driver's."""
    cfg = _config(24, mode, 1, "fcfs", rate=16.0, seed=0, max_num_seqs=8, kv_blocks=14)
    res = simulate_programs(cfg)
    assert res.summary["preemptions"] > 0
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("example", ["seed-evaluator.yaml", "seed-sampled.yaml",
                                     "seed-k3.yaml", "seed-greedy-small.yaml"])
def test_tot_examples_from_templates_equal_the_plain_driver(example):
    """Speculative evaluations, sampled thoughts, other draft lengths, another target."""
    cfg = _config(24, "seed", 2, "fcfs", example)
    _equal(simulate_programs(cfg), simulate_programs(cfg, templates=False))


def test_verifications_wait_in_the_kernels_target_queue(monkeypatch):
    """SEED's queue of one: verifications wait for the target (queue waits above zero), and
    every program of a question sends its requests in an order of its own (the numbers its
    requests carry differ between programs of one question), as the plain driver's do."""
    cfg = _config(48, "seed", 1, "fcfs")
    started = _started(monkeypatch)
    res = simulate_programs(cfg)
    assert res.summary["verify_queue_wait_p90_s"] > 0
    questions = res.programs.column("question_id").to_pylist()
    assert len(started) == len(set(questions)) < 48  # the kernel starts the others
    tot = res.tables["tot_requests"]
    orders: dict = {}
    for pid, q, node, kind, rnd, rid in zip(tot["program_id"], tot["question_id"], tot["node"],
                                            tot["kind"], tot["round"], tot["request_id"]):
        orders.setdefault(q, {}).setdefault(pid, {})[(node, kind, rnd)] = rid.rsplit("-", 1)[-1]
    assert any(len({tuple(sorted(o.items())) for o in per.values()}) > 1
               for per in orders.values())
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("mode", ["seed", "sd"])
def test_tot_requests_the_kernel_hands_back_go_as_they_would(monkeypatch, mode):
    """One free slot, two log rows and one program done at a time: the kernel hands request
    after request back (its target queue read into Python and written back), and the tables
    stay the plain driver's."""
    monkeypatch.setattr(program_room, "KERNEL_SLOTS", 1)
    monkeypatch.setattr(program_room, "KLOG_ROWS", 2)
    monkeypatch.setattr(program_room, "KDONE_ROWS", 1)
    cfg = _config(32, mode, 3, "dynasor")
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["handed_back"] > 500 and seen["python"] < len(res.requests)
    _equal(res, simulate_programs(cfg, templates=False))


def test_a_tot_record_marks_its_queue_and_levels():
    """A SEED program's record: its target's requests wait in a queue of one, a level's
    evaluations each wait for the level, and the last of them starts the next level."""
    cfg = _config(1, "seed")
    recorded = []
    record = program_templates.record_requests

    def recording(*args, **kw):
        recorded.append(record(*args, **kw))
        return recorded[-1]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(program_templates, "record_requests", recording)
        simulate_programs(cfg)
    tpl = recorded[0]
    kinds = [spec.kind for spec, *_ in tpl.requests]
    assert tpl.queued == tuple(1 if k in ("verify", "eval") else 0 for k in kinds)
    assert tpl.queue_room == 6 and len(tpl.first) == 3
    evals = [k for k, kind in enumerate(kinds) if kind == "eval"]
    assert [k for k, b in enumerate(tpl.barrier) if b] == evals
    levels = {tpl.follow[k] for k in evals}
    assert len(levels) == 4 and () in levels  # three levels started, the last ends it


def test_multi_candidate_tot_programs_keep_the_plain_driver(monkeypatch):
    """A round whose candidates verify together is not recorded: driven request by request."""
    cfg = _config(8, "sd", example="seed-mcsd.yaml")
    kept = []
    record = program_templates.TemplateDriver._record

    def recording(self, run):
        kept.append(record(self, run))
        assert isinstance(run.program, ToTProgram)
        return kept[-1]

    monkeypatch.setattr(program_templates.TemplateDriver, "_record", recording)
    res = simulate_programs(cfg)
    assert kept and all(t is None for t in kept)
    _equal(res, simulate_programs(cfg, templates=False))

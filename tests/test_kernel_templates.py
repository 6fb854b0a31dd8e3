"""Request-by-request templates in the program kernel (`sim.workloads.kernel_templates`,
`sim.kernels.template_calls`): the kernel sends a templated request's follow-ups where it
retires (a search program's next round once its round has returned), and the tables equal the
plain driver's, whether the kernel takes every request or hands many back (no room left, a
pool the program is not pinned to yet), under every scheduler whose priority the kernel
computes (Dynasor's gang scheduling on a history it shares with the driver); a scheduler that
asks each program's own estimate, and a record too long for a replica, stay in Python.
"""

from __future__ import annotations

import json
import random

import pytest

from test_program_templates import _config, _equal
from policies.scheduling import FinishedLengths
from sim.config import parse_config, read_yaml
from sim.engine.cluster import build_replicas
from sim.kernels import program_room
from sim.kernels.programs import CompiledCluster
from sim.workloads import program_templates
from sim.workloads.kernel_templates import KernelFinished
from sim.workloads.programs import simulate_programs
from conftest import REPO

EXAMPLE = "a1-async-separate.yaml"


def _counted(monkeypatch) -> dict:
    """Count the requests the driver sends itself and those the kernel hands back."""
    seen = {"python": 0, "handed_back": 0, "kernel": False}
    driver = program_templates.TemplateDriver
    send, back, init = driver._send_requests, driver._on_template, driver.__init__

    def sending(self, run, tpl, ks, at=None):
        seen["python"] += len(ks)
        return send(self, run, tpl, ks, at)

    def handed(self, p, t, s):
        seen["handed_back"] += 1
        return back(self, p, t, s)

    def made(self, *args):
        init(self, *args)
        seen["kernel"] = seen["kernel"] or self._kernel is not None

    monkeypatch.setattr(driver, "_send_requests", sending)
    monkeypatch.setattr(driver, "_on_template", handed)
    monkeypatch.setattr(driver, "__init__", made)
    return seen


@pytest.mark.parametrize("scheduler", ["fcfs", "lpm", "app_fifo"])
def test_the_kernel_sends_most_requests_and_the_tables_equal_the_plain_driver(
        monkeypatch, scheduler):
    """Two draft and two target replicas (a program's draft replica routed at its first draft):
    the driver sends each program's first requests, the kernel the rest."""
    cfg = _config(EXAMPLE, 24, 6.0, 2, 1, scheduler, max_num_seqs=3)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert res.summary["simulator"] == "compiled" and seen["kernel"]
    assert seen["python"] < len(res.requests) / 10
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("scheduler", ["fcfs", "app_fifo"])
def test_requests_the_kernel_hands_back_are_sent_as_it_would_send_them(monkeypatch, scheduler):
    """Two free slots for the kernel, two log rows and one program done at a time: the kernel
    hands request after request back (no room), and the tables stay the plain driver's."""
    monkeypatch.setattr(program_room, "KERNEL_SLOTS", 1)
    monkeypatch.setattr(program_room, "KLOG_ROWS", 2)
    monkeypatch.setattr(program_room, "KDONE_ROWS", 1)
    cfg = _config(EXAMPLE, 24, 6.0, 2, 2, scheduler)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["kernel"] and seen["handed_back"] > 100
    assert seen["python"] < len(res.requests)  # the kernel still sends some
    _equal(res, simulate_programs(cfg, templates=False))


def test_a_scheduler_the_kernel_cannot_price_keeps_python(monkeypatch):
    """Dynasor's scheduler with each program's own estimate asks the program at every send:
    no template goes into the kernel, and the tables are the plain driver's."""
    cfg = _config(EXAMPLE, 12, 6.0, 1, 0, {"type": "dynasor", "estimate": "program"})
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert not seen["kernel"] and res.summary["simulator"] == "compiled"
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("example", [EXAMPLE, "dynasor-rebase-certaindex.yaml",
                                     "dynasor-sc-branches-certaindex.yaml"])
def test_the_dynasor_scheduler_prices_in_the_kernel(monkeypatch, example):
    """Dynasor's gang scheduling (finished programs' median, escalation past an age): the
    kernel computes each priority from the history it shares with the driver, and the tables
    are the plain driver's."""
    scheduler = {"type": "dynasor", "escalate_after_s": 0.5, "default_remaining_tokens": 50}
    cfg = _config(example, 40, 12.0, 2, 1, scheduler, max_num_seqs=4)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["kernel"] and seen["python"] < len(res.requests) / 2
    assert (res.requests.column("priority").to_pandas() < 0).any()  # some escalated
    _equal(res, simulate_programs(cfg, templates=False))


def test_the_kernels_history_answers_as_finished_lengths():
    """The history on the kernel's arrays (`KernelFinished`) gives `FinishedLengths`'s
    medians through adds that grow it past its first size."""
    cfg = _config(EXAMPLE, 4, 6.0)
    cluster = CompiledCluster(cfg, 64, build_replicas(cfg))
    mine, theirs = KernelFinished(cluster), FinishedLengths()
    rng = random.Random(5)
    for _ in range(300):
        tokens = rng.choice([rng.randrange(40), rng.randrange(5000)])
        mine.add(tokens)
        theirs.add(tokens)
        for done in (0, rng.randrange(6000), tokens, tokens + 1):
            assert mine.median_remaining(done) == theirs.median_remaining(done)
    assert len(mine) == len(theirs) == 300


def test_a_request_too_long_for_its_pool_raises_as_the_plain_driver(tmp_path):
    """A draft model whose `max_model_len` is shorter than the traced requests: the record
    stays in Python, whose send raises the plain driver's error."""
    cal = json.loads((REPO / "sim" / "data" / "testbed-draft-a1-cpu.calib.json").read_text())
    cal["engine_limits"]["max_model_len"] = 120
    (tmp_path / "short.calib.json").write_text(json.dumps(cal))
    d = read_yaml(REPO / "examples" / EXAMPLE)
    d["workload"]["programs"].update(count=4, rate_per_s=6.0)
    d["cluster"]["replicas"][0]["calibration"] = str(tmp_path / "short.calib.json")
    cfg = parse_config(d, REPO / "examples")
    errors = []
    for templates in (True, False):
        with pytest.raises(ValueError, match="exceeds the model's max_model_len 120") as e:
            simulate_programs(cfg, templates=templates)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("example", ["dynasor-rebase-certaindex.yaml",
                                     "dynasor-mcts-even.yaml"])
def test_search_rounds_go_out_from_the_kernel(monkeypatch, example):
    """Search programs under FCFS: each question's rounds written request by request, the
    next round sent by the kernel once its round's last request returns; the driver sends
    only each program's first round, and the tables are the plain driver's."""
    cfg = _config(example, 40, 8.0, 3, 1, "fcfs", max_num_seqs=3, kv_blocks=60)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["kernel"] and seen["handed_back"] == 0
    assert seen["python"] < len(res.requests) / 2
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("scheduler", ["fcfs", "dynasor"])
def test_reasoning_paths_go_out_from_the_kernel(monkeypatch, scheduler):
    """SC programs on a probes trace (8 paths, 2 a round): each path's next chunk sent by the
    kernel as its last returns, a round's next paths once its last path has ended; the driver
    sends only each program's first round, and the tables are the plain driver's."""
    cfg = _config("dynasor-certaindex.yaml", 40, 8.0, 3, 1, scheduler, max_num_seqs=3)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["kernel"] and seen["handed_back"] == 0
    assert seen["python"] < len(res.requests) / 5
    _equal(res, simulate_programs(cfg, templates=False))


def _stopping(count: int, scheduler, seed: int = 2):
    """CoT paths that stop on their probes often (a window of 2 probes every 16 tokens) on two
    replicas of four sequences each."""
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"].update(count=count, rate_per_s=20.0,
                                     policy={"type": "certaindex", "window": 2,
                                             "interval_tokens": 16})
    d["cluster"]["replicas"][0].update(count=2, max_num_seqs=4)
    d.update(seed=seed, output={}, cluster=d["cluster"] | {"scheduler": scheduler})
    return parse_config(d, REPO / "examples")


@pytest.mark.parametrize("scheduler", ["fcfs", "dynasor", "app_fifo"])
def test_cot_paths_stop_on_their_probes_in_the_kernel(monkeypatch, scheduler):
    """The kernel sends each path's chunks and probes, stops it once its probes up to the stop
    have returned (or ends it at its last chunk), aborts what it has in flight: the driver
    sends at most each program's first chunk; many paths stop, many requests are aborted, and the
    tables are the plain driver's (each program's tokens, stop and answer its own)."""
    cfg = _stopping(120, scheduler)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["kernel"] and seen["handed_back"] == 0 and seen["python"] <= 120
    reasons = res.requests.column("finish_reason").to_pylist()
    stops = res.programs.column("stop_position_tokens").to_pandas()
    assert reasons.count("abort") > 40 and 40 < stops.notna().sum() < 120
    _equal(res, simulate_programs(cfg, templates=False))


def test_stopping_paths_the_kernel_hands_back_stop_as_they_would(monkeypatch):
    """One free slot, two log rows and one program done at a time: the kernel hands sends,
    stops and closes back, the driver takes them in the kernel's state, and the tables are
    the plain driver's."""
    monkeypatch.setattr(program_room, "KERNEL_SLOTS", 1)
    monkeypatch.setattr(program_room, "KLOG_ROWS", 2)
    monkeypatch.setattr(program_room, "KDONE_ROWS", 1)
    cfg = _stopping(80, "dynasor", seed=3)
    seen = _counted(monkeypatch)
    res = simulate_programs(cfg)
    assert seen["handed_back"] > 100
    assert res.requests.column("finish_reason").to_pylist().count("abort") > 20
    _equal(res, simulate_programs(cfg, templates=False))


def _started(monkeypatch) -> list:
    """The programs the driver starts itself (the kernel starts the others)."""
    started = []
    start = program_templates.TemplateDriver.start

    def starting(self, run):
        started.append(run.idx)
        return start(self, run)

    monkeypatch.setattr(program_templates.TemplateDriver, "start", starting)
    return started


@pytest.mark.parametrize("example", ["dynasor-mcts-even.yaml", "dynasor-certaindex.yaml",
                                     "dynasor-cot-certaindex.yaml", EXAMPLE])
def test_programs_arrive_in_the_kernel(monkeypatch, example):
    """Each question's first program is the driver's to start (and record); the kernel
    routes, pins and starts the others at their arrival events (A1's in its draft pool too,
    where its first requests go), and the tables (routing included) are the plain driver's."""
    a1 = example == EXAMPLE  # two pools: three replicas of the draft, one of the target
    count = 64 if a1 else 160
    cfg = _config(example, count, 12.0, 3, 1, "dynasor", max_num_seqs=4)
    started = _started(monkeypatch)
    res = simulate_programs(cfg)
    questions = set(res.programs.column("question_id").to_pylist())
    if "cot" in example:  # a record per question and sample
        assert len(questions) <= len(started) < count
    elif a1:  # a few more handed back where the kernel's slots run low
        assert len(questions) <= len(started) < count * 0.75
    else:
        assert sorted(started) == started and len(started) == len(questions) < count / 2
    assert res.requests.column("replica_id").to_pandas().nunique() == (4 if a1 else 3)
    _equal(res, simulate_programs(cfg, templates=False))


@pytest.mark.parametrize("example", ["dynasor-mcts-even.yaml", "dynasor-cot-certaindex.yaml"])
def test_arrivals_the_kernel_hands_back_start_as_they_would(monkeypatch, example):
    """One free slot, two log rows and one program done at a time: the kernel hands many
    arrivals back (and requests of programs it started, whose pins the driver then reads),
    every booking is given back once, and the tables are the plain driver's."""
    monkeypatch.setattr(program_room, "KERNEL_SLOTS", 1)
    monkeypatch.setattr(program_room, "KLOG_ROWS", 2)
    monkeypatch.setattr(program_room, "KDONE_ROWS", 1)
    cfg = _config(example, 120, 12.0, 2, 3, "fcfs", max_num_seqs=4)
    started = _started(monkeypatch)
    loads = []
    close = CompiledCluster.close

    def closing(self):
        loads.append((self.outstanding.tolist(), self.in_flight.tolist()))
        return close(self)

    monkeypatch.setattr(CompiledCluster, "close", closing)
    res = simulate_programs(cfg)
    assert 40 < len(started) < 120
    assert loads == [([0, 0], [0, 0])]  # every booking given back once
    _equal(res, simulate_programs(cfg, templates=False))


def test_another_router_keeps_the_arrivals_in_python(monkeypatch):
    """Round-robin routing is the driver's: it starts every program, and the tables are the
    plain driver's."""
    d = read_yaml(REPO / "examples" / "dynasor-mcts-even.yaml")
    d["workload"]["programs"].update(count=60, rate_per_s=12.0)
    d["cluster"].update(router="round_robin")
    d["cluster"]["replicas"][0].update(count=3)
    cfg = parse_config(d, REPO / "examples")
    started = _started(monkeypatch)
    res = simulate_programs(cfg)
    assert len(started) == 60
    _equal(res, simulate_programs(cfg, templates=False))

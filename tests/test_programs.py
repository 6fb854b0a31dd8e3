"""Reasoning programs in the simulator, Dynasor policies and schedulers, on the shipped traces."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow.compute as pc
import pytest
import simpy

from conftest import REPO
from conftest import example_config as _config
from conftest import run_cli
from policies.allocation import SelfConsistency, TokenBudget
from policies.certaindex import Certaindex, ProbeConsistency
from policies.scheduling import DynasorGang, FinishedLengths, ProgramView, make_scheduler
from policies.search import majority_vote
from programs.traced import load_questions, load_trajectories
from sim.step_time.calibration import load_calibration
from sim.config import parse_config, read_yaml
from sim.families.dynasor.online import max_sustainable_rate
from sim.families.dynasor.reasoning import certaindex_outcome
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.request_state import Req, Results
from sim.simulate import simulate
from traces import check_trace, ids

TRACE = REPO / "traces" / "data" / "testbed-probes-cpu"
CALIB = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"




def _run(d: dict):
    return simulate(parse_config(d, REPO / "examples"))


def test_majority_vote_and_sc_rounds():
    assert majority_vote(["3", "5", "5", None]) == "5"
    assert majority_vote(["3", "5"]) == "3"  # a tie goes to the answer reached first
    assert majority_vote([None, ""]) is None
    sc = SelfConsistency(samples=8, per_round=2, certaindex=Certaindex(entropy_threshold=0.5))
    assert sc.first_round() == 2
    assert sc.next_round(["4", "4"], [60, 60]) == 0          # agree: stop
    assert sc.next_round(["4", "7"], [60, 60]) == 2          # disagree: one more round
    assert sc.next_round(["4"] * 8, [60] * 8) == 0           # nothing left
    detect = SelfConsistency(samples=8, per_round=2, detect_round=1,
                             certaindex=Certaindex(entropy_threshold=0.5))
    assert detect.next_round(["4", "7"], [60, 60]) == 6      # detect@knob: uncertain gets all
    length = SelfConsistency(samples=4, per_round=2, length_tokens=70)
    assert length.next_round(["4", "7"], [60, 70]) == 0      # short reasoning: easy, stop
    assert length.next_round(["4", "4"], [90, 90]) == 2
    with pytest.raises(ValueError):
        TokenBudget(0)


def test_schedulers_order_programs():
    views = [ProgramView(0, 1.0, 100), ProgramView(1, 0.5, 10)]
    fin = FinishedLengths([120, 130, 300])
    assert [make_scheduler("fcfs").priority(v, fin) for v in views] == [0, 0]
    fifo = make_scheduler("app_fifo")
    assert fifo.priority(views[0], fin) < fifo.priority(views[1], fin)
    lpm = make_scheduler("lpm")
    assert lpm.priority(views[0], fin) < lpm.priority(views[1], fin)  # more reasoning first
    dyn = DynasorGang(escalate_after_s=5.0)
    # 100 tokens done: the finished programs longer than that have 20, 30, 200 left -> 30.
    assert dyn.remaining_tokens(100, fin) == 30
    assert dyn.priority(views[0], fin) < dyn.priority(views[1], fin)  # shorter remaining first
    old = ProgramView(5, 6.0, 10)
    assert dyn.priority(old, fin) < dyn.priority(views[0], fin)  # starvation escalation
    with pytest.raises(ValueError, match="unknown"):
        make_scheduler("sjf")


def test_approximate_sjf_reads_each_programs_own_estimate():
    fin = FinishedLengths([120, 130, 300])
    own = make_scheduler({"type": "dynasor", "estimate": "program"})
    assert own.wants_program_estimate and not DynasorGang().wants_program_estimate
    # the program that says it has less left runs first; finished programs say the opposite
    # (10 tokens done: 120 left by their median; 250 done: 50 left)
    short, long = ProgramView(1, 0.5, 10, 40), ProgramView(0, 1.0, 250, 400)
    assert own.priority(short, fin) < own.priority(long, fin)
    assert DynasorGang().priority(short, fin) > DynasorGang().priority(long, fin)
    assert own.priority(ProgramView(2, 0.5, 10), fin) == DynasorGang().priority(
        ProgramView(2, 0.5, 10), fin)  # no estimate of its own: the finished programs'
    assert own.priority(ProgramView(3, 11.0, 10, 5), fin) < own.priority(short, fin)  # escalated
    with pytest.raises(ValueError, match="estimate must be finished or program"):
        make_scheduler({"type": "dynasor", "estimate": "oracle"})


def test_programs_estimate_their_remaining_tokens_from_their_knob_and_history():
    from policies.search import SearchBudget
    from programs.base import Outcome
    from programs.reasoning import ReasoningProgram, ReasoningSetup
    from programs.search import SearchProgram, SearchSettings

    setup = ReasoningSetup(16, 64, 8, 0.7, 8, 0.6, 0.95, ())
    sc = ReasoningProgram("sc", SelfConsistency(samples=4, per_round=2), setup, 20,
                          (0, 1, 2, 3))
    first = sc.start()  # two paths launched, none advanced
    assert sc.remaining_tokens() == 4 * 64
    sc.on_done(first[0], Outcome(16, ended=True, text="\\boxed{3}"))
    # path 1 open to its limit; the two paths not launched at path 0's own length, not the budget
    assert sc.remaining_tokens() == 64 + 2 * 16
    search = SearchProgram("p", "mcts", SearchBudget(8), None, 0,
                           SearchSettings(budget_tokens=96))
    first = search.start()[0]
    assert search.remaining_tokens() == 96 * 7  # no history: the budget per request
    nxt = search.on_done(first, Outcome(30, ended=False, reward=0.5))  # the next iteration
    assert len(nxt) == 1 and search.remaining_tokens() == 30 * (8 - 2)  # its own 30 per request


def test_abort_frees_the_request_at_an_iteration_boundary():
    cal = load_calibration(CALIB)
    env = simpy.Environment()
    res = Results(2)
    done = []
    rep = Replica(env, 0, cal, ReplicaConfig(8, 2048, 16, 1000), res, None,
                  on_finish=done.append)
    a, b = Req(0, 32, 400), Req(1, 32, 400)
    rep.submit(a)
    rep.submit(b)
    env.run(until=0.2)  # inside a fast-forwarded decode run
    rep.abort(a)
    env.run()
    assert res.aborted.tolist() == [True, False]
    assert 0 < res.output_tokens[0] < 400 and res.output_tokens[1] == 400
    assert res.finish_s[0] < res.finish_s[1]
    assert rep.free_blocks == rep.cfg.usable_blocks == 999  # every block came back (one: null)
    assert [r.idx for r in done] == [0, 1]


def test_priority_queue_runs_lowest_priority_first():
    cal = load_calibration(CALIB)
    env = simpy.Environment()
    res = Results(3)
    rep = Replica(env, 0, cal, ReplicaConfig(1, 2048, 16, 1000, priority_scheduling=True),
                  res, None)
    rep.submit(Req(0, 16, 50, priority=0))
    rep.submit(Req(1, 16, 50, priority=9))
    rep.submit(Req(2, 16, 50, priority=1))
    env.run()
    assert np.argsort(res.finish_s).tolist() == [0, 2, 1]


def test_sim_cot_decisions_equal_the_offline_replay():
    """Every program's stop position is the counterfactual replay's, on the same trajectory."""
    d = _config("dynasor-cot-certaindex.yaml", count=64, rate_per_s=2)
    r = _run(d)
    progs = r.programs.to_pandas()
    trajs, stride = load_trajectories(TRACE)
    by_key = {(t.question_id, t.sample_id): t for t in trajs}
    bank = load_questions(TRACE)
    pol = ProbeConsistency(window=3, every_tokens=32)
    from programs.workload import draw_seed, plan_programs, program_workload
    cfg = parse_config(d, REPO / "examples")
    plans = plan_programs(program_workload(cfg.workload["programs"], cfg.base_dir), bank,
                          draw_seed(cfg.seed, 1))
    same = 0
    for plan, row in zip(plans, progs.itertuples()):
        t = by_key[(plan.question_id, plan.sample_ids[0])]
        off = certaindex_outcome(t, pol, stride)
        if not off.stopped_early:
            assert np.isnan(row.stop_position_tokens) and row.answer == off.answer
        elif row.stop_position_tokens == off.reasoning_tokens:
            assert row.answer == off.answer
        else:
            # A race the offline replay cannot see: the last chunk ended the reasoning before
            # the stopping probe came back, so the trajectory's own answer stands.
            assert np.isnan(row.stop_position_tokens)
            assert t.reasoning_tokens - off.reasoning_tokens <= stride
            assert row.answer == t.final_answer
            continue
        same += 1
    assert same >= 0.9 * len(plans)
    # Reasoning tokens: at least what the policy kept (aborted in-flight chunks add some).
    assert (progs.reasoning_tokens >= 0).all() and r.summary["programs"] == 64


def test_example_pair_certaindex_saves_tokens_at_equal_accuracy():
    even = _run(_config("dynasor-baseline-even.yaml", count=128)).summary
    cx = _run(_config("dynasor-certaindex.yaml", count=128)).summary
    for s in (even, cx):
        assert {"tokens_generated", "accuracy", "slo_attainment", "ttft_s", "tpot_s"} <= set(s)
    assert cx["accuracy"] >= even["accuracy"] - 0.02
    assert cx["tokens_generated"] < 0.85 * even["tokens_generated"]


def test_simulate_json_has_program_keys_and_tables(tmp_path):
    out = tmp_path / "sim"
    proc = run_cli("simulate", "examples/dynasor-certaindex.yaml", "--json", "-o", str(out))
    s = json.loads(proc.stdout)
    assert s["programs"] == 256 and 0 < s["accuracy"] <= 1 and 0 <= s["slo_attainment"] <= 1
    assert check_trace(out) == []


def test_program_request_ids_are_the_trace_ids():
    """The requests table builds its ids column-wise; they are traces.ids' ids of each row's
    program, role and index (the key sim-vs-live validation joins on)."""
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"]["count"] = 24
    t = _run(d).requests
    rows = zip(t["request_id"].to_pylist(), t["program_id"].to_pylist(), t["role"].to_pylist())
    roles = set()
    for i, (rid, prog, role) in enumerate(rows):
        roles.add(role)
        assert rid == (ids.chunk_id(prog, i) if role == "main" else ids.probe_id(prog, i))
    assert roles == {"main", "probe"}


def test_bad_program_configs_fail_clearly():
    d = _config("dynasor-cot-certaindex.yaml")
    bad = copy.deepcopy(d)
    bad["workload"]["programs"]["policy"] = {"type": "certaindex", "window": 3,
                                             "interval_tokens": 24}
    with pytest.raises(ValueError, match="multiple of the traced stride"):
        _run(bad)
    bad = copy.deepcopy(d)
    bad["workload"]["programs"]["policy"] = {"type": "sc", "samples": 4}
    with pytest.raises(ValueError, match="not a cot policy"):
        _run(bad)
    bad = copy.deepcopy(d)
    bad["cluster"]["scheduler"] = "sjf"
    with pytest.raises(ValueError, match="unknown"):
        _run(bad)
    bad = _config("dynasor-certaindex.yaml")
    bad["workload"]["programs"]["policy"]["samples"] = 64
    with pytest.raises(ValueError, match="samples per question"):
        _run(bad)


def test_max_sustainable_rate_interpolates():
    rows = [{"axis": "rate_per_s", "policy": "p", "scheduler": "s", "rate_per_s": r,
             "slo_attainment": a} for r, a in ((1, 1.0), (2, 0.95), (3, 0.85), (4, 0.5))]
    assert max_sustainable_rate(rows)[0]["max_rate_per_s"] == pytest.approx(2.5)
    rows[0]["slo_attainment"] = 0.5
    assert max_sustainable_rate(rows)[0]["max_rate_per_s"] is None


def test_program_requests_longer_than_max_model_len_are_refused(tmp_path):
    cal = json.loads((REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json").read_text())
    cal["engine_limits"]["max_model_len"] = 64  # shorter than a prompt plus its reasoning
    path = tmp_path / "short.calib.json"
    path.write_text(json.dumps(cal))
    d = _config("dynasor-cot-certaindex.yaml", count=4)
    d["cluster"]["replicas"][0]["calibration"] = str(path)
    with pytest.raises(ValueError, match=r"workload.programs: program \d+'s \w+ request \(prompt "
                                         r"\d+ \+ output \d+ tokens\) exceeds the model's "
                                         r"max_model_len 64"):
        simulate(parse_config(d, REPO / "examples"))


def test_finished_lengths_median_equals_the_sorted_definition():
    """The SJF estimate's O(log T) structure answers exactly what sorting all finished lengths
    answers, also past its initial size."""
    import random

    rng = random.Random(7)
    fin, ref = FinishedLengths(), []
    for _ in range(600):
        t = rng.choice([rng.randint(0, 40), rng.randint(0, 3000)])
        fin.add(t)
        ref.append(t)
        for done in (0, t, rng.randint(0, 3500)):
            longer = sorted(x - done for x in ref if x > done)
            assert fin.median_remaining(done) == (longer[len(longer) // 2] if longer else None)
    with pytest.raises(ValueError):
        fin.add(-1)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(count=True), "workload.programs.count: Input should be a valid integer"),
    (lambda p: p.update(count=2.5), "workload.programs.count: Input should be a valid integer"),
    (lambda p: p.update(count=10**11), "workload.programs.count: Input should be less than or "
                                        "equal to 2000000"),
    (lambda p: p.update(rate_per_s=float("nan")), "workload.programs.rate_per_s: Input should be "
                                                  "a finite number"),
    (lambda p: p.update(rate_per_s=1e-300), "workload.programs.rate_per_s: Input should be "
                                            "greater than or equal to 0.00001"),
    (lambda p: p.update(rate_per_s="4"), "workload.programs.rate_per_s: Input should be a valid "
                                         "number"),
    (lambda p: p["deadline"].update(base_s=float("nan")),
     "workload.programs.deadline.base_s: Input should be a finite number"),
    (lambda p: p["deadline"].update(slo=2), "workload.programs.deadline: unknown key 'slo'"),
    (lambda p: p.update(rates=4), "workload.programs: unknown key 'rates'"),
    (lambda p: p.pop("deadline"), "workload.programs.deadline: required"),
])
def test_a_program_workloads_keys_are_strict(edit, message):
    from programs.workload import program_workload

    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")["workload"]["programs"]
    edit(d)
    with pytest.raises(ValueError) as e:
        program_workload(d, REPO / "examples")
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("method, spec, message", [
    ("a1", {"type": "conformal", "sync": "no"}, "programs.policy.sync: Input should be a valid bool"),
    ("a1", {"type": "conformal", "alpha": "0.4"}, "programs.policy.alpha: Input should be a valid"),
    ("sc", {"type": "even", "cap": 16.9}, "programs.policy.cap: Input should be a valid integer"),
    ("mcts", {"type": "even", "cap": True}, "programs.policy.cap: Input should be a valid integer"),
    ("cot", {"type": "certaindex", "window": 2.7}, "programs.policy.window: Input should be a valid"),
    ("tot", {"type": "seed", "depth": "4"}, "programs.policy.depth: Input should be a valid integer"),
    ("tot", {"type": "seed", "k_config": [2, 1.5]}, r"programs.policy.k_config\[1\]: Input should be"),
    ("mcts", {"type": "frontier", "cap": 8, "rules": [[float("nan"), 2]]},
     r"programs.policy.rules\[0\]\[0\]: Input should be a finite number"),
    ("mcts", {"type": "frontier", "cap": 8, "rules": [[0.5, "2"]]},
     r"programs.policy.rules\[0\]\[1\]: Input should be a valid integer"),
    ("tot", {"type": "seed", "bogus": 1}, "programs.policy: unknown key 'bogus'"),
])
def test_policy_parameters_are_never_converted(method, spec, message):
    """A parameter of the wrong type is an error naming it, not a silent True, 16 or 4."""
    from policies.registry import make_policy

    with pytest.raises(ValueError, match=message):
        make_policy(method, spec)
    assert make_policy("tot", {"type": "seed", "depth": 4, "k_config": [2, 1]}) is not None


@pytest.mark.parametrize("method, spec, key", [
    ("sc", {"type": "sc", "samples": 10**9}, "samples"),
    ("cot", {"type": "budget", "budget_tokens": 10**12}, "budget_tokens"),
    ("mcts", {"type": "even", "cap": 5000}, "cap"),
    ("sc", {"type": "sc", "length_tokens": -1.0}, "length_tokens"),
    ("tot", {"type": "seed", "depth": 1000}, "depth"),
    ("a1", {"type": "conformal", "alpha": 1.0}, "alpha"),
    ("cot", {"type": "certaindex", "effort": "extreme"}, "effort"),
])
def test_policy_parameters_have_physical_bounds(method, spec, key):
    """A parameter past what any reasoning program runs is refused by its schema, naming it."""
    from policies.registry import make_policy

    with pytest.raises(ValueError, match=rf"^programs\.policy\.{key}: Input should be"):
        make_policy(method, spec)


def test_every_registered_policy_type_declares_its_parameters():
    """No policy type parses its own parameters: each has a `policies.params.Params` model."""
    from policies.params import Params
    from policies.registry import PARAMS, POLICIES

    for method, makers in POLICIES.items():
        for kind in makers:
            assert issubclass(PARAMS[method][kind], Params), (method, kind)


def test_a_request_aborted_before_it_was_scheduled_is_written_with_null_times(tmp_path):
    """A certaindex stop can abort a request the engine never scheduled: its output holds null
    (none), not NaN, for when it was scheduled and first emitted, so the run's tables pass the
    contract and every reader reads them."""
    from traces import read_table

    run_cli("simulate", str(REPO / "examples" / "dynasor-cot-certaindex.yaml"), "-o",
            str(tmp_path / "s"), "--json")
    assert check_trace(tmp_path / "s") == []
    reqs = read_table(tmp_path / "s", "requests")
    never = reqs.filter(pc.is_null(reqs["scheduled_s"]))
    assert never.num_rows >= 1  # the case this test is about
    assert set(never["finish_reason"].to_pylist()) == {"abort"}
    assert never["first_token_s"].null_count == never.num_rows

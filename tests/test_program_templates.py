"""Programs sent from their question's template (`sim.workloads.program_templates`, and
`sim.workloads.request_templates` request by request) equal the same programs driven request by
request, table for table.

Every search example (SC, MCTS and Rebase on a branches trace), every CoT and SC example on a
probes trace (paths in rounds, and paths that stop on their probes), and every asynchronous A1
example under every inter-program scheduler (the program's own estimate included), KV pressure, few
sequence slots, several replicas, prefix caching on and off, both step-time model kinds,
compiled and under SimPy; a program that is not round by round, a CoT path that stops on its
probes under SimPy, a synchronous or target-capped A1 program, and Dynasor's eviction hint, fall
back to the plain driver.
"""

from __future__ import annotations

import json

import pandas as pd
from hypothesis import given, settings, strategies as st

from conftest import REPO, example_config
from programs.search import SearchProgram
from programs.workload import draw_seed, load_bank, plan_programs
from sim.families.dynasor.driver import build_search_runs
from sim.config import parse_config, read_yaml
from sim.workloads import program_templates
from sim.workloads.program_templates import record
from sim.workloads.programs import simulate_programs

EXAMPLES = REPO / "examples"
SEARCH = ["dynasor-mcts-certaindex.yaml", "dynasor-mcts-even.yaml",
          "dynasor-rebase-certaindex.yaml", "dynasor-rebase-even.yaml",
          "dynasor-sc-branches-certaindex.yaml"]


def _config(example: str, count: int, rate_per_s: float, replicas: int = 1, seed: int = 0,
            scheduler=None, **group):
    """The example with `count` programs at `rate_per_s`, its first replica group changed (a
    steps table written: the runs are compared step for step too)."""
    d = example_config(example, count=count, rate_per_s=rate_per_s) | {"seed": seed,
                                                                       "output": {}}
    d["cluster"]["replicas"][0].update(count=replicas, **group)
    d["cluster"]["scheduler"] = scheduler or d["cluster"]["scheduler"]
    return parse_config(d, EXAMPLES)


def _equal(a, b):
    for name in ("requests", "programs", "steps"):
        pd.testing.assert_frame_equal(getattr(a, name).to_pandas(), getattr(b, name).to_pandas(),
                                      check_exact=True, obj=name)
    assert set(a.tables) == set(b.tables)
    for name, table in a.tables.items():  # a family's own (A1's conformity: columns)
        pd.testing.assert_frame_equal(pd.DataFrame(table), pd.DataFrame(b.tables[name]),
                                      check_exact=True, obj=name)
    timed = {"wall_s", "event_loop_s"}  # the simulator's own seconds
    assert set(a.summary) == set(b.summary)
    for key in set(a.summary) - timed:
        x, y = a.summary[key], b.summary[key]
        assert x == y or (x != x and y != y), key  # NaN where both have none


SCHEDULERS = st.sampled_from(["fcfs", "dynasor", "lpm", "app_fifo",
                               {"type": "dynasor", "estimate": "program"}])


def _drivers_agree(example: str, count: int, scheduler, kv, seqs, caching: bool, replicas: int,
                   rate: float, seed: int, compiled: bool) -> None:
    """The example with its first replica group changed, run from templates and request by
    request: the same tables."""
    group = {"enable_prefix_caching": caching}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs)):
        if v:
            group[key] = v
    cfg = _config(example, count, rate, replicas, seed, scheduler, **group)
    _equal(simulate_programs(cfg, compiled=compiled),
           simulate_programs(cfg, compiled=compiled, templates=False))


@settings(max_examples=15, deadline=None)
@given(example=st.sampled_from(SEARCH), scheduler=SCHEDULERS,
       kv=st.sampled_from([None, 24, 60]), seqs=st.sampled_from([None, 3]),
       caching=st.booleans(), replicas=st.sampled_from([1, 3]),
       rate=st.sampled_from([1.0, 8.0]), seed=st.integers(0, 3), compiled=st.booleans())
def test_templated_search_programs_equal_the_plain_driver(example, scheduler, kv, seqs, caching,
                                                          replicas, rate, seed, compiled):
    _drivers_agree(example, 40, scheduler, kv, seqs, caching, replicas, rate, seed, compiled)


def test_replicas_of_other_request_costs_send_their_own_fields(tmp_path):
    """Two replica groups whose calibrations price a request's log-probability rows apart: a
    template's sends are kept per cost class, and each replica's requests carry its own."""
    cal = json.loads((REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json").read_text())
    cal["host"] = {"add_request_ms": 0.7, "logprob_token_ms": 0.02, "logprob_top_k_ms": 0.001,
                   "logprob_step_ms": 0.3, "wake_ms": 2.5, "seeded_step_ms": 0.4,
                   "seeded_seq_ms": 0.05, "add_next_ms": 0.2, "step_gap_ms": 0.03}
    (tmp_path / "lp.calib.json").write_text(json.dumps(cal))
    d = read_yaml(EXAMPLES / "dynasor-rebase-certaindex.yaml")
    d["workload"]["programs"].update(count=120, rate_per_s=8.0)  # each question several times
    first = d["cluster"]["replicas"][0]
    d["cluster"]["replicas"] = [dict(first, count=2), dict(first, count=2, calibration=str(
        tmp_path / "lp.calib.json"))]
    cfg = parse_config(d, EXAMPLES)
    res = simulate_programs(cfg)
    assert res.requests.column("replica_id").to_pandas().nunique() == 4
    _equal(res, simulate_programs(cfg, templates=False))


def test_every_program_of_a_question_replays_one_record(monkeypatch):
    """One template per question, recorded from a copy: the drawn programs' own objects are not
    run, and each program's row reads its template's end."""
    built = []
    real = program_templates.record

    def counting(run, oracle, own_estimate):
        built.append(run.question.question_id)
        return real(run, oracle, own_estimate)

    monkeypatch.setattr(program_templates, "record", counting)
    _recorded_once_per_question("dynasor-mcts-certaindex.yaml", 120, built)


def _recorded_once_per_question(example: str, count: int, built: list) -> None:
    """The example's programs, several to a question, leave one record per question (`built`:
    the questions recorded) and the plain driver's tables."""
    cfg = _config(example, count, 4.0)
    res = simulate_programs(cfg)
    questions = res.programs.column("question_id").to_pylist()
    assert len(built) == len(set(built)) == len(set(questions)) < len(questions)
    _equal(res, simulate_programs(cfg, templates=False))


def test_a_program_that_is_not_round_by_round_is_not_templated():
    """A search program whose next request leaves before its round returned (here: every
    request's completion sends the next) has no template; the driver drives it as it is."""

    class Eager(SearchProgram):
        def on_done(self, gen, outcome):
            nxt = super().on_done(gen, outcome)
            return nxt or ([self._gen(0, False)] if self.pending and not self.done
                           and self.requests < self.policy.cap else [])

    wl = _config("dynasor-sc-branches-certaindex.yaml", 4, 4.0).programs
    bank = load_bank(wl)
    runs, _, oracle = build_search_runs(wl, bank, plan_programs(wl, bank, draw_seed(0, 1)))
    run = runs[0]
    assert isinstance(record(run, oracle, False), program_templates.Template)
    p = run.program
    run.program = Eager(p.key, p.method, p.policy, None, p.seed, p.settings)
    assert record(run, oracle, False) is None


def test_the_eviction_hint_keeps_the_plain_driver(monkeypatch):
    """Dynasor's eviction hint reads each request's content as it is sent: templates step
    aside (none is recorded), and the tables are the plain driver's."""
    monkeypatch.setattr(program_templates, "record", None)  # a call would fail
    d = read_yaml(EXAMPLES / "dynasor-mcts-certaindex.yaml")
    d["workload"]["programs"].update(count=30, rate_per_s=4.0)
    d["cluster"]["kv_eviction"] = "idle_programs_first"
    d["cluster"]["replicas"][0].update(kv_blocks=24)
    cfg = parse_config(d, EXAMPLES)
    _equal(simulate_programs(cfg), simulate_programs(cfg, templates=False))


PATHS = ["dynasor-certaindex.yaml", "dynasor-baseline-even.yaml", "dynasor-cot-budget.yaml",
         "dynasor-cot-certaindex.yaml"]
"""CoT and SC examples on a probes trace: paths in rounds (no probe mid-path), and a CoT path
that stops on its probes"""


@settings(max_examples=12, deadline=None)
@given(example=st.sampled_from(PATHS), scheduler=SCHEDULERS,
       kv=st.sampled_from([None, 60]), seqs=st.sampled_from([None, 3]),
       caching=st.booleans(), replicas=st.sampled_from([1, 3]),
       rate=st.sampled_from([1.0, 8.0]), seed=st.integers(0, 3), compiled=st.booleans())
def test_templated_reasoning_paths_equal_the_plain_driver(example, scheduler, kv, seqs, caching,
                                                          replicas, rate, seed, compiled):
    """CoT and SC programs whose paths run in rounds, sent request by request from their
    question's record (a path's last request waits for its round's others, whichever ends
    last sends the next round), and CoT paths that stop on their probes (in the kernel): the
    tables are the plain driver's."""
    _drivers_agree(example, 40, scheduler, kv, seqs, caching, replicas, rate, seed, compiled)


def test_every_reasoning_program_of_its_samples_replays_one_record(monkeypatch):
    """One record per question and traced samples (an SC program launches every sample of its
    question; a CoT program that probes mid-path replays one, recorded as a path that stops,
    `record_stopping`), from a copy."""
    built = []
    real, real_stopping = program_templates.record_requests, program_templates.record_stopping

    def counting(run, oracle, rounds=False):
        assert rounds
        built.append(run.question.question_id)
        return real(run, oracle, rounds)

    def stopping(run, oracle):
        built.append((run.question.question_id, run.plan.sample_ids))
        return real_stopping(run, oracle)

    monkeypatch.setattr(program_templates, "record_requests", counting)
    monkeypatch.setattr(program_templates, "record_stopping", stopping)
    _recorded_once_per_question("dynasor-certaindex.yaml", 60, built)
    built.clear()
    cfg = _config("dynasor-cot-certaindex.yaml", 120, 6.0)
    res = simulate_programs(cfg)
    assert len(built) == len(set(built)) < 120
    _equal(res, simulate_programs(cfg, templates=False))


A1 = ["a1-async.yaml", "a1-async-separate.yaml", "a1-conditional.yaml", "a1-target-only.yaml"]


@settings(max_examples=10, deadline=None)
@given(example=st.sampled_from(A1), scheduler=SCHEDULERS,
       kv=st.sampled_from([None, 160]), seqs=st.sampled_from([None, 3]),
       caching=st.booleans(), replicas=st.sampled_from([1, 2]),
       rate=st.sampled_from([1.0, 6.0]), seed=st.integers(0, 3), compiled=st.booleans())
def test_templated_a1_programs_equal_the_plain_driver(example, scheduler, kv, seqs, caching,
                                                      replicas, rate, seed, compiled):
    """Asynchronous A1 programs sent request by request from their question's record: the
    requests, steps, programs and conformity tables and every summary figure are the plain
    driver's (the draft pool's group changed: its KV, slots, caching and size)."""
    _drivers_agree(example, 24, scheduler, kv, seqs, caching, replicas, rate, seed, compiled)


def test_every_a1_program_of_a_question_replays_one_record(monkeypatch):
    """One request-by-request record per question, from a copy: the recording program's nodes
    are its own (the drawn program's log stays empty), and every program reads its record."""
    built = []
    real = program_templates.record_requests

    def counting(run, oracle):
        built.append(run.question.question_id)
        tpl = real(run, oracle)
        assert tpl is not None and len(tpl.program.rows) and not len(run.program.rows)
        return tpl

    monkeypatch.setattr(program_templates, "record_requests", counting)
    _recorded_once_per_question("a1-async-separate.yaml", 48, built)


def test_synchronous_and_capped_a1_programs_keep_the_plain_driver(monkeypatch):
    """A synchronous A1 program (its turns wait for every path) and one with a target cap (its
    held requests go as others return) send what depends on which request returned first: no
    record is made, and the tables are the plain driver's."""
    monkeypatch.setattr(program_templates, "record_requests", None)  # a call would fail
    monkeypatch.setattr(program_templates, "record", None)
    for example, policy in (("a1-sync.yaml", {}), ("a1-async-separate.yaml", {"target_cap": 2})):
        d = example_config(example, count=16, rate_per_s=4.0) | {"output": {}}
        d["workload"]["programs"]["policy"].update(policy)
        cfg = parse_config(d, EXAMPLES)
        _equal(simulate_programs(cfg), simulate_programs(cfg, templates=False))

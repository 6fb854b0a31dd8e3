"""The program kernel (`sim.kernels.program_kernel`) under the Python driver equals the SimPy run
of a program workload table for table.

Same requests, programs and steps tables and the same events, iterations and preemptions as
`simulate(cfg, compiled=False)` (the lazy replica under SimPy, itself equal to the reference
replica), on Dynasor CoT with probes and self-consistency, on SC, MCTS and Rebase search
programs from a branches trace, on A1's two pools (scoring prefills re-run uncached) and on
SEED's trees (prompts named by prefix chains), under every inter-program scheduler
(priority queues, the lowest-priority victim), KV pressure (preemption, prefix-cache eviction),
chunked prefill, few sequence slots, several replicas, the loop's host time with the seeded
sampling term, and the linear and the serving step-time model (every term of the latter on); and
the workloads it does not cover stay under SimPy.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from conftest import REPO
from sim.engine.cluster import build_replicas
from sim.kernels.plain import why_not_compiled_programs
from sim.kernels.prefix import grow_cache, insert, new_cache, find, evict
from sim.config import parse_config, read_yaml
from sim.simulate import simulate
from sim.step_time.serving_features import FEATURES

CAL = REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json"
EXAMPLES = REPO / "examples"

HOSTS = (False, True, "further")
"""the loop's host terms: none; all; all but the first request added in a gap (it costs
nothing, each further one `add_next_ms`)"""


@pytest.fixture(scope="module")
def cals(tmp_path_factory):
    """Calibrations by (model, host): the programs calibration (linear), the same as a serving
    model with every further term nonzero (first-of-shape with its cap, idle below the seen
    cap, echo, attention pairs, spanned context, a prefix-cache hit's attention over it), each
    with and without host and seeded-sampling terms (they shift steps)."""
    out, folder = {}, tmp_path_factory.mktemp("cal")
    linear = json.loads(CAL.read_text())
    serving = json.loads(CAL.read_text())
    serving["step_time_model"].update(
        kind="serving", features=list(FEATURES), idle_cap_ms=200.0, idle_seen_ms=50.0,
        coef_ms=linear["step_time_model"]["coef_ms"] + [0.3, 1.5, 0.45, 0.2, 1.6, 0.02, 0.5,
                                                        0.3, 0.4, 0.003, 0.2, 30.0],
        prefill_pairs=True, new_shape_cap_tokens=256.0)
    for model, d in (("linear", linear), ("serving", serving)):
        for host in HOSTS:
            if host:
                d["host"] = {"add_request_ms": 0.7, "logprob_token_ms": 0.0,
                             "logprob_top_k_ms": 0.0, "logprob_step_ms": 0.0, "wake_ms": 2.5,
                             "seeded_step_ms": 0.4, "seeded_seq_ms": 0.05, "add_next_ms": 0.2,
                             "step_gap_ms": 0.03}
            if host == "further":  # a fit that saw no gap add one request alone
                d["host"]["add_request_ms"] = 0.0
            out[model, host] = folder / f"{model}-{host}.calib.json"
            out[model, host].write_text(json.dumps(d))
    return out


def _config(example: str, count: int, rate_per_s: float, replicas: int = 1, seed: int = 0,
            scheduler: str | None = None, **group):
    d = read_yaml(EXAMPLES / example)
    d["seed"] = seed
    d["workload"]["programs"].update(count=count, rate_per_s=rate_per_s)
    d["cluster"]["replicas"][0].update(count=replicas, **group)
    if scheduler:
        d["cluster"]["scheduler"] = scheduler
    return parse_config(d, EXAMPLES)


def _equal(fast, ref):
    assert fast.summary["simulator"] == "compiled" and ref.summary["simulator"] == "simpy"
    # exactly equal, NaN (never scheduled, no first token) included
    for name in ("requests", "programs", "steps"):
        pd.testing.assert_frame_equal(getattr(fast, name).to_pandas(),
                                      getattr(ref, name).to_pandas(), check_exact=True,
                                      obj=name)
    for key in ("events", "iterations", "preemptions", "utilization"):
        assert fast.summary[key] == ref.summary[key], key


@settings(max_examples=20, deadline=None)
@given(example=st.sampled_from(["dynasor-cot-certaindex.yaml", "dynasor-certaindex.yaml",
                                "dynasor-cot-budget.yaml"]),
       scheduler=st.sampled_from(["fcfs", "dynasor", "lpm", "app_fifo",
                                 {"type": "dynasor", "estimate": "program"}]),
       kv=st.sampled_from([None, 20, 60]), seqs=st.sampled_from([None, 3, 16]),
       batched=st.sampled_from([None, 48]), caching=st.booleans(), host=st.sampled_from(HOSTS),
       rate=st.sampled_from([2.0, 20.0]), replicas=st.sampled_from([1, 3]),
       model=st.sampled_from(["linear", "serving"]), seed=st.integers(0, 3))
def test_program_kernel_equals_simpy(cals, example, scheduler, kv, seqs, batched, caching,
                                     host, rate, replicas, model, seed):
    group = {"enable_prefix_caching": caching}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs), ("max_num_batched_tokens", batched)):
        if v:
            group[key] = v
    if host or model == "serving":
        group["calibration"] = str(cals[model, host])
    cfg = _config(example, 30, rate, replicas, seed, scheduler, **group)
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))


@settings(max_examples=15, deadline=None)
@given(example=st.sampled_from(["dynasor-mcts-certaindex.yaml", "dynasor-mcts-even.yaml",
                                "dynasor-rebase-certaindex.yaml", "dynasor-rebase-even.yaml",
                                "dynasor-sc-branches-certaindex.yaml"]),
       scheduler=st.sampled_from(["fcfs", "dynasor", "lpm", "app_fifo",
                                 {"type": "dynasor", "estimate": "program"}]),
       kv=st.sampled_from([None, 24, 60]), seqs=st.sampled_from([None, 3]),
       caching=st.booleans(), host=st.sampled_from(HOSTS), replicas=st.sampled_from([1, 3]),
       model=st.sampled_from(["linear", "serving"]), seed=st.integers(0, 3))
def test_search_programs_on_the_kernel_equal_simpy(cals, example, scheduler, kv, seqs, caching,
                                                   host, replicas, model, seed):
    """SC, MCTS and Rebase programs from a branches trace (a tree's requests share their
    program's prompt, cancelled by certaindex mid-flight) run compiled, equal to SimPy."""
    group = {"enable_prefix_caching": caching}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs)):
        if v:
            group[key] = v
    if host or model == "serving":
        group["calibration"] = str(cals[model, host])
    cfg = _config(example, 12, 4.0, replicas, seed, scheduler, **group)
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))


def _pools_config(example: str, programs: int, rate_per_s: float, seed: int = 0,
                  scheduler: str | None = None, **group):
    """An example of two pools (A1, SEED) with each on a device of its own (the kernel runs no
    shared device), `group` set on both."""
    d = read_yaml(EXAMPLES / example)
    d["seed"] = seed
    d["workload"]["programs"].update(count=programs, rate_per_s=rate_per_s)
    for g in d["cluster"]["replicas"]:
        g.pop("device", None)
        g.update(group)
    if scheduler:
        d["cluster"]["scheduler"] = scheduler
    return parse_config(d, EXAMPLES)


def _both_pools(cals, example, programs, rate_per_s, seed, scheduler, kv, seqs, caching, host,
                count, model):
    """A two-pool example simulated compiled and under SimPy, checked equal table for table
    (the family's own tables too): (compiled, SimPy)."""
    group = {"enable_prefix_caching": caching, "count": count}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs)):
        if v:
            group[key] = v
    if host or model == "serving":  # one model on both pools: the tables still must agree
        group["calibration"] = str(cals[model, host])
    cfg = _pools_config(example, programs, rate_per_s, seed, scheduler, **group)
    fast, ref = simulate(cfg), simulate(cfg, compiled=False)
    _equal(fast, ref)
    assert fast.tables == ref.tables
    return fast, ref


@settings(max_examples=12, deadline=None)
@given(example=st.sampled_from(["a1-async.yaml", "a1-sync.yaml", "a1-conditional.yaml",
                                "a1-target-only.yaml"]),
       scheduler=st.sampled_from(["fcfs", "dynasor", "app_fifo"]),
       kv=st.sampled_from([None, 24, 80]), seqs=st.sampled_from([None, 4]),
       caching=st.booleans(), host=st.sampled_from(HOSTS), count=st.sampled_from([1, 2]),
       model=st.sampled_from(["linear", "serving"]), seed=st.integers(0, 3))
def test_a1_programs_on_the_kernel_equal_simpy(cals, example, scheduler, kv, seqs, caching,
                                               host, count, model, seed):
    """A1's two pools (draft steps; target steps and one-token scoring prefills that re-run
    uncached where their cache hit covered the scored positions) run compiled, equal to SimPy,
    the conformity table and A1's summary included."""
    fast, ref = _both_pools(cals, example, 10, 4.0, seed, scheduler, kv, seqs, caching, host,
                            count, model)
    assert {k: v for k, v in fast.summary.items() if k not in ("simulator", "wall_s",
                                                             "event_loop_s")} == \
        {k: v for k, v in ref.summary.items() if k not in ("simulator", "wall_s", "event_loop_s")}


@settings(max_examples=10, deadline=None)
@given(example=st.sampled_from(["seed-greedy-small.yaml", "seed-greedy.yaml", "seed-mcsd.yaml",
                                "seed-sampled.yaml", "seed-separate.yaml",
                                "seed-evaluator.yaml"]),
       scheduler=st.sampled_from(["fcfs", "app_fifo"]),
       kv=st.sampled_from([None, 16, 40]), seqs=st.sampled_from([None, 3]),
       caching=st.booleans(), host=st.sampled_from(HOSTS), count=st.sampled_from([1, 2]),
       model=st.sampled_from(["linear", "serving"]), seed=st.integers(0, 3))
def test_seed_trees_on_the_kernel_equal_simpy(cals, example, scheduler, kv, seqs, caching, host,
                                              count, model, seed):
    """SEED's Tree-of-Thoughts programs (prompts named by prefix chains of their content:
    sibling thoughts share blocks across programs; verifications re-run uncached where their
    drafted tail was cached; value prompts written in speculative rounds) run compiled, equal
    to SimPy, the tot_requests table included."""
    _both_pools(cals, example, 4, 2.0, seed, scheduler, kv, seqs, caching, host, count, model)


def test_a1_scoring_requests_rerun_uncached_on_the_kernel():
    """Scoring prefills whose cache hit covers the scored positions run twice on both paths
    (their prompts prefilled more than once in all), and a run that keeps no steps table
    reports the same pools' KV peaks from its folded totals."""
    cfg = _pools_config("a1-async-separate.yaml", 24, 2.0)
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))
    req, steps = fast.requests.to_pandas(), fast.steps.to_pandas()
    assert fast.summary["preemptions"] == 0
    assert steps.prefill_tokens.sum() > (req.prompt_tokens - req.cached_prompt_tokens).sum()
    folded = simulate(dataclasses.replace(cfg, write_steps=False))
    assert folded.steps is None and folded.summary["simulator"] == "compiled"
    for pool in ("draft", "target"):
        key = f"{pool}_kv_peak_blocks"
        assert folded.summary[key] == fast.summary[key] > 0, key


def test_program_kernel_under_pressure_preempts_evicts_and_aborts():
    """KV pressure on one replica: recompute preemptions of the lowest-priority request and
    cached blocks evicted, with certaindex aborting chunks and probes in flight."""
    cfg = _config("dynasor-cot-certaindex.yaml", 150, 60.0, kv_blocks=34, max_num_seqs=16)
    fast = simulate(cfg)
    _equal(fast, simulate(cfg, compiled=False))
    req = fast.requests.to_pandas()
    assert fast.summary["preemptions"] > 0
    assert (req.finish_reason == "abort").sum() > 0
    assert req.cached_prompt_tokens.sum() > 0  # prefix hits happened between evictions


@pytest.mark.parametrize("model", ["linear", "serving"])
def test_program_kernel_at_scale(cals, model):
    """Thousands of programs on many replicas: long decode runs truncated by submissions, ties
    in the event order, arrays grown mid-run."""
    cfg = _config("dynasor-cot-certaindex.yaml", 3000, 100.0, replicas=20,
                  calibration=str(cals[model, True]))
    _equal(simulate(cfg), simulate(cfg, compiled=False))


def test_simpy_program_columns_grow_from_a_small_start(monkeypatch):
    """A SimPy program run sizes its result columns below the families' loose bound and grows
    them as requests are sent: tables equal the kernel's whether they start at 8 rows or 1M."""
    import sim.workloads.programs as programs

    cfg = _config("dynasor-certaindex.yaml", 60, 20.0, replicas=2)
    monkeypatch.setattr(programs, "INITIAL_ROWS", 8)
    grown = simulate(cfg, compiled=False)
    assert len(grown.requests) > 8 * 4  # grown at least twice
    _equal(simulate(cfg), grown)


def test_program_kernel_without_steps_keeps_the_run_totals():
    """With no steps table the kernel folds each replica's runs into totals as they end: the
    same requests, iterations and KV usage as the run that keeps every step row."""
    cfg = _config("dynasor-cot-certaindex.yaml", 300, 60.0, replicas=3, kv_blocks=60,
                  enable_prefix_caching=True)
    cfg = dataclasses.replace(cfg, write_steps=True)
    rows, folded = simulate(cfg), simulate(dataclasses.replace(cfg, write_steps=False))
    assert folded.steps is None and rows.summary["simulator"] == "compiled"
    pd.testing.assert_frame_equal(folded.requests.to_pandas(), rows.requests.to_pandas(),
                                  check_exact=True)
    assert folded.summary["iterations"] == rows.summary["iterations"] == len(rows.steps)
    assert folded.summary["preemptions"] == rows.summary["preemptions"]
    assert 0.0 < rows.summary["kv_usage_mean"]
    assert folded.summary["kv_usage_mean"] == pytest.approx(rows.summary["kv_usage_mean"],
                                                            rel=1e-12)


def test_what_stays_under_simpy():
    """Sampled step time, the families that do not compile, a shared device (A1's CPU testbed
    here) and the reference paths stay under SimPy."""
    cfg = _config("dynasor-cot-certaindex.yaml", 5, 2.0)
    specs = build_replicas(cfg)
    assert why_not_compiled_programs(cfg, specs, True, 100) is None
    assert "sampled" in why_not_compiled_programs(parse_config(
        {**read_yaml(EXAMPLES / "dynasor-cot-certaindex.yaml"), "latency": "sampled"},
        EXAMPLES), specs, True, 100)
    assert "program kind" in why_not_compiled_programs(cfg, specs, False, 100)
    assert simulate(cfg, compiled=False).summary["simulator"] == "simpy"
    assert simulate(cfg, lazy=False).summary["simulator"] == "simpy"
    a1 = parse_config(read_yaml(EXAMPLES / "a1-async.yaml"), EXAMPLES)
    assert why_not_compiled_programs(a1, build_replicas(a1), True, 100) == "a shared device"
    assert simulate(a1).summary["simulator"] == "simpy"


def test_prefix_cache_arrays_keep_the_dict_order_through_growth():
    """The array cache evicts in the reference dict's order (insertion, re-insertion at the
    end), and growing it keeps every block findable and the order intact."""
    pc, tab, lru, free = new_cache(4, 1)
    keys = [11, 22, 33, 44]
    for k in keys:
        insert(tab, pc, lru, free, 0, k)
    pc, tab = grow_cache(pc, free)
    for k in (55, 66):
        insert(tab, pc, lru, free, 0, k)
    assert all(find(tab, pc, k) >= 0 for k in keys + [55, 66])
    pc[:, 1][pc[:, 1] > 0] = 0  # every block unreferenced
    lru[0, 2] = 6
    assert evict(tab, pc, lru, free, 0, 3) == 3  # the first three inserted go first
    assert [find(tab, pc, k) >= 0 for k in keys + [55, 66]] == [False] * 3 + [True] * 3
    assert lru[0, 2] == 3 and free[1] == 3

"""Scheduling conformance: the reference replica composes each step as the installed vLLM's own
scheduler does (`validation.conformance`; `benchmarks/conformance.py` runs 1,000 workloads).

Step compositions depend on no timing (arrivals reach vLLM before the same step index as they
reached the replica), so these assert exact equality. A vLLM upgrade that changes scheduling
fails here naming the workload and the first step that differs.
"""

from __future__ import annotations

import pytest

from conftest import REPO, TARGET_MODEL
from sim.engine.replica_config import ReplicaConfig
from sim.step_time.calibration import load_calibration
from validation.conformance import (SimRequest, compare_steps, random_workload, replica_steps,
                                    vllm_steps)

CAL = load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json")
# Random workloads (KV pressure, preemption, priority, chunked prefill, small and large budgets,
# prefix caching with and without prefix groups): every step identical.
SEEDS = list(range(60)) + [312, 558]  # 312, 558, priority: a request preempted after being
# scheduled, or preempting itself


def _compare(limits: dict, reqs: list) -> dict:
    cfg = ReplicaConfig(**limits)
    ours, arrived = replica_steps(cfg, CAL, reqs)
    return compare_steps(ours, vllm_steps(cfg, TARGET_MODEL, reqs, arrived, 1280))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_workloads_are_scheduled_step_for_step_as_vllm_does(seed):
    limits, reqs = random_workload(seed)
    c = _compare(limits, reqs)
    assert c["first_difference"] is None, (
        f"workload {seed} {limits}: step {c['first_difference']} differs from vLLM's: "
        f"{c.get('at_first')}")
    assert c["steps"] == c["vllm_steps"] and c["cached_differ"] == 0


def test_the_rules_found_by_conformance_each_hold():
    # vLLM keeps one block of the pool as its null block: 5 blocks of 16 hold 4 x 16 tokens,
    # so the two requests' third blocks do not both fit and one is preempted
    two = [SimRequest(0, 0.0, 30, 6), SimRequest(1, 0.0, 30, 6)]
    c = _compare({"max_num_seqs": 4, "max_num_batched_tokens": 256, "block_size": 16,
                  "kv_blocks": 5}, two)
    assert c["first_difference"] is None and c["preemptions"] == (1, 1)
    # a new request is admitted only where its whole prompt fits, though one chunk is taken
    long = [SimRequest(0, 0.0, 200, 40), SimRequest(1, 0.0, 150, 5)]
    c = _compare({"max_num_seqs": 4, "max_num_batched_tokens": 64, "block_size": 16,
                  "kv_blocks": 24}, long)
    assert c["first_difference"] is None
    # same-prompt requests admitted together: vLLM counts the first's blocks as the others'
    # cache hits in the very step that computes them, and so does the replica
    same = [SimRequest(i, 0.0, 96, 3, group=0, prefix_tokens=96) for i in range(3)]
    c = _compare({"max_num_seqs": 4, "max_num_batched_tokens": 512, "block_size": 16,
                  "kv_blocks": 64, "enable_prefix_caching": True}, same)
    assert c["first_difference"] is None and c["cached_differ"] == 0
    # vLLM caches every full block, a request's own content too: a preempted request's
    # recompute finds the blocks it computed before (16 usable blocks of 16 tokens: the second
    # request is preempted, and recomputes 16 of its 128 tokens, the rest cached)
    pressed = [SimRequest(0, 0.0, 100, 40), SimRequest(1, 0.0, 100, 40)]
    limits = {"max_num_seqs": 2, "max_num_batched_tokens": 512, "block_size": 16,
              "kv_blocks": 17, "enable_prefix_caching": True}
    c = _compare(limits, pressed)
    assert c["first_difference"] is None and c["preemptions"] == (1, 1)
    steps, _ = replica_steps(ReplicaConfig(**limits), CAL, pressed)
    assert [s.tokens["r1"] for s in steps if s.tokens.get("r1", 0) > 1] == [100, 16]


@pytest.mark.parametrize("seed", range(0, 200, 5))
def test_decode_runs_compose_the_steps_one_event_per_iteration_does(seed):
    # Simulations fast-forward a decode batch that cannot change as one run of iterations: the
    # run, expanded, is the same steps the replica composes iteration by iteration.
    limits, reqs = random_workload(seed)
    cfg = ReplicaConfig(**limits)
    each, _ = replica_steps(cfg, CAL, reqs)
    runs, _ = replica_steps(cfg, CAL, reqs, fast_forward=True)
    assert [s.tokens for s in runs] == [s.tokens for s in each]
    assert [s.finished for s in runs] == [s.finished for s in each]

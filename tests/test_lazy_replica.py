"""The lazy replica (`sim.engine.lazy_replica`) equals the reference `Replica` step for step.

Both fast-forward runs of decode iterations; the lazy one accounts decoding requests by one clock
(`sim.engine.decode_cohort`). Same requests table and same steps table, on plain requests under KV
pressure, chunked prefill, few sequence slots, prefix caching, and on Dynasor
programs (the priority scheduler, prefix caching) whose early stops abort requests mid-run.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from conftest import REPO
from sim.config import parse_config, read_yaml
from sim.engine.decode_cohort import DecodeCohort
from sim.engine.request_state import Req
from sim.engine.run_length import decode_run_length
from sim.simulate import simulate

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"


def _reference(cfg):
    """The same simulation on the reference replica, fast-forwarded too."""
    return simulate(cfg, lazy=False)


def _equal(lazy, ref):
    # exactly equal, NaN (never scheduled, no first token) included
    pd.testing.assert_frame_equal(lazy.requests.to_pandas(), ref.requests.to_pandas(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(lazy.steps.to_pandas(), ref.steps.to_pandas(), check_exact=True)
    for key in ("events", "iterations", "preemptions"):
        assert lazy.summary[key] == ref.summary[key], key


@settings(max_examples=30, deadline=None)
@given(rate=st.sampled_from([3.0, 30.0, 300.0]), kv=st.sampled_from([None, 30, 90]),
       seqs=st.sampled_from([None, 3, 24]), batched=st.sampled_from([None, 64, 300]),
       prefix=st.booleans(), seed=st.integers(0, 5))
def test_lazy_replica_equals_the_reference(rate, kv, seqs, batched, prefix, seed):
    group = {"calibration": str(CAL), "count": 2, "enable_prefix_caching": prefix}
    for key, v in (("kv_blocks", kv), ("max_num_seqs", seqs), ("max_num_batched_tokens", batched)):
        if v:
            group[key] = v
    workload = {"arrival": {"kind": "poisson", "rate_per_s": rate}, "num_requests": 150,
                "prompt_tokens": {"kind": "uniform", "low": 8, "high": 400},
                "output_tokens": {"kind": "uniform", "low": 1, "high": 300}}
    if prefix:
        workload["prefix"] = {"groups": 3, "tokens": 128}
    cfg = parse_config({"seed": seed, "workload": workload,
                        "cluster": {"router": "least_outstanding", "replicas": [group]}})
    lazy = simulate(cfg, compiled=False)  # the lazy replica under SimPy
    _equal(lazy, _reference(cfg))
    if kv == 30 and rate == 300.0 and seqs is None:
        assert lazy.summary["preemptions"] > 0  # the reference steps were exercised


def test_lazy_replica_equals_the_reference_on_programs_that_abort():
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"].update(count=60, rate_per_s=8)
    cfg = parse_config(d, REPO / "examples")
    lazy = simulate(cfg)
    reasons = set(lazy.requests.column("finish_reason").to_pylist())
    assert "abort" in reasons, reasons
    _equal(lazy, _reference(cfg))


def test_cohort_run_length_and_blocks_match_the_per_request_count():
    rng = random.Random(0)
    for trial in range(300):
        bs = rng.choice([1, 4, 16])
        co = DecodeCohort(bs)
        co.clock = rng.randint(0, 50)
        members = []
        for i in range(rng.randint(1, 12)):
            r = Req(i, prompt=rng.randint(1, 90), output=rng.randint(2, 120))
            r.computed = r.target = r.prompt + rng.randint(0, 5)
            r.generated = rng.randint(1, r.output - 1)
            r.blocks = -(-r.computed // bs)
            r.pos = i
            co.add(r)
            members.append(r)
        # the planned iteration's blocks, as the replica allocates them
        need = co.residues[-co.clock % bs]
        for r in members:
            r.blocks = -(-(r.computed + 1) // bs)
        assert need == sum(-(-(r.computed + 1) // bs) - -(-r.computed // bs) for r in members)
        free = rng.randint(0, 40)
        assert co.run_length(free) == decode_run_length(members, free, bs, False), trial
        k = rng.randint(1, 40)
        held = sum(r.blocks for r in members)
        after = sum(-(-(r.computed + k) // bs) for r in members)
        assert co.blocks_between(co.clock + 1, co.clock + k) == after - held
        assert co.context() == sum(r.computed + 1 for r in members)
        co.clock += k
        done = co.finished()
        for r in members:
            co.sync(r)
        assert sorted(r.idx for r in done) == sorted(r.idx for r in members
                                                     if r.generated >= r.output)
        assert np.all([r.blocks == -(-r.computed // bs) for r in members])

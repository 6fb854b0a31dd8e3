"""Clusters of several model pools: requests go to the pool their role names."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from policies.scheduling import make_scheduler
from programs.base import Outcome, RequestSpec, Sampling
from sim.engine.cluster import Cluster
from sim.config import parse_config
from sim.workloads.program_driver import ProgramDriver, SimProgram
from sim.simulate import simulate

TARGET_CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
DRAFT_CAL = REPO / "sim" / "data" / "testbed-draft-cpu.calib.json"


class DraftThenVerify:
    """A toy two-role program: `rounds` times, the draft proposes 8 tokens, the target checks."""

    def __init__(self, prompt_tokens: int, rounds: int):
        self.prompt_tokens, self.rounds = prompt_tokens, rounds
        self.pos = self.requests = self.tokens = 0
        self.done = False

    def _spec(self, role: str, n: int) -> RequestSpec:
        spec = RequestSpec("draft" if role == "draft" else "verify", self.requests,
                           self.prompt_tokens + self.pos, Sampling(n), role=role,
                           prefix_tokens=self.prompt_tokens + self.pos)
        self.requests += 1
        return spec

    def start(self) -> list:
        return [self._spec("draft", 8)]

    def on_done(self, spec: RequestSpec, outcome: Outcome) -> list:
        self.tokens += outcome.tokens
        if spec.role == "draft":
            return [self._spec("target", 1)]
        self.pos += 8
        self.rounds -= 1
        self.done = self.rounds == 0
        return [] if self.done else [self._spec("draft", 8)]


class AsAsked:
    """Every request generates what it asked for."""

    def request(self, run, spec):
        return spec.prompt_tokens, spec.prefix_tokens, 0, spec.sampling.max_tokens

    def outcome(self, run, spec, tokens, aborted):
        return Outcome(tokens, aborted=aborted)


class _Plan:
    def __init__(self, index: int, arrival_s: float):
        self.index, self.arrival_s = index, arrival_s


def _two_pools() -> dict:
    return {"workload": {"num_requests": 1}, "cluster": {"router": "least_outstanding",
            "replicas": [{"calibration": str(DRAFT_CAL), "count": 2, "pool": "draft"},
                         {"calibration": str(TARGET_CAL), "count": 1, "pool": "target"}]}}


def test_a_two_role_program_sends_every_request_to_its_pool():
    cfg = parse_config(_two_pools())
    cluster = Cluster(cfg, 16 * 6 * 2, lambda rid, r: driver.on_request_done(r.idx, r.generated,
                                                                   r.aborted))
    assert {k: list(v) for k, v in cluster.pools.items()} == {"draft": [0, 1], "target": [2]}
    driver = ProgramDriver(cluster, AsAsked(), make_scheduler("fcfs"))
    runs = [SimProgram(_Plan(i, 0.05 * i), DraftThenVerify(64, 6), None) for i in range(16)]

    def arrivals():
        for run in runs:
            yield cluster.env.timeout(max(0.0, run.plan.arrival_s - cluster.env.now))
            driver.start(run)

    cluster.run(arrivals())
    owner = driver.owner
    assert all(run.program.done and not np.isnan(run.finish_s) for run in runs)
    assert len(owner) == 16 * 6 * 2
    replica = cluster.res.replica_id[:len(owner)]
    roles = np.array(owner.role_names())
    assert set(replica[roles == "draft"]) == {0, 1}  # both draft replicas serve
    assert set(replica[roles == "target"]) == {2}
    # Each program stays on one replica per pool (its prefix cache lives there).
    for run in runs:
        mine = [i for i, p in enumerate(owner.program) if p == run.idx]
        assert len({int(replica[i]) for i in mine if roles[i] == "draft"}) == 1
    # The draft model is faster per step than the target: draft requests (8 tokens) take less
    # time than 8 target steps would.
    res = cluster.res
    n = len(owner)
    draft_tpot = (res.finish_s[:n] - res.first_token_s[:n])[roles == "draft"] / 7
    assert np.median(draft_tpot) < np.median((res.finish_s[:n] - res.scheduled_s[:n])
                                              [roles == "target"])


def test_a_single_pool_serves_the_target_role_and_unknown_roles_fail():
    cfg = parse_config(_two_pools())
    cluster = Cluster(cfg, 1, lambda rid, r: None)
    with pytest.raises(ValueError, match="no replica pool serves role 'verifier'"):
        cluster.pool_for("verifier")
    one = parse_config({"workload": {"num_requests": 1}, "cluster": {"replicas": [
        {"calibration": str(TARGET_CAL), "count": 2, "pool": "anything"}]}})
    single = Cluster(one, 1, lambda rid, r: None)
    assert single.pool_for("target") == "anything"  # the only pool serves the target role
    # another role on it would be priced on the target's calibration: it needs its own pool
    with pytest.raises(ValueError, match="no replica pool serves role 'draft'; pools: "
                                         r"\['anything'\]"):
        single.pool_for("draft")
    # A plain workload on a two-pool cluster goes to the target pool.
    d = _two_pools()
    d["workload"] = {"arrival": {"kind": "poisson", "rate_per_s": 5}, "num_requests": 20,
                     "prompt_tokens": 32, "output_tokens": 8}
    req = simulate(parse_config(d)).requests.to_pandas()
    assert set(req.replica_id) == {2}

"""The run-of-iterations records: appended as tuples, packed into float blocks as they fill,
truncated wherever they sit, read back as the columns every record would give; a request's status
through a replica, in vLLM's order."""

from __future__ import annotations

import numpy as np

from sim.engine.request_state import _BLOCK, SEG_COLUMNS, Results


def test_records_read_back_the_same_packed_or_not_and_truncate_in_a_block():
    res = Results(0)
    rows = [tuple(float(i * 100 + j) if j != 2 else i % 7 + 2 for j in range(len(SEG_COLUMNS)))
            for i in range(2 * _BLOCK + 5)]
    for i, row in enumerate(rows):
        assert res.add_segment(row) == i
    # one record in the first packed block, one still a tuple
    res.truncate_segment(3, 1)
    res.truncate_segment(2 * _BLOCK + 1, 1)
    expected = np.array(rows, dtype=float)
    expected[[3, 2 * _BLOCK + 1], 2] = 1
    got = np.column_stack([res.seg[c] for c in SEG_COLUMNS])
    assert np.array_equal(got, expected)
    res.add_segment(rows[0])  # a record added after reading: the columns are rebuilt
    assert len(res.seg["k_iters"]) == len(rows) + 1


def test_a_request_status_follows_vllms_order_through_preemption():
    import simpy

    from conftest import REPO
    from sim.engine.replica import Replica
    from sim.engine.replica_config import ReplicaConfig
    from sim.engine.request_state import Req, Status
    from sim.step_time.calibration import load_calibration

    assert Status.WAITING < Status.RUNNING < Status.PREEMPTED < Status.FINISHED
    cal = load_calibration(REPO / "sim" / "data" / "testbed-large-cpu.calib.json")
    env, res, seen = simpy.Environment(), Results(3), []
    # 12 blocks of 16 tokens: two 64-token prompts run, and their decodes outgrow the KV
    replica = Replica(env, 0, cal, ReplicaConfig(4, 512, 16, 12), res, None,
                      on_finish=lambda r: seen.append((r.idx, r.status)), fast_forward=False)
    reqs = [Req(i, 64, 64) for i in range(3)]
    assert {r.status for r in reqs} == {Status.WAITING}
    for r in reqs:
        replica.submit(r)
    statuses = []

    def watch():
        while len(seen) < 3:
            statuses.append([r.status for r in reqs])
            yield env.timeout(0.001)

    env.process(watch())
    env.run()
    assert res.preemptions.sum() > 0 and sorted(seen) == [(i, Status.FINISHED) for i in range(3)]
    # a preempted request waits as PREEMPTED (not WAITING: its first schedule time stands)
    assert any(Status.PREEMPTED in row for row in statuses)
    for i in range(3):
        column = [row[i] for row in statuses]
        assert Status.RUNNING in column
        assert Status.WAITING not in column[column.index(Status.RUNNING):], i
    assert np.isfinite(res.scheduled_s).all() and (res.scheduled_s <= res.first_token_s).all()

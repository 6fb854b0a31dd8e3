"""A process loads a program workload's trace once per state of its files, method and policy
(`programs.workload.load_bank`): a sweep's points share the bank, a changed trace loads again
and a sealed one whose bytes changed is still refused."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import REPO
from programs import workload
from sim.config import parse_config, read_yaml
from sim.simulate import simulate

EXAMPLES = REPO / "examples"


def _programs(example: str, **change):
    d = read_yaml(EXAMPLES / example)
    d["workload"]["programs"].update(count=8, **change)
    return parse_config(d, EXAMPLES).programs


def test_runs_of_one_trace_share_its_bank_and_tables():
    workload.forget_banks()
    first = workload.load_bank(_programs("dynasor-mcts-certaindex.yaml"))
    # another rate, count and deadline: the same bank
    assert workload.load_bank(_programs("dynasor-mcts-certaindex.yaml", rate_per_s=9.0)) is first
    # another cap: the search loader reads it, so another bank
    policy = {"type": "certaindex", "cap": 8, "entropy_threshold": 0.5}
    assert workload.load_bank(_programs("dynasor-mcts-certaindex.yaml", policy=policy)) \
        is not first

    d = read_yaml(EXAMPLES / "a1-async-separate.yaml")
    d["workload"]["programs"]["count"] = 4
    cfg = parse_config(d, EXAMPLES)
    kept = simulate(cfg)
    workload.forget_banks()
    fresh = simulate(cfg)
    assert kept.requests.equals(fresh.requests) and kept.programs.equals(fresh.programs)
    assert kept.tables == fresh.tables and kept.summary["accuracy"] == fresh.summary["accuracy"]


def test_a_changed_trace_loads_again_and_a_tampered_one_is_refused(tmp_path):
    trace = tmp_path / "branches"
    shutil.copytree(REPO / "traces" / "data" / "testbed-branches-cpu", trace)
    wl = _programs("dynasor-rebase-even.yaml", trace=str(trace))
    bank = workload.load_bank(wl)
    assert workload.load_bank(wl) is bank
    part = next((trace / "branches").glob("*.parquet"))
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # rewritten, same bytes
    again = workload.load_bank(wl)
    assert again is not bank and len(again.questions) == len(bank.questions)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000))
    with pytest.raises(ValueError, match="its bytes changed since the directory was sealed"):
        workload.load_bank(wl)


def test_a_process_keeps_a_few_banks_the_least_recent_dropped():
    workload.forget_banks()
    loads = [_programs("dynasor-mcts-certaindex.yaml", policy={
        "type": "certaindex", "cap": cap, "entropy_threshold": 0.5})
        for cap in range(2, 3 + workload.BANKS_KEPT)]
    banks = [workload.load_bank(wl) for wl in loads]
    assert len(workload._BANKS) == workload.BANKS_KEPT
    assert workload.load_bank(loads[-1]) is banks[-1]
    assert workload.load_bank(loads[0]) is not banks[0]  # the first was dropped

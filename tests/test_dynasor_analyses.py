"""Dynasor's analyses: certaindex against the oracle's remaining compute
(`sim.families.dynasor.correlation`, `reasonsim dynasor correlate`: exact rows on hand-made
questions, the command on the shipped traces) and finish-time fairness
(`sim.families.dynasor.fairness`, `reasonsim dynasor fairness`)."""

from __future__ import annotations

import json
import math

import pytest

from conftest import REPO, run_cli
from inputs.limits import MIN_RATE_PER_S
from policies.certaindex import Probe
from programs.traced import SearchBank, SearchQuestion, TracedRequest, Trajectory
from sim.config import read_yaml
from sim.families.dynasor.correlation import correlations, cot_points, sc_points
from sim.families.dynasor.fairness import fairness


def _question(qid: str, answers: list, tokens: list, gold: str = "7") -> SearchQuestion:
    reqs = tuple(TracedRequest(i, i, 10, t, a, 0.5 + 0.1 * i, True)
                 for i, (a, t) in enumerate(zip(answers, tokens)))
    return SearchQuestion(qid, 1, 10, gold, reqs)


def test_sc_rows_read_certaindex_and_the_oracles_remaining_tokens():
    bank = SearchBank("sc", 5, (
        # majority after 1..5 samples: 3, 3, 7, 3 (a 2-2 tie: 3 came first), 7: stable from 5
        _question("a", ["3", "7", "7", "3", "7"], [10, 20, 30, 40, 50]),
        _question("b", ["7", "7", "7", "7", "7"], [5, 5, 5, 5, 5]),
        _question("c", ["1", "2", "1", "1", "2"], [9, 9, 9, 9, 9])), {1: 1.0}, {})
    rows = {r["query"]: r for r in sc_points(bank, 2)}
    assert rows["a"]["certaindex"] == pytest.approx(0.0)  # two answers in two samples
    assert rows["a"]["solvable"] and rows["a"]["remaining_tokens"] == 30 + 40 + 50
    assert rows["b"]["certaindex"] == 1.0 and rows["b"]["remaining_tokens"] == 0
    assert not rows["c"]["solvable"] and rows["c"]["remaining_tokens"] is None
    assert rows["b"]["output_tokens_mean"] == 5
    assert rows["b"]["logprob_mean"] == pytest.approx((math.log(0.5) + math.log(0.6)) / 2)
    assert sc_points(bank, 5) == []  # nothing left to decide at the cap


def _trajectory(sample: int, answers: list, reasoning_tokens: int) -> Trajectory:
    return Trajectory(question_id="q", sample_id=sample, difficulty=1, gold_answer="7",
                      final_answer=answers[-1], reasoning_tokens=reasoning_tokens,
                      probes=tuple(Probe(16 * (i + 1), a, False) for i, a in enumerate(answers)),
                      probe_tokens=(4,) * len(answers))


def test_cot_rows_read_the_probe_window_and_the_first_stable_correct_probe():
    trajs = [_trajectory(0, ["1", "7", "2", "7", "7", "7"], 96),  # correct from 64 on
             _trajectory(1, ["7", "7", "7", "7"], 64),             # correct all along
             _trajectory(2, ["7", "7", "3"], 48),                  # unsolvable
             _trajectory(3, ["7"], 16)]                            # ended before 32
    rows = {r["query"]: r for r in cot_points(trajs, 32, window=3)}
    assert set(rows) == {"q/0", "q/1", "q/2"}
    assert rows["q/0"]["remaining_tokens"] == 64 - 32
    assert rows["q/0"]["certaindex"] == pytest.approx(0.0)  # "1", "7": two groups of two
    assert rows["q/1"]["certaindex"] == 1.0 and rows["q/1"]["remaining_tokens"] == 0
    assert not rows["q/2"]["solvable"]
    c = correlations(list(rows.values()))
    assert (c["queries"], c["solvable"]) == (3, 2)
    assert c["certaindex_mean_unsolvable"] == 1.0  # "7", "7" before it went wrong


def test_correlate_on_the_shipped_traces_writes_its_table_and_figure(tmp_path):
    proc = run_cli("dynasor", "correlate", str(REPO / "traces/data/testbed-branches-cpu"),
                   "-o", str(tmp_path), "--json")
    result = json.loads(proc.stdout)
    assert result["kind"] == "branches" and set(result["by_detect"]) == {"2", "4", "8"}
    at2 = result["by_detect"]["2"]
    assert set(at2["signals"]) == {"certaindex", "output_tokens_mean", "logprob_mean",
                                   "linear_combination"}
    assert all(-1 <= v["pearson"] <= 1 for v in at2["signals"].values())
    # higher certaindex, fewer tokens left to a stable correct vote (testbed: about -0.5)
    assert at2["signals"]["certaindex"]["pearson"] < 0
    assert (tmp_path / "certaindex_correlation.png").stat().st_size > 0
    cot = run_cli("dynasor", "correlate", str(REPO / "traces/data/testbed-probes-cpu"), "-o",
                  str(tmp_path / "cot"), "--detect", "32,64", "--json")
    assert set(json.loads(cot.stdout)["by_detect"]) == {"32", "64"}
    bad = run_cli("dynasor", "correlate", str(REPO / "traces/data/testbed-probes-cpu"), "-o",
                  str(tmp_path / "x"), "--detect", "100000", check=False)
    assert bad.returncode == 2 and "no query is still running" in bad.stderr
    # MCTS: the reward model's mean score after the first solution; the testbed's answers
    # settle early, so few solvable queries still need tokens and the figure rests on them
    branches = str(REPO / "traces/data/testbed-branches-cpu")
    mcts = json.loads(run_cli("dynasor", "correlate", branches, "--method", "mcts", "-o",
                              str(tmp_path / "m"), "--json").stdout)
    first = mcts["by_detect"]["1"]
    assert set(mcts["by_detect"]) == {"1", "2", "3"} and first["queries"] == 48
    assert 0 < first["solvable_needing_tokens"] < first["solvable"]
    assert first["signals"]["certaindex"]["pearson"] < 0
    bad = run_cli("dynasor", "correlate", branches, "--method", "rebase", "--cap", "5", "-o",
                  str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "no rebase programs of cap 5" in bad.stderr


def test_search_certaindex_is_the_reward_aggregate_and_the_oracle_the_first_stable_answer():
    from programs.traced import load_search
    from sim.families.dynasor.correlation import search_points

    bank = load_search(REPO / "traces/data/testbed-branches-cpu", "rebase", 4)
    rows = {r["query"]: r for r in search_points(bank, 2)}
    for q in bank.questions:
        if q.question_id not in rows:
            continue
        row = rows[q.question_id]
        levels = sorted({r.group for r in q.requests})
        leaves, k = [], 0
        while len(leaves) < 2:  # the level that brings the second solution
            leaves += [r for r in q.requests if r.group == levels[k] and r.is_leaf]
            k += 1
        assert row["certaindex"] == pytest.approx(max(r.reward for r in leaves))  # Rebase: max
        assert row["remaining_tokens"] is None or row["remaining_tokens"] >= 0


def test_programs_alone_have_finish_time_fairness_one_and_sharing_raises_it():
    d = read_yaml(REPO / "examples" / "dynasor-cot-certaindex.yaml")
    d["workload"]["programs"]["count"] = 48
    shared = fairness(d, REPO / "examples", ["fcfs", "dynasor"])
    assert [r["scheduler"] for r in shared] == ["fcfs", "dynasor"]
    assert all(r["programs"] == 48 and r["rho_mean"] > 1.2 for r in shared)  # 6 programs/s
    d["workload"]["programs"]["rate_per_s"] = MIN_RATE_PER_S  # the programs already alone
    (alone,) = fairness(d, REPO / "examples", ["fcfs"])
    assert alone["rho"] == pytest.approx([1.0] * 48)


def test_fairness_command_writes_its_cdf_and_refuses_a_request_workload(tmp_path):
    proc = run_cli("dynasor", "fairness", str(REPO / "examples" / "dynasor-certaindex.yaml"),
                   "--count", "24", "--schedulers", "fcfs,app_fifo", "-o", str(tmp_path),
                   "--json")
    summary = json.loads(proc.stdout)
    assert [r["scheduler"] for r in summary] == ["fcfs", "app_fifo"]
    assert all(r["rho_p50"] <= r["rho_p90"] <= r["rho_max"] for r in summary)
    assert len(json.loads((tmp_path / "finish_time_fairness.json").read_text())[0]["rho"]) == 24
    assert (tmp_path / "finish_time_fairness.png").stat().st_size > 0
    bad = run_cli("dynasor", "fairness", str(REPO / "examples" / "replay-small.yaml"), "-o",
                  str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "not a program workload" in bad.stderr


def test_ablation_steps_from_lpm_through_gang_and_sjf_on_each_allocation(tmp_path):
    proc = run_cli("dynasor", "ablation", str(REPO / "examples" / "dynasor-baseline-even.yaml"),
                   str(REPO / "examples" / "dynasor-certaindex.yaml"), "--rates", "1,3",
                   "--workers", "1", "-o", str(tmp_path), "--json")
    steps = json.loads(proc.stdout)
    assert [s["scheduler"] for s in steps] == ["lpm", "app_fifo", "dynasor", "dynasor_sjf"] * 2
    assert len({s["policy"] for s in steps}) == 2
    first = steps[0]
    assert first["max_rate_vs_baseline"] in (None, 1.0)
    assert first["mean_latency_vs_baseline"] == {"1.0": 1.0, "3.0": 1.0}
    # certaindex's shorter programs: lower latency than the even allocation at 3 programs/s
    assert all(s["mean_latency_vs_baseline"]["3.0"] < 1 for s in steps[4:])
    assert (tmp_path / "ablation.json").exists() and (tmp_path / "ablation.png").stat().st_size
    # the paper's SJF (each program's own estimate) orders programs apart from the finished
    # programs' estimate: the two steps differ somewhere
    own, finished = steps[3]["mean_latency_s"], steps[2]["mean_latency_s"]
    assert own != finished

"""Live replay of program workloads on real vLLM (CPU build) against the simulator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import REPO, example_config, run_cli, speed_figure
from traces import check_trace, read_run, read_table
from validation.beside_checks import started_s
from validation.judge import pool_step_speeds

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("config", ["dynasor-cot-certaindex.yaml", "dynasor-certaindex.yaml"])
def test_live_replay_reproduces_the_simulated_decisions(tmp_path, config):
    out = tmp_path / "rp"
    path = REPO / "examples" / config
    if config == "dynasor-certaindex.yaml":  # SC under the paper's SJF: each program's own estimate
        d = example_config(config)
        d["cluster"]["scheduler"] = "dynasor_sjf"
        d["workload"]["programs"]["trace"] = str(REPO / "traces/data/testbed-probes-cpu")
        d["cluster"]["replicas"][0]["calibration"] = str(
            REPO / "sim/data/testbed-large-programs-cpu.calib.json")
        path = tmp_path / config
        path.write_text(json.dumps(d))  # YAML reads JSON
    proc = run_cli("dynasor", "replay", str(path), "--count", "6", "-o", str(out),
                   "--json", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "live") == [] and check_trace(out / "sim") == []
    assert read_run(out / "live")["params"]["config"]["scheduler"] == (
        "dynasor_sjf" if config == "dynasor-certaindex.yaml" else "dynasor")
    assert list(result["machine_speed"]["runs"][0]) == ["target"]
    assert speed_figure(result["machine_speed"]["runs"][0]["target"])
    # and the simulation again at the live run's own decode speed (the example's calibration
    # named relative to the config, the SC one's absolute)
    at = result["at_live_speed"]
    assert speed_figure(at["decode_level"]) and (out / "sim_at_live" / "calibration.json").is_file()
    assert set(at["error"]) == set(at["error_sampled"]) == {"program_latency_p50",
                                                            "program_latency_p90"}
    assert all(math.isfinite(v) for v in [*at["error"].values(), *at["error_sampled"].values()])
    live = read_table(out / "live", "programs").to_pandas()
    req = read_table(out / "live", "requests").to_pandas()
    assert len(live) == 6 and live.finish_s.notna().all()
    assert set(req.program_id) == set(live.program_id)
    assert (req.groupby("program_id").output_tokens.sum().sort_index().to_numpy() ==
            live.set_index("program_id").tokens_generated.sort_index().to_numpy()).all()
    # Seeded chunks reproduce the traced trajectories, so the same policy decides the same.
    assert result["decision_agreement"] >= 5 / 6
    assert result["answer_agreement"] >= 5 / 6
    assert abs(result["error"]["tokens_per_program"]) < 0.1
    if (live.stop_position_tokens.notna() | (live.paths < 8)).any():
        assert (req.finish_reason == "abort").any() or config == "dynasor-certaindex.yaml"


def test_a_replay_under_kv_pressure_hints_idle_programs_to_vllm(tmp_path):
    # the config's pool (kv_blocks) and eviction order reach the live engine
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", "examples/dynasor-kv-pressure.yaml", "--count", "8",
                   "-o", str(out), "--json", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "live") == []
    assert read_run(out / "live")["params"]["config"]["kv_eviction"] == "idle_programs_first"
    steps = read_table(out / "live", "steps").to_pandas()
    assert (steps.kv_blocks_total == 40).all() and steps.kv_blocks_used.max() <= 40
    assert result["decision_agreement"] >= 7 / 8
    share = result["cached_prompt_share"]
    assert 0 < share["sim"] < 1 and 0 < share["live"] < 1


def test_replay_calibrates_on_the_machine_it_runs_on(tmp_path):
    # --calibrate-here: other programs (seed + 1000) live first, the replica calibrated on them
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", "examples/dynasor-cot-certaindex.yaml", "--count", "4",
                   "-o", str(out), "--calibrate-here", "--repeats", "2", "--speed-checks",
                   "--json", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "calibration" / "live") == []
    cal = json.loads(Path(result["calibration"]).read_text())
    assert cal["provenance"]["traces"] and speed_figure(cal["host"]["add_request_ms"])
    (recorded,) = read_run(out / "sim")["params"]["calibrations"]
    assert recorded["calibration"] == result["calibration"]
    assert read_table(out / "calibration" / "live", "programs").num_rows == 4
    assert read_run(out / "calibration" / "live")["seed"] == read_run(out / "live")["seed"] + 1000
    # each live run's engine the first of its process: none found kernels another had built
    for run in (out / "calibration" / "live", out / "live", out / "live2"):
        assert read_run(run)["params"]["engine"]["engines_before"] == 0
    assert result["decision_agreement"] >= 3 / 4
    # --repeats 2: the same programs served twice (the same stops and answers), the simulation
    # judged against their mean beside their spread, each run's speed and tail measured
    first, second = (read_table(out / d, "programs").to_pandas().set_index("program_id")
                     .sort_index() for d in ("live", "live2"))
    assert (first.answer == second.answer).all() and (first.paths == second.paths).all()
    for key in ("error_vs_live_mean", "live_spread"):
        assert set(result[key]) == {"program_latency_p50", "program_latency_p90"}
        assert all(math.isfinite(v) for v in result[key].values())
    assert all(v >= 0 for v in result["live_spread"].values())
    assert len(result["machine_speed"]["runs"]) == len(result["machine_speed"]["tails"]) == 2
    # --speed-checks: the calibration's programs again after each live run; each live run
    # judged at the mean level of the traffic just before and after it, over the calibration
    # run's own (the judged run's own speed never read)
    cal = out / "calibration"
    order = [cal / "live", out / "live", cal / "check1", out / "live2", cal / "check2"]
    assert [started_s(d) for d in order] == sorted(started_s(d) for d in order)
    assert read_run(cal / "check2")["seed"] == read_run(cal / "live")["seed"]
    level = {d: pool_step_speeds(out / "sim", cal / d)["target"]
             for d in ("live", "check1", "check2")}
    judged = result["judged"]
    assert [lv["target"] for lv in judged["levels"]] == pytest.approx([
        (level["live"] + level["check1"]) / 2 / level["live"],
        (level["check1"] + level["check2"]) / 2 / level["live"]])
    coef = [json.loads(Path(c).read_text())["step_time_model"]["coef_ms"] for c in (
        result["calibration"], out / "sim_beside" / "live2" / "calibration.json")]
    assert coef[1] == pytest.approx([c * judged["levels"][1]["target"] for c in coef[0]])
    assert set(judged["metrics"]) == set(result["live_spread"])
    for m, v in judged["metrics"].items():
        assert v["spread"] == pytest.approx(result["live_spread"][m])
        assert v["ok"] == (abs(v["error"]) <= max(0.05, v["spread"])), m
    unchecked = run_cli("dynasor", "replay", "examples/dynasor-cot-certaindex.yaml",
                        "--speed-checks", "-o", str(tmp_path / "u"), check=False)
    assert unchecked.returncode == 2 and "need --calibrate-here" in unchecked.stderr
    zero = run_cli("dynasor", "replay", "examples/dynasor-cot-certaindex.yaml", "--repeats", "0",
                   "-o", str(tmp_path / "z"), check=False)
    assert zero.returncode == 2 and "--repeats 0" in zero.stderr
    bad = run_cli("dynasor", "replay", "examples/dynasor-cot-certaindex.yaml", "--url",
                  "http://127.0.0.1:9", "--calibrate-here", "-o", str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "--calibrate-here needs the in-process engine" in bad.stderr


def test_online_sweep_writes_rates_and_plots(tmp_path):
    out = tmp_path / "on"
    proc = run_cli("dynasor", "online", "examples/dynasor-baseline-even.yaml",
                   "examples/dynasor-certaindex.yaml", "--schedulers", "fcfs,dynasor",
                   "--rates", "1,3", "--slo-scales", "2", "-o", str(out), "--json")
    result = json.loads(proc.stdout)
    assert len(result["points"]) == 2 * 2 * 3
    assert len(result["max_sustainable_rate"]) == 4
    for name in ("attainment_vs_rate", "attainment_vs_slo", "accuracy_vs_attainment"):
        assert (out / f"{name}.png").stat().st_size > 0


@pytest.mark.parametrize("config", ["dynasor-mcts-certaindex.yaml",
                                    "dynasor-rebase-certaindex.yaml"])
def test_live_search_replay_reproduces_the_simulated_decisions(tmp_path, config):
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", f"examples/{config}", "--count", "4", "-o", str(out),
                   "--json", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "live") == [] and check_trace(out / "sim") == []
    live = read_table(out / "live", "programs").to_pandas()
    req = read_table(out / "live", "requests").to_pandas()
    assert len(live) == 4 and live.finish_s.notna().all()
    assert (req.groupby("program_id").size().sort_index().to_numpy() ==
            live.set_index("program_id").paths.sort_index().to_numpy()).all()
    # Seeded requests reproduce the traced programs: same requests, same stop, same answer.
    assert result["decision_agreement"] >= 3 / 4
    assert result["answer_agreement"] >= 3 / 4
    assert abs(result["error"]["tokens_per_program"]) < 0.1
    # Prompts named by the traced tree's content: a program that sends the same requests finds
    # in the simulated cache the blocks vLLM served it from its own (a node's output included)
    sim = read_table(out / "sim", "requests").to_pandas()
    live_cached, sim_cached = (r.groupby("program_id").cached_prompt_tokens.sum()
                               for r in (req, sim))
    same = [p for p in live_cached.index if (req.program_id == p).sum() ==
            (sim.program_id == p).sum()]
    assert len(same) >= 3 and (live_cached[same] > 0).any()
    assert sum(live_cached[p] == sim_cached[p] for p in same) >= len(same) - 1


def test_trace_branches_records_every_request_and_reproduces_the_shipped_trace(tmp_path):
    out = tmp_path / "br"
    run_cli("trace", "branches", "-o", str(out), "--questions", "1", "--samples", "2",
            "--iterations", "2", "--widths", "2", "-q", "--json",
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert check_trace(out) == []
    d = read_table(out, "branches").to_pandas()
    assert set(d.method) == {"sc", "mcts", "rebase"} and d.question_id.nunique() == 8
    per = d.groupby(["method", "question_id"])
    assert (per.size()["sc"] == 2).all() and (per.size()["mcts"] == 2).all()
    assert (per.is_leaf.sum()["rebase"] <= 2).all()
    assert ((d.reward > 0) & (d.reward <= 1)).all()
    assert (d[~d.is_leaf].answer.isna()).all()
    # Seeds do not depend on the cap: the first samples and iterations are the shipped ones.
    shipped = read_table("traces/data/testbed-branches-cpu", "branches").to_pandas()
    key = ["question_id", "method", "branch_id"]
    for method in ("sc", "mcts"):
        mine = d[d.method == method].set_index(key)
        theirs = shipped[shipped.method == method].set_index(key).loc[mine.index]
        same = (mine.output_tokens == theirs.output_tokens) & \
            (mine.answer.fillna("") == theirs.answer.fillna(""))
        assert same.mean() >= 0.8, (method, same.mean())


def test_live_replay_through_an_openai_server(tmp_path):
    # The same programs through the HTTP engine: aborts (cot) close the stream, search programs
    # read log-probabilities and stop strings from the server's answers.
    from engines.server import LocalServer

    args = ["--block-size", "32", "--scheduling-policy", "priority", "--max-num-seqs", "8",
            "--enable-prefix-caching"]
    with LocalServer(REPO / "models" / "testbed" / "target-large", extra_args=args,
                     log_path=tmp_path / "server.log") as server:
        for config in ("dynasor-cot-certaindex.yaml", "dynasor-mcts-certaindex.yaml"):
            out = tmp_path / config
            proc = run_cli("dynasor", "replay", f"examples/{config}", "--count", "4", "--url",
                           server.url, "-o", str(out), "--json")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            assert check_trace(out / "live") == []
            assert read_run(out / "live")["engine"] == "vllm-openai-http"
            assert result["decision_agreement"] >= 3 / 4, config
            assert abs(result["error"]["tokens_per_program"]) < 0.1
    bad = run_cli("dynasor", "replay", "examples/dynasor-cot-certaindex.yaml", "--url",
                  "http://127.0.0.1:9", "-o", str(tmp_path / "x"), check=False)
    assert bad.returncode == 2 and "no OpenAI-compatible server answers" in bad.stderr

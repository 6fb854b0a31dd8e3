"""`simulate`'s inputs: every bad config value is a one-line error naming the file and the key;
its output directory is complete or absent."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli
from sim.config import load_config, parse_config
from sim.simulate import simulate

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
_GROUP_OK = "{calibration: %s}" % CAL


@pytest.mark.parametrize("snippet,message", [
    ("cluster: {replicas: [{calibration: C, count: '2'}]}",
     "cluster.replicas[0].count: Input should be a valid integer (got '2')"),
    ("cluster: {replicas: [{calibration: C, count: true}]}",
     "cluster.replicas[0].count: Input should be a valid integer (got True)"),
    ("cluster: {replicas: [{calibration: C, count: 1.5}]}",
     "cluster.replicas[0].count: Input should be a valid integer"),
    ("cluster: {replicas: [{calibration: C, kv_blocks: 3000000000}]}",
     "cluster.replicas[0].kv_blocks: Input should be less than or equal to 2147483647"),
    ("cluster: {replicas: [{calibration: C, kv_blocks: .nan}]}",
     "cluster.replicas[0].kv_blocks: Input should be a valid integer"),
    ("cluster: {replicas: [{calibration: C, max_num_seqs: 0}]}",
     "cluster.replicas[0].max_num_seqs: Input should be greater than or equal to 1"),
    ("cluster: {replicas: [{calibration: C, max_num_batched_tokens: 1.5}]}",
     "cluster.replicas[0].max_num_batched_tokens: Input should be a valid integer"),
    ("cluster: {replicas: [{calibration: C, enable_prefix_caching: 'no'}]}",
     "cluster.replicas[0].enable_prefix_caching: Input should be a valid boolean"),
    ("cluster: {replicas: [{calibration: C, gpu_memory_utilization: 7}]}",
     "cluster.replicas[0].gpu_memory_utilization: Input should be less than or equal to 1"),
    ("cluster: {replicas: [{calibration: C}]}\nseed: 1.7", "seed: Input should be a valid integer"),
    ("cluster: {replicas: [{calibration: C}]}\nseed: abc", "seed: Input should be a valid integer"),
    ("cluster: {replicas: [{calibration: C}]}\nslo: {ttft_s: -1}",
     "slo.ttft_s: Input should be greater than 0"),
    ("cluster: {replicas: [{calibration: C}]}\nslo: {ttft_s: fast}",
     "slo.ttft_s: Input should be a valid number"),
    ("cluster: {replicas: [{calibration: C}]}\nseed: 1\nseed: 2", "duplicate key 'seed'"),
    ("cluster: {replicas: [{calibration: C}]}\nseed: 99999999999999999999",
     "seed: Input should be less than or equal to 9223372036854775807"),
    ("cluster: {replicas: [{calibration: C, count: 2147483647}]}",
     "cluster.replicas[0].count: Input should be less than or equal to 100000"),
    ("cluster: {replicas: [{calibration: C}], router: 'os:getcwd'}",
     "cluster.router 'os:getcwd': not a class with route(request, cluster)"),
    # keys that would be silently ignored or refused by vLLM
    ("cluster: {replicas: [{calibration: C}]}\nnoise_seed: 3",
     "noise_seed 3: it draws the step-time noise, which only latency: sampled has"),
    ("cluster: {replicas: [{calibration: C, gpu_memory_utilization: 0.5}]}",
     "cluster.replicas[0]: gpu_memory_utilization and model_config size the KV cache from "
     "memory_gb"),
    ("cluster: {replicas: [{calibration: C, speculative: {acceptance_rates: [0.9], "
     "temperature: 0.7}}]}", "temperature picks the acceptance_trace's rows"),
    ("cluster: {replicas: [{calibration: C, kv_blocks: 2, memory_gb: 80}]}",
     "kv_blocks and memory_gb both size the KV cache; give one"),
    ("cluster: {replicas: [{calibration: C}], router: 'zipfile:ZipFile'}",
     "a router class is built with no arguments"),
    ("cluster: {replicas: [{calibration: C}], router: '.foo:Bar'}", "cannot load"),
])
def test_bad_config_values_are_one_line_errors_naming_file_and_key(tmp_path, snippet, message):
    path = tmp_path / "bad.yaml"
    workload = "workload: {arrival: {kind: poisson, rate_per_s: 1}, num_requests: 3, " \
               "prompt_tokens: 8, output_tokens: 8}\n"
    path.write_text(workload + snippet.replace("C", str(CAL)) + "\n")
    with pytest.raises(ValueError) as e:
        simulate(load_config(path))
    text = str(e.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text


def test_workload_must_be_a_mapping_and_the_cli_says_so_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(f"workload: 7\ncluster: {{replicas: [{_GROUP_OK}]}}\n")
    proc = run_cli("simulate", str(path), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        f"reasonsim: error: {path}: workload: Input should be a valid dictionary (got 7)"


def test_simulate_output_is_complete_or_absent_and_a_used_directory_is_refused_first(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from traces import check_trace

    cfg = REPO / "examples" / "demo.yaml"
    outcomes = set()
    for delay in (0.5, 1.5, 3.0, 4.5):
        out = tmp_path / f"o{delay}"
        proc = subprocess.Popen([sys.executable, "-m", "reasonsim.cli", "simulate", str(cfg),
                                 "-o", str(out), "--json"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if out.exists():  # renamed into place: complete
            assert check_trace(out) == [] and (out / "summary.json").is_file()
            outcomes.add("complete")
        else:
            outcomes.add("absent")
    # A kill mid-write leaves at most a hidden `.NAME.partial-PID` sibling, never DIR itself.
    assert "absent" in outcomes
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    t0 = time.perf_counter()
    proc = run_cli("simulate", str(cfg), "-o", str(used), check=False)
    assert proc.returncode == 2 and "not empty; choose a new directory" in proc.stderr
    assert time.perf_counter() - t0 < 15  # refused before the 20,000-request simulation


def test_help_config_lists_every_key_from_the_validating_schema():
    from sim.config_schema import GroupSpec

    text = run_cli("simulate", "--help-config").stdout
    for name, field in GroupSpec.model_fields.items():
        assert f"cluster.replicas[].{field.alias or name}: " in text
    assert "cluster.replicas[].kv_blocks: integer or null; default None; >= 2, <= 2147483647" \
        in text
    assert "latency: 'mean' | 'sampled'; default 'mean'" in text
    proc = run_cli("simulate", check=False)
    assert proc.returncode == 2 and "simulate needs CONFIG.yaml" in proc.stderr


def test_requests_longer_than_max_model_len_are_refused():
    d = {"workload": {"arrival": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 5,
                      "prompt_tokens": 100000, "output_tokens": 8},
         "cluster": {"replicas": [{"calibration": str(CAL)}]}}
    with pytest.raises(ValueError, match=r"request 0 \(prompt 100000 \+ output 8 tokens\) "
                                         r"exceeds the model's max_model_len 1280"):
        simulate(parse_config(d))


@pytest.mark.parametrize("workload,message", [
    ("{arrival: {kind: poisson, rate_per_s: 1}, num_requests: 5, prompt_tokens: 100000, "
     "output_tokens: 8}", "workload: request 0 (prompt 100000 + output 8 tokens) exceeds the "
     "model's max_model_len 1280"),
    ("{arrival: {kind: gamma, rate_per_s: 5, cv: 100000}, duration_s: 5, prompt_tokens: 8, "
     "output_tokens: 8}", "workload.arrival.cv: Input should be less than or equal to 100"),
    ("{arrival: {kind: constant, rate_per_s: 5}, duration_s: 1.0e+12, prompt_tokens: 8, "
     "output_tokens: 8}", "expects 5e+12 requests, over the cap of 10,000,000"),
])
def test_workload_errors_found_while_simulating_name_the_config(tmp_path, workload, message):
    path = tmp_path / "w.yaml"
    path.write_text(f"workload: {workload}\ncluster: {{replicas: [{_GROUP_OK}]}}\n")
    proc = run_cli("simulate", str(path), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith(f"reasonsim: error: {path}: ") \
        and message in last, last


def test_certaindex_thresholds_outside_their_range_are_refused(tmp_path):
    src = (REPO / "examples" / "dynasor-certaindex.yaml").read_text()
    path = REPO / "examples" / f"_test_{tmp_path.name}.yaml"  # relative paths as the example's
    try:
        for value, message in (
                ("7", "programs.policy.entropy_threshold: Input should be less than or equal to 1"),
                (".nan", "programs.policy.entropy_threshold: Input should be a finite number")):
            path.write_text(src.replace("entropy_threshold: 0.5", f"entropy_threshold: {value}"))
            proc = run_cli("simulate", str(path), check=False)
            assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    finally:
        path.unlink(missing_ok=True)


def test_a_missing_trace_directory_is_named():
    proc = run_cli("dynasor", "offline", "/nonexistent/trace", check=False)
    assert proc.returncode == 2 and "/nonexistent/trace: no such trace directory" in proc.stderr


def test_validate_refuses_two_runs_of_different_workloads(tmp_path):
    """Same request ids, another seed (other arrivals and lengths): no verdict, one line naming
    a request that differs; a directory with no requests table is named as such."""
    text = (REPO / "examples" / "replay-small.yaml").read_text().replace(
        "../sim/data/testbed-large-cpu.calib.json", str(CAL))
    for seed in (1, 2):
        cfg = tmp_path / f"seed{seed}.yaml"
        cfg.write_text(text.replace("seed: 1", f"seed: {seed}"))
        run_cli("simulate", str(cfg), "-o", str(tmp_path / f"s{seed}"), "--json")
    proc = run_cli("validate", str(tmp_path / "s1"), str(tmp_path / "s2"), "-o",
                   str(tmp_path / "v"), check=False)
    assert proc.returncode == 2 and "not the same workload" in proc.stderr
    assert "request req-" in proc.stderr and "prompt tokens" in proc.stderr, proc.stderr
    (tmp_path / "empty").mkdir()
    proc = run_cli("validate", str(tmp_path / "s1"), str(tmp_path / "empty"), "-o",
                   str(tmp_path / "v"), check=False)
    assert proc.returncode == 2 and "empty: no requests table" in proc.stderr, proc.stderr
    # the same arrivals and prompts, other output lengths: the requests that ran to their limit
    # on both sides show it
    cfg = tmp_path / "longer.yaml"
    cfg.write_text(text.replace("high: 128}", "high: 140}"))
    run_cli("simulate", str(cfg), "-o", str(tmp_path / "longer"), "--json")
    proc = run_cli("validate", str(tmp_path / "s1"), str(tmp_path / "longer"), "-o",
                   str(tmp_path / "v"), check=False)
    assert proc.returncode == 2 and "runs to its length limit" in proc.stderr, proc.stderr


def test_a_killed_writers_partial_output_is_removed_by_the_next_write(tmp_path):
    stale = tmp_path / ".out.partial-99999999"  # no such process
    (stale / "requests").mkdir(parents=True)
    text = (REPO / "examples" / "replay-small.yaml").read_text().replace(
        "../sim/data/testbed-large-cpu.calib.json", str(CAL))
    (tmp_path / "c.yaml").write_text(text)
    run_cli("simulate", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "out"), "--json")
    assert not stale.exists() and (tmp_path / "out" / "requests").is_dir()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("example, change, message", [
    ("dynasor-mcts-certaindex.yaml", {"per_round": 4},
     "per_round: only sc launches its solutions in rounds, not mcts"),
    ("dynasor-mcts-certaindex.yaml", {"reward_threshold": 5},
     "reward_threshold: Input should be less than or equal to 1"),
    ("dynasor-cot-certaindex.yaml", {"effort": "high"},
     "effort sets window and interval_tokens; give it or interval_tokens, not both"),
    ("dynasor-mcts-certaindex.yaml", {"every": 100},
     "every 100: more than the cap .16. solutions, so certaindex would never be checked"),
    ("dynasor-certaindex.yaml", {"detect_round": 10},
     "detect_round 10: 8 samples 2 a round make only 4 rounds"),
    ("dynasor-baseline-even.yaml", {"detect_round": 1},
     "detect_round 1: it says when certaindex .entropy_threshold. or length_tokens is read"),
])
def test_a_policy_key_that_would_be_ignored_is_refused(example, change, message):
    """A knob the method never reads, a threshold no path can reach (rewards lie in (0, 1]),
    a preset beside the values it replaces: one-line errors, not the baseline's results."""
    from sim.config import read_yaml

    d = read_yaml(REPO / "examples" / example)
    d["workload"]["programs"]["policy"].update(change)
    with pytest.raises(ValueError, match=message):
        simulate(parse_config(d, REPO / "examples"))


@pytest.mark.parametrize("example, keep, pool, role", [
    ("a1-async.yaml", "target", "target", "draft"), ("a1-async.yaml", "both", "draft", "target"),
    ("seed-greedy-small.yaml", "target", "target", "draft")])
def test_programs_without_a_pool_of_each_role_are_refused(example, keep, pool, role):
    """Without a draft pool the draft's steps would be priced on the target's calibration;
    with both engines in a pool named draft, the target's on a mix of both: refused where the
    config is read, before anything is simulated."""
    from sim.config import read_yaml

    d = read_yaml(REPO / "examples" / example)
    groups = d["cluster"]["replicas"]
    d["cluster"]["replicas"] = [dict(g, pool=pool) for g in groups
                                if keep == "both" or g["pool"] == keep]
    family = "a1" if example.startswith("a1") else "seed"
    with pytest.raises(ValueError, match=f"cluster.replicas: the {family} family's programs send "
                                         f"{role} requests: no replica pool serves role '{role}'; "
                                         rf"pools: \['{pool}'\]"):
        parse_config(d, REPO / "examples")


def test_target_only_programs_need_no_draft_pool():
    """A1's target-only baseline and SEED's autoregressive mode send the target alone."""
    from sim.config import read_yaml

    for example, policy in (("a1-target-only.yaml", None), ("seed-greedy-small.yaml", "ar")):
        d = read_yaml(REPO / "examples" / example)
        d["workload"]["programs"]["count"] = 2
        if policy:
            d["workload"]["programs"]["policy"]["type"] = policy
        d["cluster"]["replicas"] = [g for g in d["cluster"]["replicas"] if g["pool"] == "target"]
        assert simulate(parse_config(d, REPO / "examples")).summary["programs"] == 2


def test_a_program_workload_refuses_a_request_slo():
    """Its attainment is its programs' deadlines: a request SLO would be replaced unread."""
    from sim.config import read_yaml

    d = read_yaml(REPO / "examples" / "dynasor-certaindex.yaml")
    d["slo"] = {"ttft_s": 0.001}
    with pytest.raises(ValueError, match="slo: a program workload's attainment is its "
                                         "programs' deadlines"):
        parse_config(d, REPO / "examples")


def test_validate_gives_no_verdict_on_two_simulations(tmp_path):
    """A simulation's output as the live run compares two simulations: the errors are shown,
    the verdict refused, even with --allow-device-mismatch."""
    import json

    run_cli("simulate", str(REPO / "examples" / "replay-small.yaml"), "-o", str(tmp_path / "s"),
            "--json")
    out = json.loads(run_cli("validate", str(tmp_path / "s"), str(tmp_path / "s"), "-o",
                             str(tmp_path / "v"), "--json", "--allow-device-mismatch"
                             ).stdout.strip().splitlines()[-1])
    assert out["verdict"]["status"] == "refused" and "two simulations" in out["verdict"]["reason"]
    assert out["metrics"]["e2e_s.p50"]["rel_err"] == 0
    assert run_cli("simulate", str(REPO / "examples" / "replay-small.yaml"), "--seeds", "0",
                   check=False).returncode == 2


def test_fewer_batched_tokens_than_sequences_is_refused_as_vllm_refuses_it(tmp_path):
    path = tmp_path / "few.yaml"
    path.write_text("workload: {arrival: {kind: poisson, rate_per_s: 1}, num_requests: 3, "
                    "prompt_tokens: 8, output_tokens: 8}\ncluster: {replicas: [{calibration: "
                    f"{CAL}, max_num_seqs: 64, max_num_batched_tokens: 16}}]}}\n")
    proc = run_cli("simulate", str(path), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        f"reasonsim: error: {path}: cluster.replicas[0]"), proc.stderr
    assert "max_num_batched_tokens (16) must be >= max_num_seqs (64), as vLLM requires" \
        in proc.stderr

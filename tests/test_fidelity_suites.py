"""`reasonsim fidelity`'s suite files: a bad suite refused before any engine starts, the
held-out and sealed suites built on the shipped one, and a workload's replica overrides."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli


@pytest.mark.parametrize("text, message", [
    ("base: {shipped}\nworkloads: {{a: {{seed: 1}}}}", "workloads.a: needs exactly one of"),
    ("base: {shipped}\nworkloads: {{w: {{workload: {{arrival: 5}}}}}}",
     "workloads.w: workload.arrival: expected a mapping with kind"),
    ("base: {shipped}\nworkloads: {{p: {{program: demo.yaml}}}}",
     "workloads.p: program: demo.yaml is not a program config"),
    ("grid: {{}}\nquick_grid: {{}}\nworkloads: {{a: {{seed: 1}}}}",
     "grid: not a trace-steps grid"),
    ("base: suite.yaml\nworkloads: {{a: {{seed: 1}}}}", "leads back to itself"),
    # what the loop would otherwise meet after the grid's tracing (a minute in, in a child)
    ("base: {shipped}\nmax_model_len: -5\nworkloads: {{w: {{workload: {small}}}}}",
     "max_model_len: expected a positive integer, got -5"),
    ("base: {shipped}\nmax_model_len: 4096\nworkloads: {{w: {{workload: {small}}}}}",
     "max_model_len 4096 exceeds the model's max_position_embeddings 2048"),
    ("base: {shipped}\nmax_model_len: 1000\nworkloads: {{w: {{workload: {small}}}}}",
     "grid: max_model_len 1000 < the grid's longest request (1664 tokens)"),
    ("base: {shipped}\nworkloads: {{w: {{replica: {{nonsense: 1}}, workload: {small}}}}}",
     "workloads.w: replica: unknown key 'nonsense'"),
    ("base: {shipped}\nworkloads: {{w: {{replica: {{count: 3}}, workload: {small}}}}}",
     "workloads.w.replica.count: the loop serves one engine live"),
    ("base: {shipped}\nworkloads: {{w: {{quick: true, quick_requests: 0, workload: {small}}}}}",
     "workloads.w: workload.num_requests: Input should be greater than or equal to 1"),
    ("base: {shipped}\nworkloads: {{w: {{quick_request: 3, workload: {small}}}}}",
     "workloads.w: unknown key 'quick_request'"),
    ("base: {shipped}\nworkloads: {{w: {{workload: {{arrival: {{kind: poisson, rate_per_s: 2}}, "
     "num_requests: 4, prompt_tokens: 1800, output_tokens: 400}}}}}}",
     "request 0 (prompt 1800 + output 400 tokens) exceeds the suite's max_model_len 2048"),
    ("base: {shipped}\nworkloads: {{p: {{program: a1-async.yaml}}}}",
     "workloads.p: program: a1-async.yaml is of the a1 family; the loop replays one-engine"),
    ("base: {shipped}\nworkloads: {{p: {{program: dynasor-mcts-certaindex.yaml, "
     "quick_count: 0}}}}", "workloads.p: workload.programs.count: Input should be greater"),
    ("base: {shipped}\nmax_model_length: 4096\nworkloads: {{w: {{workload: {small}}}}}",
     "unknown key 'max_model_length'"),
])
def test_a_bad_suite_is_refused_before_any_engine_starts(tmp_path, text, message):
    suite = tmp_path / "suite.yaml"
    small = ("{arrival: {kind: poisson, rate_per_s: 2}, num_requests: 4, prompt_tokens: 32, "
             "output_tokens: 8}")
    suite.write_text(text.format(shipped=REPO / "examples" / "fidelity" / "suite.yaml",
                                 small=small) + "\n")
    proc = run_cli("fidelity", "--suite", str(suite), "-o", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_used_directory_or_a_suite_with_no_quick_workload_is_refused(tmp_path):
    suite = tmp_path / "suite.yaml"
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    proc = run_cli("fidelity", "--quick", "-o", str(used), check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    # --quick over a suite none of whose workloads is quick would judge nothing, "ok"
    suite.write_text(f"base: {REPO / 'examples' / 'fidelity' / 'suite.yaml'}\nworkloads: "
                     "{w: {workload: {arrival: {kind: poisson, rate_per_s: 2}, num_requests: 4, "
                     "prompt_tokens: 32, output_tokens: 8}}}\n")
    proc = run_cli("fidelity", "--quick", "--suite", str(suite), "-o", str(tmp_path / "q"),
                   check=False)
    assert proc.returncode == 2 and "no workload marked quick: true" in proc.stderr


@pytest.mark.parametrize("flags", [("--retraces", "-1"), ("--retrace-above", "-0.1"),
                                   ("--retrace-above", "nan"), ("--live-reruns", "-1")])
def test_a_negative_retrace_count_or_bound_is_refused_before_tracing(tmp_path, flags):
    proc = run_cli("fidelity", "--quick", "-o", str(tmp_path / "o"), *flags, check=False)
    assert proc.returncode == 2 and "must be >= 0" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_the_retrace_flags_name_the_defaults_they_take():
    from validation.bursts import BURST_TOLERANCE, LIVE_RERUNS
    from validation.fidelity_calibration import NOISY_P90_APE, RETRACES

    text = " ".join(run_cli("fidelity", "--help").stdout.split())  # as wrapped at any width
    assert f"(default {RETRACES};" in text and f"(default {NOISY_P90_APE})" in text
    assert f"(default {LIVE_RERUNS}; 0 with --quick;" in text
    assert f"steps {BURST_TOLERANCE:.0%} over the calibration's" in text


def test_held_out_suites_take_the_base_suites_grids_and_vary_its_programs(tmp_path):
    from validation.fidelity import SUITE, load_suite
    from validation.fidelity_programs import program_config

    base = load_suite(SUITE)
    for name in ("heldout", "sealed"):
        suite = load_suite(REPO / "examples" / "fidelity" / f"{name}.yaml")
        for key in ("grid", "quick_grid", "sampling_grid", "calibration_traffic"):
            assert suite[key] == base[key], (name, key)
        assert not set(suite["workloads"]) & set(base["workloads"])   # workloads of its own
    spec = load_suite(REPO / "examples" / "fidelity" / "sealed.yaml")["workloads"][
        "sc_programs_slow"]
    d = program_config(spec, tmp_path / "cal.json", quick=False)
    assert d["workload"]["programs"]["rate_per_s"] == 1 and d["seed"] == 35
    assert d["workload"]["programs"]["count"] == 12
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: nowhere.yaml\nworkloads: {a: {program: x.yaml}}\n")
    proc = run_cli("fidelity", "--suite", str(bad), "-o", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "is not a suite file beside it" in proc.stderr
    for entry, why in (("{program: nothere.yaml}", "no example config nothere.yaml"),
                       ("{program: dynasor-mcts-certaindex.yaml, programs: {rate: 2}}",
                        "workloads.a: workload.programs: unknown key 'rate'")):
        bad.write_text(f"base: {SUITE}\nworkloads: {{a: {entry}}}\n")
        proc = run_cli("fidelity", "--suite", str(bad), "-o", str(tmp_path / "o"), check=False)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_block_size_override_keeps_kv_tokens(tmp_path):
    from sim.step_time.calibration import load_calibration
    from sim.engine.cluster import build_replicas
    from sim.config import parse_config

    cal_path = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
    cal = load_calibration(cal_path)
    cfg = parse_config({"workload": {"arrival": {"kind": "poisson", "rate_per_s": 1},
                                     "num_requests": 1, "prompt_tokens": 8, "output_tokens": 2},
                        "cluster": {"replicas": [{"calibration": str(cal_path),
                                                  "block_size": 32}]}})
    _, rc = build_replicas(cfg)[0]
    assert rc.block_size == 32
    assert rc.kv_blocks * 32 == cal.kv_blocks_total * cal.block_size

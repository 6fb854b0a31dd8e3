"""The family commands' flags: a value that would give a wrong answer with exit 0 (a repeated
row, a flag the trace's kind never reads, a target or threshold outside its range, a config of
the wrong family or role) is a one-line error naming it."""

from __future__ import annotations

import pytest

from conftest import REPO, run_cli

DATA, EX = REPO / "traces" / "data", REPO / "examples"
PROBES, BRANCHES = str(DATA / "testbed-probes-cpu"), str(DATA / "testbed-branches-cpu")
EXITS = str(DATA / "testbed-exits-target-large-cpu")


@pytest.mark.parametrize("args, message", [
    (["dynasor", "correlate", PROBES, "--window", "0"], "expected an integer >= 1, got '0'"),
    (["dynasor", "online", str(EX / "dynasor-certaindex.yaml"), "--target", "1.5"],
     "--target: expected a number in (0, 1], got '1.5'"),
    (["helios", "offline", EXITS, "--breach-threshold", "nan"], "expected a number in (0, 1]"),
    (["dynasor", "offline", PROBES, "--windows", "3,3"], "a value repeats in '3,3'"),
    (["traces", "check", PROBES, "--max-errors=-1"], "expected an integer >= 0"),
    (["seed", "modes", str(EX / "seed-greedy-small.yaml"), "--modes", "ar,ar"],
     "a name repeats in 'ar,ar'"),
    (["a1", "offline", str(DATA / "testbed-conformity-cpu"), "--calib-samples", "0"],
     "expected an integer >= 1"),
    (["dynasor", "offline", PROBES, "--per-round", "3"],
     "--per-round: for a branches trace; " + PROBES + " is a probes trace"),
    (["dynasor", "offline", BRANCHES, "--windows", "2"], "--windows: for a probes trace"),
    (["dynasor", "correlate", PROBES, "--method", "mcts"], "--method: not read on a probes"),
    (["dynasor", "correlate", BRANCHES, "--window", "5"], "--window: not read on a branches"),
    (["dynasor", "calibrate", BRANCHES, "--method", "sc", "--cap", "16"],
     "certaindex would never stop a program"),
    (["helios", "offline", EXITS, str(DATA / "testbed-exits-target-large-h100")],
     "a second trace of model 'target-large'"),
    (["a1", "samples", str(EX / "a1-target-only.yaml")], "its policy is target_only"),
    (["a1", "budget", str(EX / "demo.yaml")], "not an A1 program config"),
    (["dynasor", "ablation", str(EX / "dynasor-certaindex.yaml"),
      str(EX / "dynasor-baseline-even.yaml")], "must allocate evenly (no early stop)"),
])
def test_a_flag_that_would_answer_wrongly_is_refused(args, message):
    """Each is refused before it writes anything (no -o needed)."""
    proc = run_cli(*args, check=False, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_online_refuses_two_configs_of_one_policy(tmp_path):
    """Its table keys by policy: two clusters of one policy would be pooled into one row."""
    text = (EX / "dynasor-certaindex.yaml").read_text().replace("../", f"{REPO}/").replace(
        "count: 256", "count: 12")
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(text)
    two.write_text(text.replace("count: 1\n", "count: 2\n"))
    proc = run_cli("dynasor", "online", str(one), str(two), "--rates", "1", "--slo-scales", "1",
                   "--schedulers", "fcfs", "-o", str(tmp_path / "o"), check=False, timeout=600)
    assert proc.returncode == 2 and "run the same policy" in proc.stderr, proc.stderr

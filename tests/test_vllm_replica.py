"""`scheduler: vllm`: a replica whose steps the installed vLLM's own scheduler composes
(`validation.vllm_replica`), against the simulator's paths (`validation.path_agreement`).

Every path prices the steps it composes with the same step-time model in mean mode, so where
the compositions agree the results are equal up to a sum's rounding: these assert equality of
decisions, tokens and cached tokens, and of times within 1e-9 s. None depends on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, example_config, run_cli
from validation.fidelity import SUITE, load_suite
from validation.fidelity_programs import program_config
from validation.path_agreement import compare, run_paths

PROGRAMS_CAL = REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json"


def _demo(requests: int) -> dict:
    d = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    d["workload"]["num_requests"] = requests
    return d


def _assert_agree(rows: dict) -> None:
    bad = {p: c for p, c in rows.items() if not c["agrees"]}
    assert not bad, f"paths disagree with the reference replica: {bad}"


def test_the_demo_agrees_on_every_path():
    _assert_agree(compare(run_paths(_demo(240), REPO / "examples")))


@pytest.mark.parametrize("name", ["cot_probes", "self_consistency"])
def test_dynasor_programs_decide_on_the_vllm_replica_as_on_the_replica(name):
    spec = load_suite(SUITE)["workloads"][name]
    d = program_config(spec, PROGRAMS_CAL, quick=True)
    d["workload"]["programs"]["count"] = 10
    rows = compare(run_paths(d, REPO / "examples", ("reference", "vllm")))
    _assert_agree(rows)
    assert rows["vllm"]["requests"] > 10  # programs sent requests (probes, samples)


@pytest.mark.parametrize("example", ["seed-greedy-small.yaml", "a1-sync.yaml"])
def test_two_pools_on_one_device_run_on_the_vllm_replica(example):
    # SEED's ToT states as nested prefixes (chains), A1's scored drafts; a draft and a target
    # pool stepped in turn
    d = example_config(example, count=4)
    _assert_agree(compare(run_paths(d, REPO / "examples", ("reference", "vllm"))))


def test_a_replica_group_names_a_known_scheduler():
    from sim.config import parse_config

    d = _demo(10)
    d["cluster"]["replicas"][0]["scheduler"] = "sglang"
    with pytest.raises(ValueError, match=r"replicas.*scheduler"):
        parse_config(d, REPO / "examples")


def test_the_command_line_runs_a_vllm_scheduled_replica(tmp_path):
    d = _demo(40)
    d["cluster"]["replicas"][0]["calibration"] = str(
        REPO / "sim" / "data" / "testbed-large-cpu.calib.json")
    d["cluster"]["replicas"][0]["scheduler"] = "vllm"
    cfg = tmp_path / "vllm.yaml"
    cfg.write_text(yaml.safe_dump(d))
    proc = run_cli("simulate", str(cfg), "-o", str(tmp_path / "out"), "--json")
    summary = json.loads(proc.stdout)
    assert summary["requests"] == 40 and summary["simulator"] == "simpy", summary

def test_without_the_command_line_the_kind_is_named_with_the_fix():
    # sim never imports an engine: a vllm-scheduled group needs the layer above to register it
    code = ("from sim.config import parse_config, read_yaml; from sim.simulate import simulate; "
            "d = read_yaml('examples/demo.yaml'); d['workload']['num_requests'] = 5; "
            "d['cluster']['replicas'][0]['scheduler'] = 'vllm'; "
            "simulate(parse_config(d, 'examples'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode != 0
    assert "scheduler 'vllm' is not available here" in proc.stderr

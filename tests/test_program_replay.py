"""Live replay of program workloads on real vLLM (CPU build) against the simulator."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from traces import check_trace, read_table

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("config", ["dynasor-cot-certaindex.yaml", "dynasor-certaindex.yaml"])
def test_live_replay_reproduces_the_simulated_decisions(tmp_path, config):
    out = tmp_path / "rp"
    proc = run_cli("dynasor", "replay", f"examples/{config}", "--count", "6", "-o", str(out),
                   "--json", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check_trace(out / "live") == [] and check_trace(out / "sim") == []
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

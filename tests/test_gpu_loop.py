"""`scripts/gpu_loop.sh --dry-run`: the GPU loop's every step on the CPU (the testbed model,
small), so the script a GPU lease runs is known to work before device time is spent on it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from conftest import REPO


def test_gpu_loop_dry_run_measures_traces_calibrates_replays_and_tabulates(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_loop.sh", str(out), "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable,
                               "WORKLOADS": "long dynasor"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "calibrate.log").read_text().splitlines()[-1])["output"]
    for step in ("ceilings", "grid", "calibrate", "sim-long", "live-long-1", "live-long-2",
                 "validate-long-1", "validate-long-2", "probes", "dynasor-1", "dynasor-2"):
        assert f"== {step}: rc=0" in proc.stdout, proc.stdout[-3000:]
    ceilings = json.loads((out / "ceilings.json").read_text())
    assert ceilings["device"] == "cpu" and ceilings["copy_bytes_per_s"] > 0
    assert ceilings["graphs_tokens_equal"] is True
    assert {(d["mode"], d["batch"]) for d in ceilings["decode"]} == {
        (m, b) for m in ("per-prompt", "serving", "serving-graphs") for b in (1, 4)}
    loop = json.loads((out / "loop.json").read_text())
    assert {r["metric"] for r in loop["rows"] if r["workload"] == "long"} == {
        "e2e_s.p50", "e2e_s.p90", "ttft_s.p50", "tpot_s.p50", "tpot_s.p90", "throughput_tok_s"}
    for r in loop["rows"]:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("sim", "live_1", "live_2"))
        assert math.isclose(r["err_1"], r["sim"] / r["live_1"] - 1, rel_tol=1e-9)
    assert {r["workload"] for r in loop["rows"]} == {"long", "dynasor"}
    programs = [r for r in loop["rows"] if r["workload"] == "dynasor"]
    assert [r["metric"] for r in programs] == ["program_latency_s.p50", "program_latency_s.p90",
                                               "program_latency_s.mean"]
    # the torch engine reproduces its own probes trace: the simulator's decisions, live
    assert programs[0]["decision_agreement"] == [1.0, 1.0]
    assert "| long | e2e_s.p50 |" in (out / "loop.md").read_text()
    assert (out / "traces.tar.gz").stat().st_size > 0

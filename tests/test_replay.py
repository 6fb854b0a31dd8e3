"""Live replay on the real vLLM engine (CPU build) and sim-vs-live validation of the same workload."""

from __future__ import annotations

import json
import math

import pytest

from conftest import REPO, run_cli
from traces import check_trace, read_run, read_table

pytestmark = pytest.mark.engine


def test_replay_then_validate(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text((REPO / "examples" / "replay-small.yaml").read_text()
                   .replace("../sim/data", str(REPO / "sim" / "data")))
    live, sim = tmp_path / "live", tmp_path / "sim"
    run_cli("replay", str(cfg), "-o", str(live), "-q")
    run_cli("simulate", str(cfg), "-o", str(sim), "--json")
    assert check_trace(live) == [] and check_trace(sim) == []
    assert read_run(live)["kind"] == "replay" and read_run(sim)["kind"] == "sim"
    lr, sr = read_table(live, "requests").to_pandas(), read_table(sim, "requests").to_pandas()
    # Same workload: same ids, prompt and output lengths, arrivals.
    m = lr.merge(sr, on="request_id", suffixes=("_live", "_sim"))
    assert len(m) == 60
    assert (m.prompt_tokens_live == m.prompt_tokens_sim).all()
    assert (m.output_tokens_live == m.output_tokens_sim).all()
    assert (m.arrival_s_live - m.arrival_s_sim).abs().max() < 1e-6
    rows = json.loads(run_cli("validate", str(sim), str(live), "-o", str(tmp_path / "v"),
                              "--json").stdout)
    assert {"ttft_s.p50", "tpot_s.p90", "e2e_s.p99", "throughput_tok_s"} <= set(rows)
    for v in rows.values():
        assert math.isfinite(v["sim"]) and math.isfinite(v["live"]) and v["live"] > 0
    # Throughput is set by the arrivals at moderate load, so it must agree even on a noisy box.
    assert abs(rows["throughput_tok_s"]["rel_err"]) < 0.3
    assert (tmp_path / "v" / "validate_cdf.png").stat().st_size > 0


def test_replay_refuses_multi_replica_config(tmp_path):
    proc = run_cli("replay", str(REPO / "examples" / "demo.yaml"), "-o", str(tmp_path / "x"),
                   check=False)
    assert proc.returncode == 2 and "live replay drives one engine" in proc.stderr

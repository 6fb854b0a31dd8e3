"""Uncertainty bands: noise draws over one fixed workload; validate says if live is inside."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import yaml

from conftest import REPO, run_cli
from sim.bands import bands
from sim.config import parse_config
from sim.simulate import simulate

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
CONFIG = {"seed": 3, "workload": {"arrival": {"kind": "gamma", "rate_per_s": 20, "cv": 2.0},
                                  "num_requests": 120,
                                  "prompt_tokens": {"kind": "uniform", "low": 16, "high": 300},
                                  "output_tokens": {"kind": "uniform", "low": 8, "high": 100}},
          "cluster": {"replicas": [{"calibration": str(CAL), "count": 2}]}}


def test_noise_seeds_change_latency_not_workload_or_routing():
    cfg = replace(parse_config(CONFIG), latency="sampled")
    a, b = (simulate(replace(cfg, noise_seed=k)).requests.to_pandas() for k in (0, 1))
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.allclose(a.finish_s, b.finish_s)
    again = simulate(replace(cfg, noise_seed=1)).requests.to_pandas()
    assert again.equals(b)


def test_bands_bracket_the_mean_run_and_widen_with_the_percentile():
    cfg = parse_config(CONFIG)
    band = bands(cfg, 16)["metrics"]
    wide = bands(cfg, 16, band=(0.0, 1.0))["metrics"]
    for m in ("e2e_s.p50", "tpot_s.p50", "ttft_s.p90"):
        assert band[m]["lo"] < band[m]["hi"], m
        assert wide[m]["lo"] <= band[m]["lo"] and band[m]["hi"] <= wide[m]["hi"], m


def test_simulate_seeds_writes_bands_and_validate_reports_live_inside_or_not(tmp_path):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    proc = run_cli("simulate", str(cfg_path), "-o", str(tmp_path / "sim"), "--seeds", "12",
                   "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    lo, hi = summary["band_e2e_s.p50"]
    assert lo < hi
    assert json.loads((tmp_path / "sim" / "bands.json").read_text())["seeds"] == 12
    # A stand-in for a live run with the same requests: another draw of the noise (seed 3).
    d = dict(CONFIG, latency="sampled")
    other = tmp_path / "o.yaml"
    other.write_text(yaml.safe_dump(d))
    run_cli("simulate", str(other), "-o", str(tmp_path / "draw"))
    out = json.loads(run_cli("validate", str(tmp_path / "sim"), str(tmp_path / "draw"),
                             "-o", str(tmp_path / "v"), "--json").stdout.strip().splitlines()[-1])
    m = out["metrics"]
    assert all("in_band" in m[k] for k in ("e2e_s.p50", "tpot_s.p50", "throughput_tok_s"))
    assert sum(m[k]["in_band"] for k in ("e2e_s.mean", "tpot_s.mean", "tpot_s.p50")) >= 2
    assert run_cli("simulate", str(cfg_path), "--seeds", "1", check=False).returncode == 2


def test_a_band_needs_two_to_ten_thousand_draws_and_says_so_before_simulating():
    from conftest import REPO, run_cli

    for n in ("1", "99999999999999999999"):
        proc = run_cli("simulate", str(REPO / "examples" / "replay-small.yaml"), "--seeds", n,
                       check=False, timeout=60)
        assert proc.returncode == 2 and f"--seeds {n}: a band needs 2 to 10000" in proc.stderr
        assert "pool target" not in proc.stdout  # refused before the simulation started

"""`reasonsim calibrate`: fit the latency model from steps traces, report held-out error.

The artifact is one versioned JSON file with provenance (traces, runs, engine, device, engine
limits), the coefficients, the residual distribution and the held-out error. Held-out rows are
whole grid cells the fit never saw (group split), so the error measures generalisation to new
shapes, not interpolation between neighbouring iterations.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.latency import FEATURES, LatencyModel, errors, fit
from traces import read_run, read_table

CALIBRATION_VERSION = 1
HELDOUT_FRACTION = 0.25


@dataclass(frozen=True)
class Calibration:
    """A fitted latency model with the engine limits and provenance of the traces it came from."""

    latency: LatencyModel
    """per-iteration latency model"""
    max_num_seqs: int
    """engine's max sequences per iteration when traced"""
    max_num_batched_tokens: int
    """engine's token budget per iteration when traced"""
    block_size: int
    """KV block size in tokens"""
    kv_blocks_total: int
    """KV blocks available when traced"""
    provenance: dict
    """traces, run ids, engine, device, model"""
    heldout: dict
    """held-out error (fractions)"""

    def to_json(self) -> dict:
        """The artifact as a JSON-ready dict."""
        return {"version": CALIBRATION_VERSION, "kind": "reasonsim.calibration",
                "features": list(FEATURES), "coef_ms": list(self.latency.coef_ms),
                "residual_log_quantiles": list(self.latency.residual_log_quantiles),
                "engine_limits": {"max_num_seqs": self.max_num_seqs,
                                  "max_num_batched_tokens": self.max_num_batched_tokens,
                                  "block_size": self.block_size,
                                  "kv_blocks_total": self.kv_blocks_total},
                "provenance": self.provenance, "heldout": self.heldout}


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration artifact."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable calibration file ({e})") from None
    if d.get("kind") != "reasonsim.calibration" or d.get("version") != CALIBRATION_VERSION:
        raise ValueError(f"{path}: not a version-{CALIBRATION_VERSION} reasonsim calibration")
    if d.get("features") != list(FEATURES):
        raise ValueError(f"{path}: features {d.get('features')} differ from {list(FEATURES)}")
    lim = d["engine_limits"]
    return Calibration(LatencyModel(tuple(d["coef_ms"]), tuple(d["residual_log_quantiles"])),
                       int(lim["max_num_seqs"]), int(lim["max_num_batched_tokens"]),
                       int(lim["block_size"]), int(lim["kv_blocks_total"]), d["provenance"],
                       d["heldout"])


def _heldout_mask(cells: pd.Series, seed: int) -> np.ndarray:
    # Deterministic group split by cell id hash (same cells held out on every machine).
    def bucket(c: str) -> float:
        return int(hashlib.sha256(f"{seed}:{c}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return cells.fillna("none").map(bucket).to_numpy() < HELDOUT_FRACTION


def calibrate(trace_dirs: list[str | Path], seed: int = 0) -> Calibration:
    """Fit on the non-warm-up steps of the traces; evaluate on held-out cells."""
    t0 = time.perf_counter()
    frames, runs = [], []
    for d in trace_dirs:
        run = read_run(d)
        steps = read_table(d, "steps").to_pandas()
        if steps.empty:
            raise ValueError(f"{d}: steps table is empty; nothing to calibrate")
        runs.append((str(d), run))
        frames.append(steps)
    keys = {(r["engine"], r["device"], r["model_config_hash"], r["dtype"]) for _, r in runs}
    if len(keys) != 1:
        raise ValueError(f"traces mix engines/devices/models {sorted(keys)}: calibrate each "
                         "model/device separately")
    steps = pd.concat(frames, ignore_index=True)
    steps = steps[~steps.is_warmup & (steps.duration_ms > 0)]
    held = _heldout_mask(steps.cell_id, seed)
    if held.all() or not held.any():  # a single cell: fall back to a row split
        held = np.random.default_rng(seed).random(len(steps)) < HELDOUT_FRACTION
    train, test = steps[~held], steps[held]
    cols = ["prefill_tokens", "decode_seqs", "context_tokens"]
    model = fit(*(train[c] for c in cols), train.duration_ms)
    heldout = errors(model, *(test[c] for c in cols), test.duration_ms)
    heldout["train_rows"] = int(len(train))
    for phase, mask in (("decode", test.prefill_tokens == 0), ("prefill", test.prefill_tokens > 0)):
        if mask.any():
            heldout[phase] = errors(model, *(test[mask][c] for c in cols),
                                    test[mask].duration_ms)
    run0 = runs[0][1]
    eng = run0["params"].get("engine", {})
    provenance = {"traces": [d for d, _ in runs], "run_ids": [r["run_id"] for _, r in runs],
                  "engine": run0["engine"], "engine_version": run0["engine_version"],
                  "device": run0["device"], "device_count": run0["device_count"],
                  "model_id": run0["model_id"], "model_config_hash": run0["model_config_hash"],
                  "dtype": run0["dtype"], "kv_cache_gb": eng.get("kv_cache_gb"),
                  "fit_s": round(time.perf_counter() - t0, 3)}
    return Calibration(model, int(eng.get("max_num_seqs", 256)),
                       int(eng.get("max_num_batched_tokens", 2048)),
                       int(eng.get("block_size", 16)), int(eng.get("kv_blocks_total", 10_000)),
                       provenance, heldout)

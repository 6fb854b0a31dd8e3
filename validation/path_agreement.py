"""Every simulation path on one config, results compared: the compiled kernels, the SimPy fast
path, the reference replica (one event per iteration) and the replica vLLM's own scheduler
composes (`scheduler: vllm`, `validation.vllm_replica`).

A path that composes the same steps prices them with the same step-time model, so its requests
and programs match the reference's: the same decisions, and times equal to the sums' rounding
(a fast-forwarded run of k iterations is priced as one sum). A difference in composition shows
here as differing times, cached tokens or decisions.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

PATHS = ("compiled", "simpy", "reference", "vllm")
TIME_COLUMNS = ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "deadline_s")
SAME_S = 1e-9
"""times equal to a sum's rounding"""


def run_paths(d: dict, base_dir: str | Path, paths: tuple[str, ...] = PATHS) -> dict:
    """path -> (its `SimResult`, CPU seconds) on config mapping `d`."""
    from sim.config import parse_config
    from sim.simulate import simulate
    from validation.vllm_replica import register

    register()
    out = {}
    for path in paths:
        dd = copy.deepcopy(d)
        for g in dd["cluster"]["replicas"]:
            g["scheduler"] = "vllm" if path == "vllm" else "reasonsim"
        cfg = parse_config(dd, base_dir)
        cpu0 = time.process_time()
        res = simulate(cfg, fast_forward=path in ("compiled", "simpy"),
                       compiled=path == "compiled")
        out[path] = (res, time.process_time() - cpu0)
    return out


def compare(results: dict, against: str = "reference") -> dict:
    """Per path, against one: the largest time difference (s) in the requests and programs
    tables, and whether every other column (decisions, tokens, cached tokens) is equal."""
    ref = _tables(results[against][0])
    out = {}
    for path, (res, cpu_s) in results.items():
        diff_s, same = 0.0, True
        for name, table in _tables(res).items():
            for col, base in ref[name].items():
                a, b = table[col], base
                if len(a) != len(b):
                    diff_s, same = float("inf"), False
                elif col in TIME_COLUMNS:
                    gap = _gap(a, b)
                    diff_s = max(diff_s, gap)
                    same &= not np.isinf(gap)
                else:
                    same &= a.dtype == b.dtype and bool(np.all((a == b) | _both_nan(a, b)))
        out[path] = {"max_time_diff_s": diff_s, "same_decisions": same, "cpu_s": cpu_s,
                     "requests": len(res.requests), "agrees": same and diff_s <= SAME_S}
    return out


def _tables(res) -> dict[str, dict[str, np.ndarray]]:
    """The requests (by request id) and programs tables as column arrays."""
    out = {}
    for name in ("requests", "programs"):
        table = getattr(res, name)
        if table is None:
            continue
        key = "request_id" if name == "requests" else "program_id"
        table = table.sort_by(key)
        out[name] = {c: np.asarray(table.column(c).to_numpy(zero_copy_only=False))
                     for c in table.column_names}
    return out


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b|, NaN where both are; inf where only one is."""
    a, b = a.astype(float), b.astype(float)
    if len(a) != len(b) or not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf")
    both = ~np.isnan(a)
    return float(np.max(np.abs(a[both] - b[both]), initial=0.0))


def _both_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        return np.zeros(len(a), dtype=bool)
    return np.isnan(a) & np.isnan(b)

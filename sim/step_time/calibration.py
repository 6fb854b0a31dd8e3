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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.step_time import registry as step_time
from sim.step_time.host_time import fit_host_ms, with_step_gap
from sim.step_time.latency import LatencyModel
from sim.step_time.live_speed import probe_reference
from sim.step_time.logprob_cost import (MIN_PLAIN_STEPS, attach_logprobs, fit_logprob_cost,
                                        logprob_ms)
from sim.step_time.sampling_cost import MIN_STEPS, attach_seeded, fit_seeded_cost, seeded_ms
from sim.step_time.serving_features import with_profiled
from sim.step_time.serving_latency import ServingModel  # noqa: F401 (registers `serving`)
from traces import read_run, read_table
from traces.manifest import check_sealed

CALIBRATION_VERSION = 2
"""2: the step-time model is named (`step_time_model: {kind, version, ...}`); 1: linear only."""
HELDOUT_FRACTION = 0.25


@dataclass(frozen=True)
class Calibration:
    """A fitted latency model with the engine limits and provenance of the traces it came from."""

    latency: step_time.StepTimeModel
    """per-iteration step-time model"""
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
    max_model_len: int | None = None
    """longest prompt + output the traced engine accepts (None: not recorded)"""
    add_request_ms: float = 0.0
    """host time per request added between steps (input processing) in an in-process engine
    loop: it delays the replica's next step (on a shared device, `sim.engine.cluster.Device`, the
    device's); 0: not measured (`sim.step_time.host_time.fit_host_ms`)"""
    logprob_token_ms: float = 0.0
    """step time per log-probability position returned (`sim.step_time.logprob_cost`; 0: not
    measured)"""
    logprob_top_k_ms: float = 0.0
    """and per top-k entry of those positions"""
    wake_ms: float = 0.0
    """host time before the first step after the loop sat idle (it wakes for an arrival);
    0: not measured"""
    logprob_step_ms: float = 0.0
    """step time of a step that returns any log-probabilities, once
    (`sim.step_time.logprob_cost`)"""
    seeded_step_ms: float = 0.0
    """step time of a step with any sequence sampling with a seed, once
    (`sim.step_time.sampling_cost`)"""
    seeded_seq_ms: float = 0.0
    """and per such sequence"""
    add_next_ms: float | None = None
    """host time per further request added in the same gap (None: as `add_request_ms`)"""
    step_gap_ms: float = 0.0
    """host time between every two steps of the loop (`sim.step_time.host_time`; 0: not measured)"""

    @property
    def add_more_ms(self) -> float:
        """Host time of a request added after another in the same gap."""
        return self.add_request_ms if self.add_next_ms is None else self.add_next_ms

    @property
    def stepping(self) -> step_time.StepTimeModel:
        """The step-time model a replica steps with: the loop's gap between steps included."""
        return with_step_gap(self.latency, self.step_gap_ms)

    def to_json(self) -> dict:
        """The artifact as a JSON-ready dict."""
        return {"version": CALIBRATION_VERSION, "kind": "reasonsim.calibration",
                "step_time_model": step_time.to_json(self.latency),
                "engine_limits": {"max_num_seqs": self.max_num_seqs,
                                  "max_num_batched_tokens": self.max_num_batched_tokens,
                                  "block_size": self.block_size,
                                  "kv_blocks_total": self.kv_blocks_total,
                                  "max_model_len": self.max_model_len},
                "provenance": self.provenance, "heldout": self.heldout,
                "host": {"add_request_ms": self.add_request_ms,
                         "logprob_token_ms": self.logprob_token_ms,
                         "logprob_top_k_ms": self.logprob_top_k_ms,
                         "logprob_step_ms": self.logprob_step_ms, "wake_ms": self.wake_ms,
                         "seeded_step_ms": self.seeded_step_ms,
                         "seeded_seq_ms": self.seeded_seq_ms,
                         **({"add_next_ms": self.add_next_ms}
                            if self.add_next_ms is not None else {}),
                         "step_gap_ms": self.step_gap_ms}}


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration artifact."""
    path = Path(path)
    try:
        d = json.loads(path.read_text(), object_pairs_hook=unique_keys)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable calibration file ({e})") from None
    except ValueError as e:  # a duplicate key: the last would silently win
        raise ValueError(f"{path}: {e}") from None
    from sim.config_schema import HostSpec, validate_calibration

    if not isinstance(d, dict) or d.get("kind") != "reasonsim.calibration" or \
            d.get("version") not in (1, CALIBRATION_VERSION):
        raise ValueError(f"{path}: not a version-1 or -{CALIBRATION_VERSION} reasonsim "
                         "calibration")
    try:
        spec = validate_calibration(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if d["version"] == 1:  # version 1 held the linear model's fields at the top level
        model_json = {"kind": LatencyModel.kind, "version": LatencyModel.version,
                      **{k: d.get(k) for k in ("features", "coef_ms", "residual_log_quantiles")}}
    else:
        model_json = d.get("step_time_model") or {}
    if not isinstance(model_json, dict):
        raise ValueError(f"{path}: step_time_model: expected a mapping")
    model = step_time.from_json(model_json, f"{path}: step_time_model")
    lim = spec.engine_limits
    host = spec.host or HostSpec()
    return Calibration(model, lim.max_num_seqs, lim.max_num_batched_tokens, lim.block_size,
                       lim.kv_blocks_total, dict(d["provenance"]), spec.heldout,
                       lim.max_model_len,
                       host.add_request_ms, host.logprob_token_ms, host.logprob_top_k_ms,
                       host.wake_ms, host.logprob_step_ms, host.seeded_step_ms,
                       host.seeded_seq_ms, host.add_next_ms, host.step_gap_ms)


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's mapping; a key given twice is an error (json keeps the last)."""
    d: dict = {}
    for key, value in pairs:
        if key in d:
            raise ValueError(f"duplicate key {key!r}")
        d[key] = value
    return d


def fingerprint(provenance: dict) -> dict:
    """What a calibration's timings belong to: device and count, engine and version, model."""
    return {k: provenance.get(k) for k in ("device", "device_count", "engine", "engine_version",
                                           "model_config_hash", "dtype")}


def _heldout_mask(cells: pd.Series, seed: int) -> np.ndarray:
    # Deterministic group split by cell id hash (same cells held out on every machine).
    def bucket(c: str) -> float:
        return int(hashlib.sha256(f"{seed}:{c}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return cells.fillna("none").map(bucket).to_numpy() < HELDOUT_FRACTION


def breakdown(steps: pd.DataFrame) -> dict[str, pd.Series]:
    """Row masks by step kind (decode-only, prefill-only, mixed), by sequences per step and,
    where the steps say, by sampling regime (greedy, seeded, log-probabilities)."""
    p, d = steps.prefill_tokens, steps.decode_seqs
    seqs = steps.prefill_seqs + d
    out = {"decode": p == 0, "prefill": (p > 0) & (d == 0), "mixed": (p > 0) & (d > 0),
           "seqs_1": seqs <= 1, "seqs_2_4": (seqs >= 2) & (seqs <= 4),
           "seqs_5_16": (seqs >= 5) & (seqs <= 16), "seqs_17_plus": seqs >= 17}
    if "seeded_seqs" in steps and "logprob_tokens" in steps:
        lp, seeded = steps.logprob_tokens > 0, steps.seeded_seqs > 0
        out |= {"greedy": ~lp & ~seeded, "seeded": ~lp & seeded, "logprobs": lp}
    return out


def speculative_steps(d, run: dict, steps: pd.DataFrame, spec_k: int | None
                      ) -> tuple[pd.DataFrame, str | None]:
    """A trace's steps to fit for `spec_k` (None: plain decoding), and its draft model; a clear
    error where the trace's decoding is not the one asked for."""
    engine = run["params"].get("engine", {})
    if run["kind"] == "spec":  # one engine per K, in cells k{K}-...
        if spec_k is None:
            raise ValueError(f"{d}: a spec trace (speculative steps at K = "
                             f"{run['params']['workload']['k_values']}): calibrate --spec-k K")
        keep = steps.cell_id.fillna("").str.startswith(f"k{spec_k}-")
        if not keep.any():
            raise ValueError(f"{d}: no steps at K = {spec_k}")
        return steps[keep], run["params"]["draft"]["model_id"]
    spec = engine.get("speculative")
    k = spec["k"] if spec else None
    if k != spec_k:
        raise ValueError(f"{d}: its engine decoded " + (f"speculatively at K = {k}" if k else
                         "without speculation") + (f", not at K = {spec_k}" if spec_k else
                                                   "; calibrate without --spec-k or with it"))
    return steps, spec["draft_model_id"] if spec else None


def _read_steps(trace_dirs: list, spec_k: int | None) -> tuple[list, list, set]:
    """Each trace's steps (spec steps at K where asked), its (dir, run) and the drafts seen."""
    frames, runs, drafts = [], [], set()
    seen: dict[str, str] = {}
    for d in trace_dirs:
        check_sealed(d)
        run = read_run(d)
        if run["kind"] == "sim":  # a simulation's steps are its calibration's, not a device's
            raise ValueError(f"{d}: a simulation's output (runs kind 'sim'); calibrate on "
                             "traces of a real engine")
        if run["run_id"] in seen:  # its steps would count twice
            raise ValueError(f"{d}: the same run as {seen[run['run_id']]} (run "
                             f"{run['run_id']}); give each trace once")
        seen[run["run_id"]] = str(d)
        if run["kind"] == "exits":  # steps at several loaded depths: one linear fit is wrong
            raise ValueError(f"{d}: an exits trace (steps at several loaded depths); a helios: "
                             "config fits its per-layer step time (sim/step_time/layered.py)")
        # a profiled grid's steps run faster than serving ones of their shape (`profiled_ms`)
        steps = with_profiled(read_table(d, "steps").to_pandas(), run["kind"])
        steps, draft = speculative_steps(d, run, steps, spec_k)
        drafts.add(draft)
        if steps.empty:
            raise ValueError(f"{d}: steps table is empty; nothing to calibrate")
        runs.append((str(d), run))
        frames.append(steps)
    return frames, runs, drafts


ENGINE_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks_total")
"""the engine limits every calibrated trace records, equal across the traces (`max_model_len`
may differ: a live replay's engine is sized to its workload; the calibration keeps the longest)"""


def _engine_limits(runs: list) -> dict:
    """The engine limits of each trace, which must agree, as must engine, device and model."""
    # the torch engine's modes compose or run steps differently (`TorchSpec.serving`, `graphs`)
    keys = {(r["engine"], r["device"], r["model_config_hash"], r["dtype"],
             r["params"].get("engine", {}).get("serving"),
             r["params"].get("engine", {}).get("graphs")) for _, r in runs}
    if len(keys) != 1:
        raise ValueError(f"traces mix engines/devices/models {sorted(keys)}: calibrate each "
                         "model/device separately")
    limits = {d: {k: r["params"].get("engine", {}).get(k) for k in ENGINE_LIMITS}
              for d, r in runs}
    for d, lim in limits.items():
        missing = [k for k in ENGINE_LIMITS if not isinstance(lim[k], int) or lim[k] < 1]
        if missing:  # a calibration carries the limits the engine ran with, never a guess
            raise ValueError(f"{d}: its runs table records no engine {missing[0]} "
                             "(params.engine): not a trace calibrate can read limits from")
    if len({json.dumps(v, sort_keys=True) for v in limits.values()}) > 1:
        (a, la), *rest = limits.items()
        b, lb = next((d, lim) for d, lim in rest if lim != la)  # one that differs
        raise ValueError(f"traces ran with different engine limits ({a}: {la}; {b}: {lb}): "
                         "calibrate each engine configuration separately")
    return limits


def _max_model_len(runs: list) -> int | None:
    """The longest `max_model_len` the traces' engines ran with (None where none records one),
    whatever the traces' order."""
    lens = [r["params"].get("engine", {}).get("max_model_len") for _, r in runs]
    return max((int(n) for n in lens if n), default=None)


def _seeded_term(steps: pd.DataFrame) -> tuple[pd.DataFrame, tuple[float, float], str]:
    """Seeded sampling's own term, fitted on every step and taken out of their durations."""
    cost = fit_seeded_cost(steps)
    note = "fitted" if (steps.seeded_seqs > 0).any() else "no seeded grid steps"
    if cost is None:
        note = (f"not separable: under {MIN_STEPS} seeded steps with a greedy twin; the step "
                "time holds their cost")
        cost = (0.0, 0.0)
    if any(cost):
        steps = steps.assign(duration_ms=steps.duration_ms.to_numpy()
                             - seeded_ms(steps.seeded_seqs, cost))
    return steps, cost, note


def _logprob_term(steps: pd.DataFrame, held: np.ndarray, kind: type, without: tuple) -> tuple:
    """Returned log-probabilities' own term, fitted and taken out of the steps' durations:
    (steps, held, cost, note, steps with any, steps left out as dominated by it)."""
    cost = fit_logprob_cost(steps, lambda rows: kind.fit_steps(rows, without=without),
                            lambda m, rows: m.predict_steps(rows) * m.residual_sampler()[0])
    note = "fitted" if (steps.logprob_tokens > 0).any() else "none returned"
    if cost is None:
        note = (f"not separable: under {MIN_PLAIN_STEPS} steps without log-probabilities; the "
                "step time holds their cost, for traffic like this only")
        cost = (0.0, 0.0, 0.0)
    with_lp, dominated = int((steps.logprob_tokens > 0).sum()), 0
    if any(cost):
        # A step whose term is over half its time leaves a small difference of two large
        # numbers as its own time: a relative-error fit would chase it, so it is left out.
        lp_ms = logprob_ms(steps, cost)
        keep = lp_ms <= 0.5 * steps.duration_ms.to_numpy()
        dominated = int((~keep).sum())
        own_ms = steps.duration_ms.to_numpy() - lp_ms
        steps, held = steps[keep].assign(duration_ms=own_ms[keep]), held[keep]
    return steps, held, cost, note, with_lp, dominated


def _heldout_errors(kind: type, steps: pd.DataFrame, held: np.ndarray, without: tuple) -> dict:
    """The error of a fit without the held-out steps on them, whole and by breakdown."""
    train, test = steps[~held], steps[held]
    fitted = kind.fit_steps(train, without=without)
    heldout = fitted.step_errors(test) | {"train_rows": int(len(train))}
    for name, mask in breakdown(test).items():
        if mask.any():
            heldout[name] = fitted.step_errors(test[mask])
    return heldout


def calibrate(trace_dirs: list[str | Path], seed: int = 0, model: str = "serving",
              spec_k: int | None = None, seeded_term: bool = True,
              without: tuple[str, ...] = ()) -> Calibration:
    """Fit a step-time model (a kind `step_time.fitter` finds: `serving` or `linear`) on the
    traces' steps; evaluate on held-out cells or runs. `spec_k`: fit the spec-decoding steps of
    K speculative tokens; `seeded_term=False`: no seeded-sampling term (an ablation,
    `benchmarks/sampling_terms.py`); `without`: model terms fitted at 0 (an ablation,
    `fidelity_offline.py`)."""
    t0 = time.perf_counter()
    kind = step_time.fitter(model)
    frames, runs, drafts = _read_steps(trace_dirs, spec_k)
    limits = _engine_limits(runs)
    steps = attach_seeded(attach_logprobs(pd.concat(frames, ignore_index=True), trace_dirs),
                          [r for _, r in runs] if seeded_term else [],
                          trace_dirs if seeded_term else [])
    steps = kind.usable_steps(steps, trace_dirs)
    if steps.empty:
        raise ValueError(f"{', '.join(str(d) for d in trace_dirs)}: every step is a warm-up "
                         "step (or has no duration): nothing to calibrate on")
    # Held out: whole grid cells, or whole runs for steps without cells (live replays, served
    # runs), so the error measures new shapes or new runs, not neighbouring iterations.
    held = _heldout_mask(steps.cell_id.fillna(steps.run_id), seed)
    if held.all() or not held.any():  # a single cell or run: fall back to a row split
        held = np.random.default_rng(seed).random(len(steps)) < HELDOUT_FRACTION
    # Seeded sampling and returned log-probabilities carry terms of their own, taken out of
    # the durations (seeded first: a grid's log-probability steps sample with seeds too), so
    # the step-time model sees the step alone.
    steps, seeded_cost, seeded_note = _seeded_term(steps)
    seeded_steps = int((steps.seeded_seqs > 0).sum())  # what the term was fitted on
    steps, held, lp_cost, lp_note, lp_steps, lp_dominated = _logprob_term(steps, held, kind,
                                                                          without)
    heldout = _heldout_errors(kind, steps, held, without)
    # The held-out error measures the fit on steps it never saw; the calibration itself is
    # then fitted on every step (with few runs a held-out run may be a whole regime).
    fitted = kind.fit_steps(steps, without=without)
    eng = runs[0][1]["params"].get("engine", {})
    # The in-process replay loop's host time, from the live replays among the traces.
    host = fit_host_ms([d for d, r in runs if r["kind"] == "replay"])
    terms = {"logprob_steps": lp_steps, "logprob_cost": lp_note,
             "logprob_dominated_steps": lp_dominated,
             "seeded_steps": seeded_steps, "seeded_cost": seeded_note}
    provenance = _provenance(runs, limits, model, terms, probe_reference(trace_dirs), spec_k,
                             drafts) | {"fit_s": round(time.perf_counter() - t0, 3)}
    return Calibration(fitted, *(int(eng[k]) for k in ENGINE_LIMITS), provenance, heldout,
                       _max_model_len(runs),
                       logprob_token_ms=lp_cost[1], logprob_top_k_ms=lp_cost[2],
                       logprob_step_ms=lp_cost[0], seeded_step_ms=seeded_cost[0],
                       seeded_seq_ms=seeded_cost[1], **asdict(host))


def torch_mode(engine_params: dict) -> str:
    """The PyTorch engine's mode a trace ran in: per-prompt, serving, or serving-graphs."""
    if not engine_params.get("serving"):
        return "per-prompt"
    return "serving-graphs" if engine_params.get("graphs") else "serving"


def _provenance(runs: list, limits: dict, model: str, terms: dict, reference: dict | None,
                spec_k: int | None, drafts: set) -> dict:
    """Where a calibration came from: traces, runs, engine, device, model, what it fitted."""
    run0, eng = runs[0][1], runs[0][1]["params"].get("engine", {})
    return {"traces": [d for d, _ in runs], "run_ids": [r["run_id"] for _, r in runs],
            "engine": run0["engine"], "engine_version": run0["engine_version"],
            "device": run0["device"], "device_count": run0["device_count"],
            "model_id": run0["model_id"], "model_config_hash": run0["model_config_hash"],
            "dtype": run0["dtype"], "kv_cache_gb": eng.get("kv_cache_gb"),
            "engine_limits": limits[runs[0][0]],
            **({"engine_mode": torch_mode(eng),
                "load_format": run0.get("load_format")} if run0["engine"] == "torch" else {}),
            # the sampling settings the source steps ran with, per trace kind: what regimes
            # the fit has seen ("unrecorded" for traces older than the field)
            "sampling_regimes": sorted({json.dumps({"kind": r["kind"], **r["params"].get(
                "sampling", {"sampling": "unrecorded"})}, sort_keys=True) for _, r in runs}),
            "step_time_model": model, **terms,
            "fitted_on": "every step; heldout_* from a fit without the held-out ones",
            # the machine's speed when traced, model-free: live runs' probes against it
            **({"speed_probe_ms": reference} if reference else {}),
            **({"speculative": {"k": spec_k, "method": "draft_model",
                                "draft_model_id": sorted(drafts)}} if spec_k else {})}

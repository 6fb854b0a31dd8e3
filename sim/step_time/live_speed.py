"""A live run's step speed against a calibration, and a calibration scaled to that speed.

A shared machine's speed drifts between the runs a calibration was fitted on and the live runs
it is validated against. The ratio of live step time to the calibration's prediction for the
same steps measures that level; re-simulating with the step times scaled by it gives the error of
everything else in the model (scheduling, queueing, acceptance, step counts) at the machine's
speed of the moment. Such an error is reported beside the raw one, never instead of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.step_time import latency, layered, serving_latency  # noqa: F401  (the kinds register)
from sim.step_time import serving_features
from sim.step_time import registry as step_time
from sim.step_time.logprob_cost import attach_logprobs, logprob_ms
from sim.step_time.sampling_cost import attach_seeded, seeded_ms
from traces import read_run, read_table

# Every term of a step-time model that is a time (linear and serving: coef_ms; layered: the rest)
_MS_KEYS = ("coef_ms", "fixed_ms", "layer_ms", "prefill_seq_ms")
# ... and the calibration's step-time terms outside the model: log-probability rows (the first
# three, in `logprob_ms`'s order), seeded sampling
_HOST_MS_KEYS = ("logprob_step_ms", "logprob_token_ms", "logprob_top_k_ms", "seeded_step_ms",
                 "seeded_seq_ms")


def own_level(model) -> float:
    """Where the calibration's own steps ran against its model's prediction: their median
    ratio (the median of the model's residual quantiles; 1 without them). The fit sits below
    its steps' median (relative least squares weights fast steps most), and the simulator
    charges the residuals' mean on top of the prediction, so a speed level is read against
    this, not against the bare prediction."""
    q = getattr(model, "residual_log_quantiles", None)
    return float(np.exp(np.median(q))) if q is not None and len(q) else 1.0


def live_over_predicted(model, steps: pd.DataFrame,
                        logprob_cost: tuple[float, float, float] = (0.0, 0.0, 0.0),
                        seeded_cost: tuple[float, float] = (0.0, 0.0),
                        ) -> tuple[np.ndarray, pd.DataFrame]:
    """Live step time over the model's prediction, per step, as a speed level against the
    calibration's own steps (`own_level`: 1 is the speed they ran at); the steps compared
    (warm-up steps dropped unless the model prices first-of-shape steps itself). With `logprob_cost`
    (a calibration's per-step, per-row and per-top-k ms) and the steps' log-probability rows
    (`sim.step_time.logprob_cost.attach_logprobs`), and with `seeded_cost` and the steps'
    `seeded_seqs`,
    the prediction includes what the simulator charges for them."""
    if getattr(model, "engine_state", False):  # first-of-shape and after-idle features
        steps = serving_features.engine_features(steps)
        pred = model.predict_ms(steps) if len(steps) else np.zeros(0)
    else:
        steps = steps[~steps.is_warmup]
        pred = np.array([model.step_ms(p, d, c) for p, d, c in zip(
            steps.prefill_tokens, steps.decode_seqs, steps.context_tokens)])
    if any(logprob_cost) and "logprob_tokens" in steps and len(steps):
        pred = pred + logprob_ms(steps, logprob_cost)
    if any(seeded_cost) and "seeded_seqs" in steps and len(steps):
        pred = pred + seeded_ms(steps.seeded_seqs, seeded_cost)
    return steps.duration_ms.to_numpy() / np.maximum(pred, 1e-9) / own_level(model), steps


def step_ratios(calibration: str | Path, steps_dir: str | Path, all_seeded: bool = False,
                ) -> tuple[np.ndarray, pd.DataFrame] | None:
    """Live step time over the calibration's prediction (its log-probability term included),
    per step an engine recorded under `steps_dir`, with the steps compared; None when it ran
    none. The seeded-sampling term is priced on the seeded sequences the engine recorded
    (`step_seeded`), or with `all_seeded` on every sequence where the trace predates that table
    (a Dynasor program replay: all sample with a seed)."""
    cal = json.loads(Path(calibration).read_text())
    steps = serving_features.with_profiled(read_table(steps_dir, "steps").to_pandas(),
                                           read_run(steps_dir)["kind"])
    if not len(steps):
        return None
    host = cal.get("host", {})
    cost = tuple(host.get(k, 0.0) for k in _HOST_MS_KEYS[:3])
    seeded = (host.get("seeded_step_ms", 0.0), host.get("seeded_seq_ms", 0.0))
    if any(cost):
        steps = attach_logprobs(steps, [steps_dir])
    steps = attach_seeded(steps, [], [steps_dir])  # the seeded sequences the engine recorded
    steps = serving_features.attach_spans(steps, [steps_dir])
    recorded = bool(steps.seeded_seqs.gt(0).any())
    if not recorded and all_seeded:
        steps = steps.assign(seeded_seqs=steps.decode_seqs + steps.prefill_seqs)
    return live_over_predicted(step_time.from_json(cal["step_time_model"]), steps, cost,
                               seeded if recorded or all_seeded else (0.0, 0.0))


def step_speed_ratio(calibration: str | Path, steps_dir: str | Path, all_seeded: bool = False,
                     decode_only: bool = False) -> float | None:
    """Median of `step_ratios` over every step an engine recorded under `steps_dir`
    (decode-only steps with `decode_only`); None when it ran none."""
    got = step_ratios(calibration, steps_dir, all_seeded)
    if got is None:
        return None
    ratio, steps = got
    if decode_only:
        return decode_median(ratio, steps)
    return float(np.median(ratio)) if len(ratio) else None


def decode_steps(steps) -> np.ndarray:
    """The mask of a steps table's decode-only steps (no prefill tokens, some decodes)."""
    return ((steps.prefill_tokens == 0) & (steps.decode_seqs > 0)).to_numpy()


def decode_median(ratio: np.ndarray, steps) -> float | None:
    """The median of per-step `ratio` over the decode-only steps; None without one (masked
    after the engine features, which read each step's predecessor)."""
    decode = decode_steps(steps)
    return float(np.median(ratio[decode])) if decode.any() else None


def scaled_calibration(calibration: str | Path, factor: float, out_path: Path,
                       prefill_factor: float | None = None) -> Path:
    """Write the calibration with its step times multiplied by `factor` to out_path; with
    `prefill_factor`, a serving model's prefill terms (`serving_features.PREFILL_FEATURES`) by
    that instead. Returns out_path made absolute: a config that names it resolves its own
    relative paths against its own directory, not the working directory out_path is under."""
    cal = json.loads(Path(calibration).read_text())
    model = cal["step_time_model"]
    keys = [k for k in _MS_KEYS if k in model]
    if not keys:
        raise ValueError(f"{calibration}: step-time model {model.get('kind')!r} has no "
                         f"millisecond coefficients ({', '.join(_MS_KEYS)}) to scale")
    if prefill_factor is not None and model.get("kind") != "serving":
        raise ValueError(f"{calibration}: only a serving model's prefill terms can be scaled "
                         f"apart, not a {model.get('kind')!r} model's")
    for k in keys:
        model[k] = [c * factor for c in model[k]]
    if "profiled_ms" in model:  # a serving model's profiled-grid term, a time too
        model["profiled_ms"] *= factor
    if prefill_factor is not None:
        model["coef_ms"] = [c / factor * prefill_factor
                            if name in serving_features.PREFILL_FEATURES else c
                            for name, c in zip(model["features"], model["coef_ms"])]
    for k in _HOST_MS_KEYS:  # step time too (the loop's host time is not)
        if k in cal.get("host", {}):
            cal["host"][k] *= factor
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(cal, indent=1) + "\n")
    return out_path.resolve()


def probe_shape(probe: pd.DataFrame) -> pd.Series:
    """Each probe step's shape key (prefill tokens, prefill sequences, decode sequences)."""
    return ("p" + probe.prefill_tokens.astype(str) + "s" + probe.prefill_seqs.astype(str)
            + "d" + probe.decode_seqs.astype(str))


def _repeats(probe: pd.DataFrame) -> np.ndarray:
    """Steps of a shape the phase ran before (the first of each: a shape the engine may
    never have run, whose kernels are built then)."""
    return probe.assign(key=probe_shape(probe)).duplicated(["phase", "key"]).to_numpy()


def probe_reference(trace_dirs: list, phases: tuple[str, ...] | None = None,
                    ) -> dict[str, float] | None:
    """The calibration's speed probe: the median ms of each shape over the repeats of every
    probe its traces ran (a grid's `reference` after its cells, calibration traffic's `before`
    and `after`; only `phases` where given), what the probes around live runs are leveled
    against (the machine's speed when calibrated; model-free). Pooled because one seconds-long
    probe reads the machine of that moment, which moves by a quarter from one second to the
    next on a shared VM. None where no trace has one."""
    frames = [read_table(d, "speed_probe").to_pandas() for d in trace_dirs
              if (Path(d) / "speed_probe").is_dir()]
    probe = pd.concat(frames) if frames else pd.DataFrame()
    if len(probe) and phases is not None:
        probe = probe[probe.phase.isin(phases)]
    if not len(probe):
        return None
    probe = probe.sort_values(["run_id", "phase", "step_index"])
    probe = probe.assign(phase=probe.run_id + "/" + probe.phase)  # repeats within each probe
    rep = probe[_repeats(probe)]
    return {k: float(v) for k, v in rep.groupby(probe_shape(rep)).duration_ms.median().items()}


def probe_level(model, live_dir: str | Path, reference: dict | None = None) -> dict | None:
    """The live run's speed probe (`engines.speed_probe`) against `reference` (`probe_reference`,
    the same probe at calibration time) where given, else against a step-time model's
    prediction: per phase, the median over its repeated decode steps of live time over that,
    and `level`, the mean of the phases; with `prefill`, the same of its one-prompt prefills
    (where it ran them) and `factor`, what the serving model's prefill terms must be scaled by,
    beside the rest at the decode level, for its prefills to move that much (mean of the
    phases' medians). None where the run has no probe (or none of the reference's shapes)."""
    probe = read_table(live_dir, "speed_probe").to_pandas()
    if not len(probe):
        return None
    out, prefill, factors = {}, {}, []
    for phase, p in probe.sort_values("step_index").groupby("phase"):
        # back to back in one engine: each step starts where the last ended (no idle)
        steps = p.assign(replica_id=0, step_id=p.step_index, is_warmup=False, run_id=phase,
                         start_s=(p.duration_ms.cumsum() - p.duration_ms) / 1e3)
        ratio, kept = live_over_predicted(model, steps)
        seen = _repeats(kept.assign(phase=phase))
        if reference is not None:
            ref_ms = probe_shape(kept).map(reference).to_numpy(dtype=float)
            ratio, seen = kept.duration_ms.to_numpy() / ref_ms, seen & ~np.isnan(ref_ms)
        decode = kept.prefill_tokens.eq(0).to_numpy() & seen
        if decode.any():
            out[str(phase)] = float(np.median(ratio[decode]))
        one = (kept.prefill_tokens.gt(0) & kept.decode_seqs.eq(0) & kept.prefill_seqs.eq(1)
               ).to_numpy() & seen
        if one.any():
            prefill[str(phase)] = float(np.median(ratio[one]))
            if decode.any() and hasattr(model, "prefill_split_ms"):
                rest, own = model.prefill_split_ms(kept[one])
                priced = own > 0
                if priced.any():
                    factors.append(float(np.median(
                        ((ratio[one] * (rest + own) - out[str(phase)] * rest) / own)[priced])))
    if not out:
        return None
    out["level"] = float(np.mean(list(out.values())))
    if prefill:
        prefill["level"] = float(np.mean(list(prefill.values())))
        factor = float(np.mean(factors)) if factors else None
        # A prefill whose own terms are a sliver of its time (short prompts) leaves them in the
        # noise of the rest: a factor at or below zero says the probe could not tell them apart,
        # and the prefill terms then move with the decode level.
        prefill["factor"] = factor if factor is not None and factor > 0 else None
        out["prefill"] = prefill
    return out


def probes_level(calibration: str | Path, live_dirs: list) -> dict | None:
    """Mean speed-probe levels of the live runs against the calibration (its reference probe,
    `provenance.speed_probe_ms`, where it has one; `against` says which): `decode`, and
    `prefill` and `prefill_factor` (`probe_level`'s, None unless every run probed prefills);
    None unless every run has a probe."""
    cal = json.loads(Path(calibration).read_text())
    model = step_time.from_json(cal["step_time_model"])
    reference = (cal.get("provenance") or {}).get("speed_probe_ms")
    levels = [probe_level(model, d, reference) for d in live_dirs]
    if not levels or any(v is None for v in levels):
        return None
    out = {"decode": float(np.mean([v["level"] for v in levels])), "prefill": None,
           "prefill_factor": None, "against": "reference" if reference else "model"}
    pre = [v.get("prefill") for v in levels]
    if all(pre):
        out["prefill"] = float(np.mean([v["level"] for v in pre]))
        if all(v["factor"] is not None for v in pre):
            out["prefill_factor"] = float(np.mean([v["factor"] for v in pre]))
    return out

"""Sim-vs-live validation: the same metrics on both requests tables, relative error per row."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from sim.metrics import latency_columns, summarize
from traces import read_run, read_table
from traces.manifest import check_sealed

# |relative error| a validation passes within (issue: fidelity targets)
TOLERANCE = {"e2e_s.p50": 0.05, "e2e_s.p90": 0.05, "tpot_s.p50": 0.05, "tpot_s.p90": 0.05,
             "ttft_s.p50": 0.10, "ttft_s.p90": 0.10, "throughput_tok_s": 0.03}


def judge(sim: float, live: list[float], tolerance: float, band: dict | None = None) -> dict:
    """Error of the simulator's estimate against the mean of the live runs, the live-vs-live
    spread, whether the error is within the tolerance or (where larger) the spread, and which
    live runs fall inside the step-time noise band. The estimate is the band's median where
    there is a band, else `sim` (a mean-latency run's value: kept beside it as `sim_mean`)."""
    # Why the band's median: a median or P90 over requests under step-time noise is what the
    # noise makes of it; a mean-latency run has no noise, so it narrows the distribution it
    # takes percentiles of (TPOT P90 2-4 points low over the 11-27 full runs, every one).
    mean = float(np.mean(live))
    rel = partial(_rel, mean=mean)
    est = band["median"] if band is not None else sim
    spread = (max(live) - min(live)) / mean if mean else float("nan")
    out = {"sim": float(est), "live": [float(v) for v in live], "error": rel(est),
           "spread": float(spread), "tolerance": tolerance,
           "ok": bool(abs(rel(est)) <= max(tolerance, spread))}
    if band is not None:
        out["band"] = [band["lo"], band["hi"]]
        out["in_band"] = [bool(band["lo"] <= v <= band["hi"]) for v in live]
        out["sim_mean"], out["error_mean"] = float(sim), rel(sim)
    return out


def judge_at_probe(metric: dict, sim: float, sim_mean: float) -> None:
    """Add to a `judge` result the error of the simulation leveled to the live runs' speed
    probe (`sim.step_time.live_speed.probes_level`): `sim`, its estimate as the judged one is
    taken (the noise band's median), and whether that is within the tolerance or the spread;
    the mean-latency run's error beside it."""
    err, ok = error_within(metric, sim)
    metric.update(sim_at_probe_speed=float(sim), error_at_probe_speed=err, ok_at_probe_speed=ok,
                  error_mean_at_probe_speed=_rel(sim_mean, float(np.mean(metric["live"]))))


def error_within(metric: dict, sim: float) -> tuple[float, bool]:
    """An estimate's error against a `judge` result's live mean, and whether it is within the
    metric's tolerance or (where larger) its live-vs-live spread."""
    err = _rel(sim, float(np.mean(metric["live"])))
    return err, bool(abs(err) <= max(metric["tolerance"], metric["spread"]))


def _rel(x: float, mean: float) -> float:
    """x's error against the live runs' mean (NaN where the mean is 0)."""
    return float((x - mean) / mean) if mean else float("nan")


def compare(sim_dir: str | Path, live_dir: str | Path) -> dict:
    """{metric: {sim, live, rel_err}} for TTFT/TPOT/e2e mean,P50,P90,P99 and throughput."""
    for d in (sim_dir, live_dir):
        if Path(d).is_dir():
            check_sealed(d)
    sim = _requests(sim_dir)
    live = _requests(live_dir)
    same_workload(sim, live, sim_dir, live_dir)
    s, l_ = summarize(sim), summarize(live)
    rows = {}
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        for stat in ("mean", "p50", "p90", "p99"):
            rows[f"{metric}.{stat}"] = (s[metric][stat], l_[metric][stat])
    rows["throughput_tok_s"] = (s["throughput_tok_s"], l_["throughput_tok_s"])
    return {k: {"sim": float(a), "live": float(b),
                "rel_err": float((a - b) / b) if b else float("nan")} for k, (a, b) in rows.items()}


def _requests(run_dir: str | Path) -> pd.DataFrame:
    """A run's requests table; a clear error where the directory holds none."""
    if not (Path(run_dir) / "requests").is_dir():
        raise ValueError(f"{run_dir}: no requests table (not a simulate -o or replay output "
                         "directory)")
    requests = read_table(run_dir, "requests").to_pandas()
    if not len(requests):
        raise ValueError(f"{run_dir}: its requests table is empty")
    return requests


def same_workload(sim: pd.DataFrame, live: pd.DataFrame, sim_dir, live_dir) -> None:
    """Refuse two runs of different workloads: the same request ids, each with the same prompt
    length and arrival time (1 us) on both sides, and the same output length where both ran to
    their limit."""
    missing = set(live.request_id) ^ set(sim.request_id)
    if missing:
        raise ValueError(f"{sim_dir} and {live_dir} hold different requests (e.g. "
                         f"{sorted(missing)[0]}): not the same workload")
    m = sim.merge(live, on="request_id", suffixes=("_sim", "_live"))
    differ = m[(m.prompt_tokens_sim != m.prompt_tokens_live)
               | ((m.arrival_s_sim - m.arrival_s_live).abs() > 1e-6)]
    if len(differ):
        r = differ.iloc[0]
        raise ValueError(f"{sim_dir} and {live_dir}: request {r.request_id} arrives at "
                         f"{r.arrival_s_sim:.6f} s with {r.prompt_tokens_sim} prompt tokens in "
                         f"one and at {r.arrival_s_live:.6f} s with {r.prompt_tokens_live} in the "
                         f"other ({len(differ)} such): not the same workload")
    # a request that ran to its length limit on both sides shows that limit: equal, or the
    # workloads asked for other output lengths (decisions may end others early on one side)
    if {"finish_reason_sim", "finish_reason_live", "output_tokens_sim"} <= set(m.columns):
        limit = (m.finish_reason_sim == "length") & (m.finish_reason_live == "length")
        differ = m[limit & (m.output_tokens_sim != m.output_tokens_live)]
        if len(differ):
            r = differ.iloc[0]
            raise ValueError(f"{sim_dir} and {live_dir}: request {r.request_id} runs to its "
                             f"length limit at {r.output_tokens_sim} output tokens in one and "
                             f"{r.output_tokens_live} in the other ({len(differ)} such): not "
                             "the same workload")


def device_check(sim_dir: str | Path, live_dir: str | Path) -> dict:
    """Whether the simulation's calibrations were traced on the device the live run used."""
    sim, live = read_run(sim_dir), read_run(live_dir)
    cals = sim["params"].get("calibrations") or []
    calibrated = sorted({(c["device"], c["device_count"]) for c in cals})
    if not calibrated:  # a simulation written before calibrations were recorded
        calibrated = [(sim["device"].removeprefix("simulated "), None)]
    here = (live["device"], live["device_count"])
    match = all(d == here[0] and n in (None, here[1]) for d, n in calibrated)
    return {"match": bool(match), "live": f"{here[0]} x{here[1]}",
            "calibrated_on": "; ".join(f"{d} x{n}" if n is not None else str(d)
                                       for d, n in calibrated)}


SPEED_TOLERANCE = 1.5
"""live decode steps this many times slower or faster than the calibration predicts: another
device in speed, whatever its name says (virtual machines report coarse CPU names)"""


def speed_check(sim_dir: str | Path, live_dir: str | Path) -> dict | None:
    """Median of live step time / the calibration's prediction for the same step, for decode-only
    steps (`decode_step_ratio`, what the device check judges) and for steps that prefill
    (`prefill_step_ratio`, None without any): where a TTFT error comes from the step model rather
    than the machine's speed; `probe`, the run's speed probe before and after it
    (`sim.step_time.live_speed.probe_level`, against the calibration's own probe where it has one);
    `host_steal`, the share of CPU ticks the hypervisor stole while it served
    (`engines.host_cpu`; None where its trace has no samples); `step_tail` and
    `calibration_tail`, its steps in total over their median speed beside the calibration's
    (`validation.bursts`). None when the simulation did not record its step-time model or the
    live run has no decode steps."""
    from engines.host_cpu import trace_stolen_share
    from sim.step_time import registry as step_time
    from sim.step_time.live_speed import (decode_median, decode_steps, live_over_predicted,
                                          probe_level)
    from sim.step_time.serving_features import attach_spans
    from validation.bursts import calibration_tail, ratio_tail

    cals = read_run(sim_dir)["params"].get("calibrations") or []
    models = {json.dumps(c["step_time_model"], sort_keys=True) for c in cals
              if "step_time_model" in c}
    if len(models) != 1:  # none recorded, or several pools: no single prediction to compare
        return None
    model = step_time.from_json(json.loads(models.pop()))
    reference = cals[0].get("speed_probe_ms")  # the calibration's own probe, where it has one
    # the span of each prefill the engine recorded: the serving model prices cached prefills
    steps = attach_spans(read_table(live_dir, "steps").to_pandas(), [live_dir])
    ratio, steps = live_over_predicted(model, steps)
    decode = decode_steps(steps)
    if not decode.any():
        return None
    prefill = (steps.prefill_tokens > 0).to_numpy()
    r = decode_median(ratio, steps)
    probe = probe_level(model, live_dir, reference)
    return {"decode_step_ratio": r, "steps": int(decode.sum()), "probe": probe,
            "probe_against": "the calibration's own probe" if reference else "prediction",
            "probe_match": probe_match(probe) if reference else None,
            "prefill_step_ratio": float(np.median(ratio[prefill])) if prefill.any() else None,
            "prefill_steps": int(prefill.sum()),
            "host_steal": trace_stolen_share(live_dir),
            "step_tail": ratio_tail(ratio, steps.duration_ms.to_numpy()),
            "calibration_tail": calibration_tail(model),
            "match": bool(1 / SPEED_TOLERANCE <= r <= SPEED_TOLERANCE)}


def probe_match(probe: dict | None) -> bool | None:
    """Whether a live run's speed probe, against the calibration's own (`probe_level` with a
    reference), says the same machine: its level within `SPEED_TOLERANCE`, widened by the
    probe's own noise (how far its phases before and after the run lie apart). None without a
    probe. Model-free: a calibration from a machine of another speed shows here whatever its
    step-time model gets right or wrong."""
    if not probe:
        return None
    level = probe["level"]
    phases = [v for k, v in probe.items() if k not in ("level", "prefill")]
    noise = (max(phases) - min(phases)) / level if level > 0 else 0.0
    tolerance = SPEED_TOLERANCE * (1.0 + noise)
    return bool(1 / tolerance <= level <= tolerance)


def _pool_engines(sim_dir: str | Path, live_dir: str | Path):
    """Per pool of a simulation with a step-time model: (pool, model, the live run's engine
    trace for it: `live_dir/POOL` where the run has an engine per pool, else `live_dir`)."""
    from sim.step_time import latency, layered, serving_latency  # noqa: F401  (kinds register)
    from sim.step_time import registry as step_time

    for c in read_run(sim_dir)["params"].get("calibrations") or []:
        own = Path(live_dir) / str(c["pool"])
        d = own if (own / "steps").is_dir() else Path(live_dir)
        if "step_time_model" in c and (d / "steps").is_dir():
            yield str(c["pool"]), step_time.from_json(c["step_time_model"]), d


def _pool_ratios(sim_dir: str | Path, live_dir: str | Path):
    """Per pool of a simulation with a step-time model: (pool, model, each of the live run's
    steps on that pool's engine timed over the model's prediction, those steps)."""
    from sim.step_time.live_speed import live_over_predicted
    from sim.step_time.serving_features import attach_spans

    for pool, model, d in _pool_engines(sim_dir, live_dir):
        steps = attach_spans(read_table(d, "steps").to_pandas(), [d])
        yield (pool, model, *live_over_predicted(model, steps))


def pool_step_speeds(sim_dir: str | Path, live_dir: str | Path) -> dict[str, float]:
    """Per pool of a simulation, the median over the live run's decode-only steps on that
    pool's engine of live step time over the pool's calibration's prediction: the machine's
    speed against each calibration, for any family's replay."""
    from sim.step_time.live_speed import decode_median

    out = {}
    for pool, _, ratio, steps in _pool_ratios(sim_dir, live_dir):
        if (speed := decode_median(ratio, steps)) is not None:
            out[pool] = speed
    return out


def machine_speed(sim_dir: str | Path, live_dirs: list) -> dict:
    """A replay's `runs` (each live run's `pool_step_speeds` against the simulation), its
    `tails` (each live run's `bursts.step_tail` per pool) beside the calibrations'
    (`calibration_tails`), and its `warning` (`speed_warning` of the runs' median per pool and
    `bursts.burst_warning`; None where neither says anything). Each live run's steps are read
    and priced once."""
    from sim.step_time.live_speed import decode_median
    from validation.bursts import burst_warning, calibration_tail, ratio_tail

    runs, tails, cal_tails = [], [], {}
    for d in live_dirs:
        runs.append({})
        tails.append({})
        for pool, model, ratio, steps in _pool_ratios(sim_dir, d):
            if (speed := decode_median(ratio, steps)) is not None:
                runs[-1][pool] = speed
            tails[-1][pool] = ratio_tail(ratio, steps.duration_ms.to_numpy())
            cal_tails[pool] = calibration_tail(model)
    pools = sorted({p for r in runs for p in r})
    median = {p: float(np.median([r[p] for r in runs if p in r])) for p in pools}
    lines = [w for w in (speed_warning(median), burst_warning(tails, cal_tails)) if w]
    return {"runs": runs, "tails": tails, "calibration_tails": cal_tails,
            "warning": "\n".join(lines) or None}


def speed_warning(speeds: dict[str, float]) -> str | None:
    """One line where a pool's live steps ran beyond `SPEED_TOLERANCE` of its calibration
    (`pool_step_speeds`): its errors then measure the machine, not the model."""
    off = {p: r for p, r in speeds.items() if not 1 / SPEED_TOLERANCE <= r <= SPEED_TOLERANCE}
    if not off:
        return None
    return ("warning: live decode steps ran at " + ", ".join(
        f"{r:.2f}x ({p})" for p, r in sorted(off.items())) + " of the calibration's prediction: "
        "it describes another machine's speed (or this one far from it); calibrate on this "
        "machine before reading the latency errors")


def verdict(rows: dict, device: dict, allow_device_mismatch: bool = False,
            speed: dict | None = None) -> dict:
    """pass / fail against `TOLERANCE`, or refused when the devices differ by name or by the live
    run's step speed (unless allowed)."""
    if not device["match"] and not allow_device_mismatch:
        return {"status": "refused", "reason": "the calibration was traced on another device; "
                "re-trace and calibrate here, or pass --allow-device-mismatch"}
    if speed is not None and speed.get("probe_match") is False and not allow_device_mismatch:
        return {"status": "refused", "reason": f"the calibration's own speed probe ran at "
                f"{speed['probe']['level']:.2f}x its reference here: the calibration describes "
                "another machine's speed; re-trace and calibrate here, or pass "
                "--allow-device-mismatch"}
    if speed is not None and not speed["match"] and not allow_device_mismatch:
        return {"status": "refused", "reason": f"live decode steps ran at "
                f"{speed['decode_step_ratio']:.2f}x the calibration's prediction: it does not "
                "describe this device's speed; re-trace and calibrate here, or pass "
                "--allow-device-mismatch"}
    over = {k: rows[k]["rel_err"] for k, tol in TOLERANCE.items()
            if k in rows and not abs(rows[k]["rel_err"]) <= tol}
    if over:
        return {"status": "fail", "reason": "outside tolerance: " + ", ".join(
            f"{k} {v:+.1%} (±{TOLERANCE[k]:.0%})" for k, v in sorted(over.items()))
            + steal_note(speed, min(TOLERANCE[k] for k in over))}
    return {"status": "pass", "reason": "every metric within tolerance"}


def steal_note(speed: dict | None, tolerance: float) -> str:
    """Where the host's steal while the live run served could alone move its latencies
    beyond `tolerance` (`engines.host_cpu.stall_share`), a clause saying so; else ''."""
    from engines.host_cpu import stall_share

    steal = (speed or {}).get("host_steal")
    if stall_share(steal) <= tolerance:
        return ""
    return (f"; the host stole {steal:.1%} of the CPU while the live run served, stalls worth "
            f"about {stall_share(steal):.0%} of its step time: run it again on a quieter spell "
            "before reading these errors as the model's")


def validate_dirs(sim_dir: str | Path, live_dir: str | Path,
                  allow_device_mismatch: bool = False) -> dict:
    """A simulation's output directory against a live run's: the metrics (each live value
    against the simulation's noise band where `simulate --seeds` wrote one), the device and
    step-speed checks, and the verdict."""
    rows = compare(sim_dir, live_dir)
    bands_path = Path(sim_dir) / "bands.json"
    if bands_path.exists():
        from sim.bands import in_band

        band = json.loads(bands_path.read_text())
        for k, v in rows.items():
            if k in band["metrics"]:
                v["band"] = [band["metrics"][k]["lo"], band["metrics"][k]["hi"]]
                v["in_band"] = in_band(band, k, v["live"])
    device = device_check(sim_dir, live_dir)
    speed = speed_check(sim_dir, live_dir)
    if read_run(live_dir)["kind"] == "sim":  # two simulations compared: nothing to judge
        return {"metrics": rows, "device": device, "speed": speed, "verdict": {
            "status": "refused", "reason": f"{live_dir} is a simulation's output (runs kind "
            "'sim'), not a live run: the errors compare two simulations"}}
    return {"metrics": rows, "device": device, "speed": speed,
            "verdict": verdict(rows, device, allow_device_mismatch, speed)}


def plot_cdfs(sim_dir: str | Path, live_dir: str | Path, out_dir: str | Path) -> Path:
    """Overlaid CDFs of TTFT, TPOT and end-to-end latency; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = latency_columns(read_table(sim_dir, "requests").to_pandas())
    live = latency_columns(read_table(live_dir, "requests").to_pandas())
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
        for df, label, style in ((live, "live (vLLM)", "-"), (sim, "simulated", "--")):
            v = np.sort(df[col].dropna().to_numpy())
            ax.plot(v, np.arange(1, v.size + 1) / max(v.size, 1), style, label=label)
        ax.set_xlabel(col.replace("_s", " (s)"))
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "validate_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def per_request_error(sim_dir: str | Path, live_dir: str | Path) -> pd.DataFrame:
    """Per-request latency of sim and live joined on request_id."""
    sim = read_table(sim_dir, "requests").to_pandas().set_index("request_id")
    live = read_table(live_dir, "requests").to_pandas().set_index("request_id")
    a, b = latency_columns(sim), latency_columns(live)
    return a.join(b, lsuffix="_sim", rsuffix="_live")

"""The `reasonsim fidelity` report: the result as a Markdown table (see `validation.fidelity`)."""

from __future__ import annotations


def speed_text(v: dict) -> str:
    """`decode/prefill` ratios of one live run, e.g. 0.96x/1.36x."""
    return "/".join(f"{v[k]:.2f}x" if v[k] is not None else "-" for k in ("decode", "prefill"))


def probe_text(r: dict) -> str:
    """A row's speed-probe levels, e.g. `probe 0.98x/1.21x` (decode/prefill), or ''."""
    if not r.get("probe_level"):
        return ""
    pre = r.get("probe_prefill_level")
    return f"probe {r['probe_level']:.2f}x" + (f"/{pre:.2f}x" if pre else "")


def summary_lines(s: dict | None) -> list[str]:
    """The table's counts (`validation.fidelity_judging.table_summary`) as a paragraph."""
    from engines.host_cpu import STEAL_WEIGHT
    from validation.judge import TOLERANCE

    if not s:
        return []

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"
    levels, steal = s["decode_levels"], s.get("live_steal")
    stalled = s.get("live_runs_stalled") or [0, 0]
    over = TOLERANCE["e2e_s.p50"] / STEAL_WEIGHT  # a stolen share that alone moves e2e past it
    stolen = (f" The host stole {steal[0]:.1%}-{steal[1]:.1%} of the CPU while they served"
              f" ({stalled[0]} of {stalled[1]} live runs over {over:.1%}: stalls that alone"
              " could move their latencies beyond tolerance)." if steal else "")
    return [f"Within tolerance or the live-vs-live spread: {s['ok']} of {s['metrics']} metrics "
            "as judged (at the decode speed of the live runs just before and after each), "
            f"{s.get('ok_raw', s['ok'])} raw (at the calibration's speed alone), "
            f"{s['ok_at_live_speed']} of {s['at_live_speed']} at the live runs' own "
            f"decode speed, {s['ok_at_probe_speed']} of {s['at_probe_speed']} at probe speed. "
            f"Median absolute e2e/program P50 error: {pct(s['p50_median_abs'])} as judged, "
            f"{pct(s.get('p50_median_abs_raw'))} raw, "
            f"{pct(s['p50_median_abs_at_live_speed'])} at live decode speed, "
            f"{pct(s.get('p50_median_abs_at_probe_speed'))} at probe speed. Live decode steps "
            + (f"at {levels[0]:.2f}-{levels[1]:.2f}x of the calibration's." if levels else
               "not measured.") + stolen + burst_text(s)
            + traffic_text(s)
            + f" Live values inside the noise band: {s['in_band']} of {s['band_of']}.", ""]


def traffic_text(s: dict) -> str:
    """The counts at the speed checks' levels (`validation.speed_checks`), or ''."""
    if not s.get("at_traffic_speed"):
        return ""
    p50 = s.get("p50_median_abs_at_traffic_speed")
    levels = ", ".join(f"{x:.2f}x" for x in s.get("traffic_levels") or [])
    return (" At the speed of the calibration traffic replayed nearest each live run: "
            f"{s['ok_at_traffic_speed']} of {s['at_traffic_speed']} within tolerance or spread"
            + (f", median absolute P50 error {p50:.1%}" if p50 is not None else "")
            + (f" (its decode steps at {levels} of the calibration's prediction, at "
               "calibration and after each pass)" if levels else "") + ".")


def burst_text(s: dict) -> str:
    """A sentence on the live runs' steps in total over their median speed, or ''."""
    from validation.bursts import BURST_TOLERANCE

    tails, bursts = s.get("live_tails"), s.get("live_runs_in_bursts") or [0, 0]
    if not tails:
        return ""
    return (f" Live steps took {tails[0] - 1:.0%}-{tails[1] - 1:.0%} more in total than at their"
            f" median speed (the calibration's: {s['calibration_tail'] - 1:.0%}); {bursts[0]} of"
            f" {bursts[1]} live runs over it by more than {BURST_TOLERANCE:.0%} served through a"
            " burst of other work, which a median speed level does not see.")


def traffic_steal(result: dict) -> str:
    """A sentence on the CPU the host stole while the calibration traffic served, or ''."""
    shares = {k: v for k, v in (result.get("calibration_steal") or {}).items() if v is not None}
    if not shares:
        return ""
    return (" The host stole " + ", ".join(f"{v:.1%} ({k})" for k, v in shares.items())
            + " of the CPU while its calibration traffic served.")


def attempts_text(result: dict) -> str:
    """A sentence on how often the calibration was traced (again after a noisy attempt), each
    attempt's held-out step P90 error and the one kept; '' for a result without them."""
    attempts, bound = result.get("calibration_attempts"), result.get("noisy_p90_ape")
    if not attempts or bound is None:
        return ""
    p90s = ", ".join(f"{a['p90_ape']:.1%}" for a in attempts)
    kept = next(a["attempt"] for a in attempts if a["kept"])
    text = (f"Calibration traced once (held-out step P90 error {p90s}; noisy above {bound:.0%})."
            if len(attempts) == 1 else
            f"Calibration traced {len(attempts)} times (held-out step P90 error {p90s}; noisy "
            f"above {bound:.0%}): attempt {kept} kept, the others under noisy_calibrations/.")
    if result.get("calibration_noisy"):
        text += (" The kept calibration is noisy too: every verdict below rests on step times "
                 "traced through a spell of the shared machine.")
    return text


def reruns_text(result: dict) -> str:
    """A sentence on the live runs run again after serving through a burst (each attempt's
    step tail, the one kept); '' for a result that allowed none."""
    from validation.bursts import BURST_TOLERANCE, RERUNS_DIR

    if not result.get("live_reruns"):
        return ""
    again = [f"{r['workload']} live{i + 1} (step tails "
             + ", ".join(f"{t:.2f}" if t is not None else "-" for t in a["tails"])
             + f"; attempt {a['kept'] + 1} kept)"
             for r in result["workloads"] for i, a in enumerate(r.get("live_attempts", []))
             if len(a["tails"]) > 1]
    bound = f"steps {BURST_TOLERANCE:.0%} over the calibration's in total against their median"
    if not again:
        return f"No live run served through a burst of other work ({bound})."
    return (f"Run again after serving through a burst of other work ({bound}), up to "
            f"{result['live_reruns']} time(s): " + "; ".join(again)
            + f". The others lie under WORKLOAD/{RERUNS_DIR}/.")


def metric_row(workload: str, m: str, v: dict) -> str:
    """One metric's table row: as judged (raw beside), at probe speed, at live decode speed, the
    band."""
    def pct(key: str) -> str:
        return f"{v[key]:+.1%}" if key in v else ""

    def yes(key: str) -> str:
        return ("yes" if v[key] else "NO") if key in v else ""
    band = (f"{v['band'][0]:.4g}-{v['band'][1]:.4g} | {sum(v['in_band'])}/{len(v['in_band'])} |"
            if "band" in v else " | |")
    raw = (f" (raw {v['error_raw']:+.1%}, {yes('ok_raw')})" if "error_raw" in v else "")
    return (f"| {workload} | {m} | {v['sim']:.4g} | {', '.join(f'{x:.4g}' for x in v['live'])} | "
            f"{v['error']:+.1%}{raw} | {v['spread']:.1%} | {yes('ok')} | {pct('error_mean')} | "
            f"{pct('error_at_probe_speed')} | {yes('ok_at_probe_speed')} | "
            f"{pct('error_at_live_speed')} | {pct('error_sampled_at_live_speed')} | "
            f"{yes('ok_at_live_speed')} | " + band)


def workload_rows(r: dict) -> list[str]:
    """A workload's table rows: its metrics, its live runs' step speeds and start times, and a
    program workload's decision agreement."""
    lines = [metric_row(r["workload"], m, v) for m, v in r["metrics"].items()]
    if r.get("step_speed"):
        lines.append(f"| {r['workload']} | live steps / predicted: decode, prefill | | "
                     + ", ".join(speed_text(v) for v in r["step_speed"])
                     + f" | | | | | {probe_text(r)} | | | | | | |")
    tails = [v.get("tail") for v in r.get("step_speed", [])]
    cal = next((v["calibration_tail"] for v in r.get("step_speed", [])
                if v.get("calibration_tail")), None)
    if any(t is not None for t in tails) and cal:
        lines.append(f"| {r['workload']} | live steps in total / at their median speed | | "
                     + ", ".join("-" if t is None else f"{t:.2f}x" for t in tails)
                     + f" | | | | | calibration {cal:.2f}x | | | | | | |")
    if r.get("live_started_s"):
        lines.append(f"| {r['workload']} | live runs started (s into the suite) | | "
                     + ", ".join(f"{t:.0f}" for t in r["live_started_s"])
                     + " | | | | | | | | | | | |")
    if any(x is not None for x in r.get("live_steal", [])):
        lines.append(f"| {r['workload']} | CPU stolen by the host while serving | | "
                     + ", ".join("-" if x is None else f"{x:.1%}" for x in r["live_steal"])
                     + " | | | | | | | | | | | |")
    if "decision_agreement" in r:
        lines.append(f"| {r['workload']} | decision agreement | | | "
                     f"{r['decision_agreement']:.3f} | live vs live {r['live_agreement']:.3f} | "
                     f"{'yes' if r['agreement_ok'] else 'NO'} | | | | | | | | |")
    return lines


def report(result: dict) -> str:
    """The result as a Markdown table: workload x metric, sim, live runs, error, spread."""
    engine, attempts = result.get("engine", "vllm"), attempts_text(result)
    reruns = reruns_text(result)
    lines = [f"# Fidelity on {result['device']} ({'quick' if result['quick'] else 'full'} "
             f"suite, {'vLLM' if engine == 'vllm' else 'the PyTorch engine'})", "",
             *[f"Not run: {name} ({why})." for name, why in result.get("skipped", {}).items()],
             f"Calibration `{result['calibration']}`: held-out step MAPE "
             f"{result['calibration_heldout']['mape']:.1%}, P90 APE "
             f"{result['calibration_heldout']['p90_ape']:.1%}." + traffic_steal(result), "",
             *([attempts, ""] if attempts else []), *([reruns, ""] if reruns else []),
             *summary_lines(result.get("summary")),
             "| workload | metric | sim | live (runs) | error | live-vs-live spread | ok | "
             "mean-latency run | at probe speed | ok at probe speed | at live decode speed | "
             "sampled median at live speed | ok at live speed | noise band 5-95% | "
             "live runs in band |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["workloads"]:
        lines += workload_rows(r)
    c = result["band_coverage"]
    lines += ["", "sim: the median over the noise band's draws (sampled step times: the "
              "machine's level per second and each step's own noise), the simulator's "
              "estimate of a percentile over requests under step-time noise; the mean-latency "
              "run, whose "
              "steps carry no noise and so narrow the distributions it takes percentiles of, "
              "beside it (its error)."]
    lines += ["", "At live decode speed: the mean error against each live run when the "
              "simulation's step times are scaled by that run's decode steps over the "
              "calibration's prediction, against its own steps (the machine's speed level of "
              "the moment taken out; the "
              "prefill ratio is left as it is). Sampled median: the median over the noise "
              "band's draws at that speed (step residuals and the machine's spells within a "
              "run, `sim.step_time.spells`), the simulator's estimate of a tail a mean run "
              "cannot show; `ok at live speed` judges it against the same tolerance or spread."]
    lines += ["", "At probe speed: the simulation with its step times scaled to the speed levels "
              "that a fixed probe measured just before and just after each live run "
              "(`engines.speed_probe`; the live runs themselves unseen; `probe D/P`: its decode "
              "steps and its one-prompt prefills against the same probe run around the "
              "calibration's traces, pooled, or, for a calibration without one, against the "
              "prediction; "
              "the prefill terms scaled apart to take the latter), its noise band's median as "
              "judged: how far the model is "
              "off once the shared machine's drift since calibrating is known. `ok` judges the "
              "raw simulation, `ok at probe speed` that one, against the same tolerance or "
              "spread."]
    if "calibrated_s" in result:
        lines += ["", f"Calibrated {result['calibrated_s']:.0f} s into the suite; the live runs "
                  "then ran in passes over the suite, one run of each workload a pass, so a "
                  "workload's two runs lie a pass apart and their spread includes the machine's "
                  "drift over that time."]
    lines += ["", f"Step-time noise band ({c['band']}, {c['seeds']} draws): {c['inside']} of "
              f"{c['of']} live values inside."]
    lines += ["", f"Overlaid CDFs: `<workload>/validate_cdf.png`. Wall time {result['wall_s']} s."]
    return "\n".join(lines) + "\n"

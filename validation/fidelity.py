"""The fidelity suite (`reasonsim fidelity`): trace this machine, calibrate, then simulate and
replay a suite live.

The whole sim-vs-live loop in one command: a step grid traced here (with idle gaps before cells,
as live traffic has them) and live replays of calibration traffic (varied lengths in waves: the
step shapes of real serving), a `serving` calibration of all (traced again where the machine
was noisy meanwhile: `validation.fidelity_calibration`), then for every workload of the suite
(examples/fidelity/suite.yaml) a simulation and two live replays on the engine (vLLM, or the
PyTorch engine's serving mode: `validation.fidelity_programs` retraces program workloads on it),
one in each of two passes over the suite. Each live run is simulated at the decode speed of the
live runs beside it in time (`validation.speed_checks`: the machine's speed of the moment; the
estimate at the calibration's speed alone kept beside as raw), and each metric is judged against
the simulator's tolerance or, where the two live runs differ by more, against that live-vs-live
spread (the noise floor of a shared machine over the minutes the calibration is used across),
printed beside it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from validation.bursts import LIVE_RERUNS, replay_quietly, tails_against
from validation.fidelity_calibration import (NOISY_P90_APE, RETRACES, calibrate_quietly,
                                             check_retraces, replay_traffic, unserved)
from validation.fidelity_judging import (BAND_SEEDS, LIVE_RUNS, Planned, leveled_errors,
                                         probe_levels, sampled_medians, scaled_config,
                                         simulate_with_band, table_summary)
from validation.fidelity_programs import program_workload
from validation.fidelity_suite import SUITE, load_suite, request_config
from validation.replay import fresh_process
from validation.speed_checks import (NEIGHBOURS, TRAFFIC_PREFIX, at_traffic_speed, check_dir,
                                     judge_at_neighbours, judge_at_traffic, medians_at,
                                     traffic_levels)

__all__ = ["SUITE", "load_suite", "request_config", "run_fidelity"]
REQUEST_METRICS = ("e2e_s.p50", "e2e_s.p90", "tpot_s.p50", "tpot_s.p90", "ttft_s.p50",
                   "ttft_s.p90", "throughput_tok_s")


def request_workload(name: str, spec: dict, cal: Path, out: Path, quick: bool,
                     engine: str = "vllm", device: str = "auto") -> Planned:
    """One request workload set up under out/name: its LIVE_RUNS live replays and its judging."""
    from sim.config import parse_config

    from validation.replay import replay_config

    d = request_config(spec, cal, quick)
    (out / name).mkdir(parents=True)
    (out / name / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    lives = [out / name / f"live{i + 1}" for i in range(LIVE_RUNS)]
    return Planned(lives, lambda live: fresh_process(replay_config, parse_config(d, out / name),
                                                     live, device=device),
                   lambda levels: judge_requests(name, d, out / name, lives, levels),
                   lambda factors: medians_at(d, factors, out / name, out / name, NEIGHBOURS),
                   tails_against(cal))


def judge_requests(name: str, d: dict, out_dir: Path, lives: list[Path],
                   levels: list[dict]) -> dict:
    """Simulate the request workload config `d` into out_dir and judge it against its live
    runs, and at the speed checks' `levels` where there are any (`rejudge` does it again for
    another calibration): the table row."""
    from sim.config import parse_config
    from sim.step_time.live_speed import probes_level
    from sim.simulate import simulate
    from validation.judge import TOLERANCE, compare, judge, judge_at_probe, plot_cdfs, speed_check

    from sim.output import write_sim

    _, band = simulate_with_band(parse_config(d, out_dir), out_dir / "sim")
    rows = [compare(out_dir / "sim", live) for live in lives]
    plot_cdfs(out_dir / "sim", lives[0], out_dir)
    speeds = [step_speed(speed_check(out_dir / "sim", live)) for live in lives]
    leveled = [at_live_speed(d, s["decode"], out_dir / f"sim_at_live{i + 1}", live)
               for i, (s, live) in enumerate(zip(speeds, lives))]
    metrics = {m: judge(rows[0][m]["sim"], [r[m]["live"] for r in rows], TOLERANCE[m],
                        band.get(m)) for m in REQUEST_METRICS}
    leveled_errors(metrics, leveled)
    probe = probes_level(d["cluster"]["replicas"][0]["calibration"], lives) or {}
    if probe:  # simulated at the speeds the probes measured around the live runs
        cfg = scaled_config(d, probe["decode"], out_dir / "sim_at_probe", out_dir,
                            probe["prefill_factor"])
        write_sim(cfg, simulate(cfg), out_dir / "sim_at_probe" / "sim")
        at_probe, med = compare(out_dir / "sim_at_probe" / "sim", lives[0]), sampled_medians(cfg)
        for m in REQUEST_METRICS:
            judge_at_probe(metrics[m], med[m], at_probe[m]["sim"])
    traffic = at_traffic_speed(d, lives, levels, out_dir, out_dir)
    for m in REQUEST_METRICS if traffic else ():
        judge_at_traffic(metrics[m], traffic["median"][m])
    return {"workload": name, "kind": "requests", "metrics": metrics, "step_speed": speeds,
            **probe_levels(probe), "traffic_factors": traffic and traffic["factors"]}


def at_live_speed(d: dict, factor: float | None, out_dir: Path, live: Path) -> dict | None:
    """Each metric's error against one live run when the simulation's step times are scaled to
    that run's measured decode speed: the step model's error with the machine's speed level of
    the moment taken out (reported beside the raw error, never instead of it); (mean-latency
    error, sampled draws' median error) per metric."""
    from sim.simulate import simulate
    from validation.judge import compare

    from sim.output import write_sim

    if factor is None:
        return None
    cfg = scaled_config(d, factor, out_dir, out_dir)
    write_sim(cfg, simulate(cfg), out_dir / "sim")
    rows = compare(out_dir / "sim", live)
    med = sampled_medians(cfg)
    return {m: (rows[m]["rel_err"], med[m] / rows[m]["live"] - 1) for m in REQUEST_METRICS}


def step_speed(speed: dict | None) -> dict:
    """A live run's decode and prefill steps over the calibration's prediction (medians), as
    levels against its own steps (`live_over_predicted`), and its steps in total over their
    median speed beside the calibration's (`tail`, `calibration_tail`: `validation.bursts`)."""
    speed = speed or {}
    return {"decode": speed.get("decode_step_ratio"), "prefill": speed.get("prefill_step_ratio"),
            "tail": speed.get("step_tail"), "calibration_tail": speed.get("calibration_tail")}


def run_passes(plans: list[Planned], t0: float, after_pass, reruns: int = 0) -> dict[Path, dict]:
    """Every plan's live runs, pass by pass (`after_pass(i)` after pass i), each run again up
    to `reruns` times while it served through a burst (`validation.bursts.replay_quietly`):
    per live run, its attempts' step tails, the one kept and when it started, in seconds since
    `t0` (`time.perf_counter`)."""
    # Pass by pass, not workload by workload: a workload's live runs lie a whole pass apart
    # (minutes), as its simulation lies minutes from the calibration's traces. Back to back,
    # two runs share the shared machine's speed of the moment, and their spread missed the
    # drift every sim-vs-live comparison includes (0.93-1.13x within one suite).
    def clock() -> float:
        return round(time.perf_counter() - t0, 1)

    runs = {}
    for i in range(LIVE_RUNS):
        for p in plans:
            runs[p.lives[i]] = replay_quietly(p.replay, p.lives[i], p.tails, reruns,
                                              clock=clock)
        after_pass(i)
    return runs


def run_fidelity(out: Path, quick: bool = False, suite_path: Path = SUITE,
                 progress: bool = True, engine: str = "vllm", device: str = "auto",
                 speed_checks: bool = False, retraces: int | None = None,
                 noisy_p90: float = NOISY_P90_APE, live_reruns: int | None = None) -> dict:
    """The whole loop on vLLM or the PyTorch engine's serving mode (on `device`); writes
    DIR/fidelity.json and DIR/report.md and returns the result. With `speed_checks`, the
    calibration traffic is replayed again after each live pass (`validation.speed_checks`); a
    calibration whose held-out step P90 error is above `noisy_p90` is traced again, up to
    `retraces` times (`validation.fidelity_calibration`; None: RETRACES, or none with `quick`,
    whose smaller grid the bound was not chosen on: its report still says when it is noisy); a
    live run that served through a burst of other work is run again, up to `live_reruns`
    times (`validation.bursts.replay_quietly`; None: LIVE_RERUNS, or none with `quick`)."""
    retraces = (0 if quick else RETRACES) if retraces is None else retraces
    live_reruns = (0 if quick else LIVE_RERUNS) if live_reruns is None else live_reruns
    out, suite = Path(out), load_suite(suite_path)
    check_run(out, suite, suite_path, quick, retraces, noisy_p90, live_reruns)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cal, attempts = calibrate_quietly(out, suite, quick, progress, engine, device, retraces,
                                      noisy_p90)
    calibrated_s = round(time.perf_counter() - t0, 1)
    from engines.host_cpu import trace_stolen_share
    from sim.step_time.calibration import load_calibration

    calibration = load_calibration(cal)
    chosen = {name: spec for name, spec in suite["workloads"].items()
              if not quick or spec.get("quick")}
    skipped = {name: unserved(spec, engine) for name, spec in chosen.items()
               if unserved(spec, engine)}
    plans = [(program_workload if "program" in spec else request_workload)(
        name, spec, cal, out, quick, engine, device) for name, spec in chosen.items()
        if name not in skipped]
    def after_pass(i: int) -> None:
        if speed_checks:
            replay_traffic(check_dir(out, i + 1), suite, cal, quick, engine, device)

    runs = run_passes(plans, t0, after_pass, live_reruns)
    checks = traffic_levels(out, cal)
    rows = [{**p.judge(checks), "live_started_s": [runs[live]["started"] for live in p.lives],
             "live_steal": [trace_stolen_share(live) for live in p.lives],
             "live_attempts": [{k: runs[live][k] for k in ("tails", "kept")}
                               for live in p.lives]} for p in plans]
    by_name = dict(zip([r["workload"] for r in rows], plans))
    judge_at_neighbours(rows, checks, lambda r, factors: by_name[r["workload"]].medians(factors))
    result = {"quick": quick, "calibration": str(cal), "engine": engine,
              "device": calibration.provenance["device"], "skipped": skipped,
              "calibration_heldout": {k: v for k, v in calibration.heldout.items()
                                      if k in ("mape", "p90_ape", "rows")},
              "calibration_attempts": attempts, "noisy_p90_ape": noisy_p90,
              "calibration_noisy": calibration.heldout["p90_ape"] > noisy_p90,
              "live_reruns": live_reruns,
              "workloads": rows, "calibrated_s": calibrated_s,
              "calibration_steal": {t.name.removeprefix(TRAFFIC_PREFIX):
                                    trace_stolen_share(t)
                                    for t in sorted(out.glob(TRAFFIC_PREFIX + "*"))},
              "speed_checks": checks,
              "wall_s": round(time.perf_counter() - t0, 1)}
    return write_result(out, result)


def check_run(out: Path, suite: dict, suite_path: Path, quick: bool, retraces: int,
              noisy_p90: float, live_reruns: int) -> None:
    """Refuse, before anything runs, a run with nothing to judge, an output directory in use
    or a negative count or bound."""
    check_retraces(retraces, noisy_p90)
    if live_reruns < 0:
        raise ValueError(f"--live-reruns {live_reruns}: must be >= 0")
    if not any(not quick or spec.get("quick") for spec in suite["workloads"].values()):
        # nothing would be judged: "ok" over no workloads says nothing
        raise ValueError(f"{suite_path}: no workload {'marked quick: true ' if quick else ''}"
                         "to judge")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: not empty; choose a new directory")


def write_result(out: Path, result: dict) -> dict:
    """Complete a fidelity result (the band's coverage, the verdict, the summary) and write it
    as out/fidelity.json and out/report.md: the result."""
    from validation.fidelity_report import report

    rows = result["workloads"]
    inside = [x for r in rows for m in r["metrics"].values() for x in m.get("in_band", [])]
    result["band_coverage"] = {"inside": sum(inside), "of": len(inside), "band": "5-95%",
                               "seeds": BAND_SEEDS}
    result["ok"] = all(m["ok"] for r in rows for m in r["metrics"].values()) and all(
        r.get("agreement_ok", True) for r in rows)
    result["summary"] = table_summary(result)
    (out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "report.md").write_text(report(result))
    return result

"""The fidelity suite (`reasonsim fidelity`): trace this machine, calibrate, then simulate and
replay a suite live.

The whole sim-vs-live loop in one command: a step grid traced here (with idle gaps before cells,
as live traffic has them) and live replays of calibration traffic (varied lengths in waves: the
step shapes of real serving), a `serving` calibration of all, then for every workload of the suite
(examples/fidelity/suite.yaml) a simulation and two live replays on vLLM, one in each of two
passes over the suite. Each metric is judged against the simulator's tolerance or, where the two
live runs differ by more, against that live-vs-live spread (the noise floor of a shared machine
over the minutes the calibration is used across), printed beside it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from validation.replay import REPO, fresh_process

SUITE = REPO / "examples" / "fidelity" / "suite.yaml"
LIVE_RUNS = 2
BAND_SEEDS = 20
"""noise draws per workload for the 5-95% step-time band"""
REQUEST_METRICS = ("e2e_s.p50", "e2e_s.p90", "tpot_s.p50", "tpot_s.p90", "ttft_s.p50",
                   "ttft_s.p90", "throughput_tok_s")
PROGRAM_TOLERANCE = {"program_latency_p50": 0.05, "program_latency_p90": 0.05,
                     "tokens_per_program": 0.01}


@dataclass(frozen=True)
class Planned:
    """A suite workload set up to run: its live-run directories, one replay into a given one
    (in a fresh process), and its judging once every live run is done (the table row)."""

    lives: list[Path]
    replay: Callable[[Path], None]
    judge: Callable[[], dict]


def load_suite(path: Path) -> dict:
    """The suite file, checked enough to fail before any engine starts."""
    from sim.config import read_yaml

    try:
        suite = read_yaml(path)
    except ValueError as e:
        raise ValueError(f"not a readable suite: {e}") from None
    if not isinstance(suite, dict) or not isinstance(suite.get("workloads"), dict) or \
            not suite["workloads"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty `workloads:` mapping")
    for key in ("grid", "quick_grid", "sampling_grid"):
        if not isinstance(suite.get(key), dict) and (key != "sampling_grid" or key in suite):
            raise ValueError(f"{path}: `{key}:` must be a mapping of trace-steps grid settings")
    traffic = suite.get("calibration_traffic") or {}
    if not isinstance(traffic, dict) or not all(
            isinstance(t, dict) and isinstance(t.get("workload"), dict) for t in traffic.values()):
        raise ValueError(f"{path}: calibration_traffic: expected a mapping of name -> "
                        "{workload: ...}")
    for name, spec in suite["workloads"].items():
        if not isinstance(spec, dict) or ("workload" in spec) == ("program" in spec):
            raise ValueError(f"{path}: workloads.{name}: needs exactly one of `workload:` "
                            "(requests) or `program:` (an example program config)")
    return suite


def leveled_errors(metrics: dict, leveled: list) -> None:
    """Add each metric's mean error at the live runs' decode speeds, of the mean-latency
    simulation and of the sampled draws' median (`at_live_speed`); nothing where a run had
    no decode steps."""
    if any(x is None for x in leveled):
        return
    for m in metrics:
        if m in leveled[0]:
            metrics[m]["error_at_live_speed"] = float(np.mean([x[m][0] for x in leveled]))
            metrics[m]["error_sampled_at_live_speed"] = float(np.mean([x[m][1]
                                                                       for x in leveled]))


def sampled_medians(cfg) -> dict:
    """Each metric's median over BAND_SEEDS sampled-latency draws of the config."""
    from sim.bands import bands

    return {m: v["median"] for m, v in bands(cfg, BAND_SEEDS)["metrics"].items()}


def simulate_with_band(cfg, out_dir: Path):
    """Simulate (mean latency) into out_dir and write the noise band beside it."""
    from sim.bands import bands
    from sim.output import write_sim
    from sim.simulate import simulate

    result = simulate(cfg)
    band = bands(cfg, BAND_SEEDS)
    write_sim(cfg, result, out_dir, {"bands.json": json.dumps(band, indent=1) + "\n"})
    return result, band["metrics"]


def trace_and_calibrate(out: Path, suite: dict, quick: bool, progress: bool) -> Path:
    """Trace the grid on this machine's vLLM, replay the suite's calibration traffic live
    (workloads of their own, never evaluated), and fit a serving calibration on all; its path."""
    from sim.step_time.calibration import calibrate
    from sim.config import parse_config
    from tracers.step_profile import StepGrid, profile_steps

    from validation.replay import replay_config
    from validation.replay import DEFAULT_MODEL

    grid = suite["quick_grid" if quick else "grid"]
    limits = {"max_model_len": int(suite.get("max_model_len", 2048)),
              "max_num_seqs": max(grid["batch_sizes"])}  # one engine for every grid
    traces = []
    # The sampling grid runs small cells greedy and seeded back to back: the seeded-sampling
    # term the program workloads pay (`sim.step_time.sampling_cost`), in the same calibration.
    for name, g in (("grid", grid), ("sampling_grid", suite.get("sampling_grid"))):
        if g:
            spec = StepGrid(**{k: (tuple(v) if k in ("idle_ms", "regimes") else v)
                               for k, v in g.items()})
            fresh_process(profile_steps, str(DEFAULT_MODEL), out / name, spec, **limits,
                          progress=progress)
            traces.append(out / name)
    path = out / "calibration.json"
    path.write_text(json.dumps(calibrate(traces, model="serving").to_json(), indent=1) + "\n")
    # Live steps: the shapes, waves, idle gaps (and prefix-cache hits) of real serving.
    for name, traffic in (suite.get("calibration_traffic") or {}).items():
        if quick and not traffic.get("quick", True):
            continue
        workload = dict(traffic["workload"])
        if quick and "quick_requests" in traffic:
            workload["num_requests"] = traffic["quick_requests"]
        cfg = parse_config({"seed": traffic.get("seed", 0), "workload": workload,
                            "cluster": {"replicas": [{"calibration": str(path),
                                                      **traffic.get("replica", {})}]}}, out)
        fresh_process(replay_config, cfg, out / f"calibration_traffic_{name}")
        traces.append(out / f"calibration_traffic_{name}")
    if len(traces) > 1:
        path.write_text(json.dumps(calibrate(traces, model="serving").to_json(), indent=1)
                        + "\n")
    return path


def request_workload(name: str, spec: dict, cal: Path, out: Path, quick: bool) -> Planned:
    """One request workload set up under out/name: its LIVE_RUNS live replays and its judging."""
    from sim.config import parse_config

    from validation.replay import replay_config

    d = request_config(spec, cal, quick)
    (out / name).mkdir(parents=True)
    (out / name / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    lives = [out / name / f"live{i + 1}" for i in range(LIVE_RUNS)]
    return Planned(lives, lambda live: fresh_process(replay_config, parse_config(d, out / name),
                                                     live),
                   lambda: judge_requests(name, d, out / name, lives))


def judge_requests(name: str, d: dict, out_dir: Path, lives: list[Path]) -> dict:
    """Simulate the request workload config `d` into out_dir and judge it against its live
    runs (`rejudge` does it again for another calibration): the table row."""
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
        at_probe = compare(out_dir / "sim_at_probe" / "sim", lives[0])
        for m in REQUEST_METRICS:
            judge_at_probe(metrics[m], at_probe[m]["sim"])
    return {"workload": name, "kind": "requests", "metrics": metrics, "step_speed": speeds,
            **probe_levels(probe)}


def probe_levels(probe: dict) -> dict:
    """A table row's speed-probe levels (`sim.step_time.live_speed.probes_level`; None without)."""
    return {"probe_level": probe.get("decode"), "probe_prefill_level": probe.get("prefill"),
            "probe_prefill_factor": probe.get("prefill_factor"),
            "probe_against": probe.get("against")}


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
    """A live run's decode and prefill steps over the calibration's prediction (medians)."""
    speed = speed or {}
    return {"decode": speed.get("decode_step_ratio"), "prefill": speed.get("prefill_step_ratio")}


def request_config(spec: dict, cal: Path, quick: bool) -> dict:
    """The simulation config of a suite's request workload on calibration `cal`."""
    workload = dict(spec["workload"])
    if quick and "quick_requests" in spec:
        workload["num_requests"] = spec["quick_requests"]
    return {"seed": spec.get("seed", 0), "workload": workload,
            "cluster": {"replicas": [{"calibration": str(cal), "count": 1,
                                      **spec.get("replica", {})}]}}


def program_config(spec: dict, cal: Path, quick: bool) -> dict:
    """The simulation config of a suite's program workload (an example config, its paths
    relative to `examples/`) on calibration `cal`."""
    from sim.config import read_yaml
    from traces.store import read_run

    example = REPO / "examples" / spec["program"]
    d = read_yaml(example)
    d["workload"]["programs"]["count"] = spec.get("quick_count" if quick else "count",
                                                  spec.get("count", 16))
    d["cluster"]["replicas"][0]["calibration"] = str(cal)
    # The live program engine pages KV (and caches the shared reasoning prefixes) in the
    # blocks its trace ran with, not the grid engine's: simulate that engine.
    trace = (example.parent / d["workload"]["programs"]["trace"]).resolve()
    d["cluster"]["replicas"][0]["block_size"] = int(
        read_run(trace)["params"]["engine"].get("block_size", 32))
    d["output"] = {"steps": True}
    return d


def program_workload(name: str, spec: dict, cal: Path, out: Path, quick: bool) -> Planned:
    """One program workload (an example config with this machine's calibration) set up under
    out/name: its LIVE_RUNS live replays and its judging (decision agreement too)."""
    from live.replay import replay_workload
    from sim.config import parse_config

    example = REPO / "examples" / spec["program"]
    d = program_config(spec, cal, quick)
    (out / name).mkdir(parents=True)
    (out / name / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    cfg = parse_config(d, example.parent)
    wl = cfg.programs
    lives = [out / name / f"live{i + 1}" for i in range(LIVE_RUNS)]
    return Planned(lives, lambda live: fresh_process(
        replay_workload, wl, cfg.scheduler, live, seed=cfg.seed,
        max_num_seqs=cfg.replicas[0].max_num_seqs, config_json=cfg.to_json()),
        lambda: judge_programs(name, d, out / name, lives))


def judge_programs(name: str, d: dict, out_dir: Path, lives: list[Path]) -> dict:
    """Simulate the program workload config `d` (an example's, paths relative to examples/)
    into out_dir and judge it against its live runs: the table row with decision agreement."""
    from sim.config import parse_config
    from sim.step_time.live_speed import probes_level, step_speed_ratio
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from validation.judge import judge, judge_at_probe
    from traces.store import read_table

    base_dir = REPO / "examples"
    sim, band = simulate_with_band(parse_config(d, base_dir), out_dir / "sim")
    live_tables = [read_table(live, "programs").to_pandas() for live in lives]
    results = [compare(sim.programs.to_pandas(), t) for t in live_tables]
    # the live engine against itself: batch-dependent numerics can flip a sampled probe answer
    live_agreement = (compare(live_tables[0], live_tables[1])["decision_agreement"]
                      if len(live_tables) > 1 else 1.0)
    # every chunk and probe samples with a seed: the prediction the ratio divides by says so
    cal = d["cluster"]["replicas"][0]["calibration"]
    speeds = [step_speed_ratio(cal, live, all_seeded=True, decode_only=True) for live in lives]
    leveled = [programs_at_live_speed(d, f, out_dir / f"sim_at_live{i + 1}", live, base_dir)
               for i, (f, live) in enumerate(zip(speeds, lives))]
    metrics = {m: judge(results[0]["sim"]["program_latency_s"][m[-3:]],
                        [r["live"]["program_latency_s"][m[-3:]] for r in results],
                        PROGRAM_TOLERANCE[m], band.get(m))
               for m in ("program_latency_p50", "program_latency_p90")}
    leveled_errors(metrics, leveled)
    probe = probes_level(cal, lives) or {}
    if probe:  # simulated at the speeds the probes measured around the live runs
        at_probe = simulate(scaled_config(d, probe["decode"], out_dir / "sim_at_probe", base_dir,
                                          probe["prefill_factor"]))
        lat = compare(at_probe.programs.to_pandas(), live_tables[0])["sim"]["program_latency_s"]
        for m in ("program_latency_p50", "program_latency_p90"):
            judge_at_probe(metrics[m], lat[m[-3:]])
    metrics["tokens_per_program"] = judge(results[0]["sim"]["tokens_per_program"],
                                          [r["live"]["tokens_per_program"] for r in results],
                                          PROGRAM_TOLERANCE["tokens_per_program"])
    agreement = min(r["decision_agreement"] for r in results)
    return {"workload": name, "kind": "programs", "metrics": metrics,
            "decision_agreement": agreement, "live_agreement": live_agreement,
            # as the latency metrics: no further off than live is from live (1.0 if exact)
            "agreement_ok": agreement >= live_agreement,
            "step_speed": [{"decode": f, "prefill": None} for f in speeds],
            **probe_levels(probe)}


def programs_at_live_speed(d: dict, factor: float | None, out_dir: Path, live: Path,
                           base_dir: Path) -> dict | None:
    """A program workload's latency errors against one live run with the simulation's step
    times scaled to that run's decode speed (`at_live_speed`, for programs)."""
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from traces.store import read_table

    if factor is None:
        return None
    cfg = scaled_config(d, factor, out_dir, base_dir)
    c = compare(simulate(cfg).programs.to_pandas(), read_table(live, "programs").to_pandas())
    med = sampled_medians(cfg)
    return {m: (err, med[m] / c["live"]["program_latency_s"][m[-3:]] - 1)
            for m, err in c["error"].items() if m in ("program_latency_p50", "program_latency_p90")}


def scaled_config(d: dict, factor: float, out_dir: Path, base_dir: Path,
                  prefill_factor: float | None = None):
    """The one-replica-group config `d` with its calibration's step times scaled by `factor`
    (its prefill terms by `prefill_factor`, where given; the scaled calibration written under
    out_dir)."""
    from sim.config import parse_config
    from sim.step_time.live_speed import scaled_calibration

    group = d["cluster"]["replicas"][0]
    cal = scaled_calibration(group["calibration"], factor, out_dir / "calibration.json",
                             prefill_factor)
    return parse_config({**d, "cluster": {**d["cluster"], "replicas": [
        {**group, "calibration": str(cal)}]}}, base_dir)


def run_fidelity(out: Path, quick: bool = False, suite_path: Path = SUITE,
                 progress: bool = True) -> dict:
    """The whole loop; writes DIR/fidelity.json and DIR/report.md and returns the result."""
    suite = load_suite(suite_path)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cal = trace_and_calibrate(out, suite, quick, progress)
    calibrated_s = round(time.perf_counter() - t0, 1)
    from sim.step_time.calibration import load_calibration

    calibration = load_calibration(cal)
    plans = [(program_workload if "program" in spec else request_workload)(
        name, spec, cal, out, quick) for name, spec in suite["workloads"].items()
        if not quick or spec.get("quick")]
    # Pass by pass, not workload by workload: a workload's live runs lie a whole pass apart
    # (minutes), as its simulation lies minutes from the calibration's traces. Back to back,
    # two runs share the shared machine's speed of the moment, and their spread missed the
    # drift every sim-vs-live comparison includes (0.93-1.13x within one suite).
    started = {}
    for i in range(LIVE_RUNS):
        for p in plans:
            started[p.lives[i]] = round(time.perf_counter() - t0, 1)
            p.replay(p.lives[i])
    rows = [{**p.judge(), "live_started_s": [started[live] for live in p.lives]}
            for p in plans]
    result = {"quick": quick, "calibration": str(cal), "device": calibration.provenance["device"],
              "calibration_heldout": {k: v for k, v in calibration.heldout.items()
                                      if k in ("mape", "p90_ape", "rows")},
              "workloads": rows, "calibrated_s": calibrated_s,
              "wall_s": round(time.perf_counter() - t0, 1)}
    inside = [x for r in rows for m in r["metrics"].values() for x in m.get("in_band", [])]
    result["band_coverage"] = {"inside": sum(inside), "of": len(inside), "band": "5-95%",
                               "seeds": BAND_SEEDS}
    result["ok"] = all(m["ok"] for r in rows for m in r["metrics"].values()) and all(
        r.get("agreement_ok", True) for r in rows)
    (out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    from validation.fidelity_report import report

    (out / "report.md").write_text(report(result))
    return result

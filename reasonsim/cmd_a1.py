"""`reasonsim trace conformity` and `reasonsim a1 ...`: A1 on conformity traces."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonsim.cmd_a1_analysis import add_analysis_parsers
from reasonsim.cmd_a1_scaling import add_scaling_parsers
from reasonsim.common import (CACHE_GB, CALIBRATION_SEED_OFFSET, TEMPERATURE, TESTBED, UserError,
                             add_speed_checks, calibrate_pools, check_speed_checks, int_at_least,
                             print_summary, program_config, seed_int)


def cmd_trace_conformity(args: argparse.Namespace) -> int:
    """`reasonsim trace conformity`."""
    from policies.a1 import A1Settings
    from live.conformity import ConformityWorkload, trace_conformity

    try:
        wl = ConformityWorkload(
            questions_per_cell=args.questions, samples=args.samples,
            calib_samples=args.calib_samples, alphas=tuple(args.alphas), seed=args.seed,
            calib_draft_tokens=args.calib_draft_tokens, thresholds=tuple(args.thresholds or ()),
            settings=A1Settings(samples=args.samples, turns=args.turns,
                                draft_tokens=args.draft_tokens, target_tokens=args.target_tokens,
                                temperature=args.temperature))
    except ValueError as e:
        raise UserError(str(e)) from None
    summary = trace_conformity(args.draft, args.target, args.out, wl,
                               kv_cache_gb=args.kv_cache_gb, progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def add_trace_parser(tsub) -> None:
    """The `trace conformity` subparser."""
    from reasonsim.common import floats

    c = tsub.add_parser("conformity", help="A1 draft steps scored by the target on two vLLM "
                        "engines", description="Run A1 over held-out testbed questions on two "
                        "in-process vLLM engines (draft, target): a calibration phase of draft-"
                        "only paths on questions never evaluated, then every evaluated sample "
                        "under every policy of the grid (baselines, conformal per coverage x "
                        "alpha) as one path tree; every node's draft step, score, p-values and "
                        "the target's own step go to the conformity table.")
    c.add_argument("--draft", default=str(TESTBED / "draft"), help="draft model directory")
    c.add_argument("--target", default=str(TESTBED / "target-large"),
                   help="target model directory")
    c.add_argument("-o", "--out", required=True, help="trace directory to write")
    c.add_argument("--questions", type=int_at_least(1), default=3,
                   help="evaluation questions per family x level (as many for calibration)")
    c.add_argument("--samples", type=int_at_least(1), default=8,
                   help="evaluated paths per question")
    c.add_argument("--calib-samples", type=int_at_least(1), default=8,
                   help="calibration paths per evaluated question (conditional coverage)")
    c.add_argument("--alphas", type=floats, default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    c.add_argument("--turns", type=int_at_least(1), default=16, help="T: most steps a path takes")
    c.add_argument("--draft-tokens", type=int_at_least(1), default=32,
                   help="Kd: longest draft step")
    c.add_argument("--calib-draft-tokens", type=int_at_least(1), default=None,
                   help="Kd of the calibration phase (default: --draft-tokens; another length "
                   "is A1's calibration-sampling mismatch)")
    c.add_argument("--thresholds", type=floats, default=None,
                   help="fixed-threshold baselines (mean NLL) traced beside the conformal grid")
    c.add_argument("--target-tokens", type=int_at_least(1), default=32,
                   help="Kt: longest target step")
    c.add_argument("--temperature", type=TEMPERATURE, default=0.8)
    c.add_argument("--kv-cache-gb", type=CACHE_GB, default=0.5, help="KV cache per engine")
    c.add_argument("--seed", type=seed_int, default=0)
    c.add_argument("--json", action="store_true")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=cmd_trace_conformity)


def add_a1_parser(sub) -> None:
    """The `a1` command group."""
    a1 = sub.add_parser("a1", help="A1 (conformal draft/target test-time scaling) experiments")
    asub = a1.add_subparsers(dest="a1_command", required=True, metavar="EXPERIMENT")
    add_analysis_parsers(asub)
    r = asub.add_parser("replay", help="an A1 config live on two vLLM engines vs simulated",
                        description="Run the config's A1 programs live on two in-process vLLM "
                        "engines (draft, target) with the simulator's program and policy "
                        "objects, --repeats times (each in a fresh process: the live-vs-live "
                        "spread), simulate the same config, and report decision agreement (same "
                        "decision string per path) and sim-vs-live latency and throughput errors.")
    r.add_argument("config", help="an A1 program config with a draft and a target replica")
    r.add_argument("-o", "--out", default="reports/a1-replay")
    r.add_argument("--count", type=int_at_least(1), default=None,
                   help="override the number of programs")
    r.add_argument("--repeats", type=int_at_least(1), default=2,
                   help="live runs (>= 2 gives the spread)")
    r.add_argument("--seed", type=seed_int, default=None, help="override the config's seed")
    r.add_argument("--calibrate-here", action="store_true",
                   help="first serve other programs of the config (seed "
                   f"+ {CALIBRATION_SEED_OFFSET}) live, and simulate with draft and target "
                   "calibrations fitted on that run's steps (this machine, now)")
    add_speed_checks(r)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_a1_replay)
    add_scaling_parsers(asub)


def _config(path: Path, count: int | None, seed: int | None = None,
            calibrations: dict[str, str] | None = None):
    """The config and its A1 program workload (count, seed and, by pool, calibrations
    overridden)."""
    return program_config(path, "a1", count, seed, calibrations=calibrations)


def live_job(config: str, count: int | None, seed: int | None, out_dir: str) -> None:
    """One live A1 replay (run in its own process): tables, then a1.json with its summary."""
    import pandas as pd

    from live.a1 import replay_a1
    from sim.families.a1.metrics import a1_summary, request_log
    from traces.store import read_table

    cfg, wl = _config(Path(config), count, seed)
    out = Path(out_dir)
    res = replay_a1(wl, cfg, out)
    runs = res["runs"]
    requests = pd.concat([read_table(out, "requests").to_pandas(),
                          read_table(out / "draft", "requests").to_pandas()])
    progs = read_table(out, "programs").to_pandas()
    makespan = float(progs.finish_s.max() - progs.arrival_s.min())
    steps = {role: read_table(d, "steps").to_pandas()
             for role, d in (("target", out), ("draft", out / "draft"))}
    busy = {role: float(s.duration_ms.sum()) / 1e3 for role, s in steps.items()}
    log = request_log({r.key: r.program for r in runs}, requests)
    summary = a1_summary([r.program for r in runs], log, busy, makespan)
    summary.update({f"{role}_kv_peak_blocks": int(s.kv_blocks_used.max())
                    for role, s in sorted(steps.items())})
    summary["rescored_scores"] = res["rescored"]
    (out / "a1.json").write_text(json.dumps(summary, indent=1) + "\n")


def cmd_a1_replay(args: argparse.Namespace) -> int:
    """`reasonsim a1 replay`: the config live (twice: the noise floor) and simulated, compared."""
    from traces.store import check_out_dir, read_table
    from validation.a1 import replay_result
    from validation.judge import machine_speed
    from validation.replay import fresh_process

    path = Path(args.config)
    try:
        cfg, _ = _config(path, args.count, args.seed)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    check_speed_checks(args)
    out = check_out_dir(args.out, resume=False, can_resume=False)  # before any engine starts
    cal = out / "calibration"
    if args.calibrate_here:  # other programs first, live here: each pool calibrated on them
        fresh_process(live_job, str(path), args.count, cfg.seed + CALIBRATION_SEED_OFFSET,
                      str(cal / "live0"))
        calibrations = calibrate_pools({"target": [cal / "live0"],
                                        "draft": [cal / "live0" / "draft"]}, [cal / "live0"], cal)
        cfg, _ = _config(path, args.count, args.seed, calibrations)
    lives = []
    for i in range(args.repeats):
        d = out / f"live{i}"
        fresh_process(live_job, str(path), args.count, args.seed, str(d))
        if args.speed_checks:  # the calibration's programs again, right after the live run
            fresh_process(live_job, str(path), args.count, cfg.seed + CALIBRATION_SEED_OFFSET,
                          str(cal / f"check{i + 1}"))
        lives.append((read_table(d, "programs").to_pandas(),
                      read_table(d, "conformity").to_pandas(),
                      json.loads((d / "a1.json").read_text())))
    result, s_progs = replay_result(cfg, out, lives)
    result["machine_speed"] = speed = machine_speed(out / "sim", [out / f"live{i}" for i in
                                                                  range(args.repeats)])
    result["at_live_speed"] = _at_live_speed(cfg, path, args, out, lives, speed)
    if args.speed_checks:
        result["judged"] = _judged_beside(cfg, path, args, out, lives, result)
    if args.calibrate_here:
        result["calibrations"] = calibrations
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if speed["warning"]:
        print(speed["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_replay(result, f"A1 sim vs live: {path.name}, {len(s_progs)} programs", lives)
    print(f"details: {out / 'compare.json'}")
    return 0


def _per_run(cfg, path: Path, args, out: Path, lives: list, levels: list[dict]) -> list[dict]:
    """Per live run, the comparison with it of the config simulated with each pool's
    calibration scaled by that run's level on the pool (written under out/live<i>)."""
    from sim.step_time.live_speed import scaled_calibration
    from validation.a1 import replay_result

    results = []
    for i, (live, run_levels) in enumerate(zip(lives, levels)):
        at = out / f"live{i}"
        scaled = {g.pool: str(scaled_calibration(g.calibration, run_levels.get(g.pool, 1.0),
                                                 at / f"{g.pool}.calib.json"))
                  for g in cfg.replicas}
        results.append(replay_result(_config(path, args.count, args.seed, scaled)[0], at,
                                     [live])[0])
    return results


def _judged_beside(cfg, path: Path, args, out: Path, lives: list, result: dict) -> dict:
    """`--speed-checks`: each live run simulated at the decode level of the calibration-traffic
    runs beside it on each pool (`validation.beside_checks`), judged against the live runs'
    mean: the levels and each metric's error, spread and verdict."""
    from validation.beside_checks import beside_levels, judge_quantiles

    cal = out / "calibration"
    checks = [cal / f"check{i + 1}" for i in range(args.repeats)]
    levels = beside_levels(out / "sim", [cal / "live0", *checks],
                           [out / f"live{i}" for i in range(args.repeats)])
    keys = tuple(result["error_vs_live_mean"])
    sims = [{k: again["compare"][0][k]["sim"] for k in keys}
            for again in _per_run(cfg, path, args, out / "sim_beside", lives, levels)]
    live = [{k: c[k]["live"] for k in keys} for c in result["compare"]]
    return {"levels": levels, "metrics": judge_quantiles(sims, live)}


def _print_replay(result: dict, title: str, lives: list) -> None:
    """`cmd_a1_replay`'s table: each metric simulated, live and its errors; the speed line."""
    from rich.console import Console
    from rich.table import Table

    keys = tuple(result["error_vs_live_mean"])
    t = Table(title=title)
    for c in ("metric", "sim", *[f"live {i}" for i in range(len(lives))],
              "error vs live mean", "live 1 vs live 0"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    c0 = result["compare"][0]
    spread = result.get("live_vs_live", {})
    for key in keys:
        t.add_row(key, f"{c0[key]['sim']:.3f}", *[f"{c[key]['live']:.3f}"
                                                  for c in result["compare"]],
                  f"{result['error_vs_live_mean'][key]:+.1%}",
                  f"{spread[key]['live'] / spread[key]['sim'] - 1:+.1%}" if spread else "-")
    t.add_row("decision agreement", "", *["" for _ in lives],
              " ".join(f"{c['decision_agreement']:.3f}" for c in result["compare"]),
              f"{spread['decision_agreement']:.3f}" if spread else "-")
    t.add_row("rejection rate", f"{result['sim']['rejection_rate'] or 0:.3f}",
              *[f"{lv['rejection_rate'] or 0:.3f}" for lv in result["live"]], "", "")
    Console(width=160).print(t)
    at = result["at_live_speed"]
    if at is not None:
        print("at each live run's decode speed (" + "; ".join(", ".join(
            f"{pool} {v:.2f}x" for pool, v in run.items()) for run in at["levels"])
            + " the calibration's), mean: "
            + ", ".join(f"{k} {e:+.1%}" for k, e in at["error_vs_live_mean"].items()))
    if "judged" in result:
        from validation.beside_checks import judged_line

        print(judged_line(result["judged"]))


def _at_live_speed(cfg, path: Path, args, out: Path, lives: list, speed: dict) -> dict | None:
    """The comparison again per live run, each pool's calibration scaled to that run's decode
    speed on it (`machine_speed`): the machine's drift since calibrating taken out, beside the
    errors as simulated (never instead of them); the levels per run and the mean errors. None
    where a run's speed was not measured."""
    if not all(speed["runs"]):
        return None
    errors = [again["error_vs_live_mean"] for again in
              _per_run(cfg, path, args, out / "sim_at_live", lives, speed["runs"])]
    return {"levels": speed["runs"],
            "error_vs_live_mean": {k: float(sum(e[k] for e in errors) / len(errors))
                                   for k in errors[0]}}

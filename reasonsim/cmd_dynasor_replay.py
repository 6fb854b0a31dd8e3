"""`reasonsim dynasor replay`: a program config served live, beside its simulation."""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

from sim.output import write_sim
from reasonsim.common import (CALIBRATION_SEED_OFFSET, UserError, add_speed_checks,
                             calibrate_pools, check_speed_checks, int_at_least, print_summary,
                             refuse_inside, server_url)


def cmd_dynasor_replay(args: argparse.Namespace) -> int:
    """`reasonsim dynasor replay`."""
    from sim.engine.tables import cached_share
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from traces.store import check_out_dir, read_table
    from validation.fidelity_programs import replay_at_live_speed
    from validation.judge import machine_speed

    path = Path(args.config)
    d, cfg = _load(args, path)
    wl = cfg.programs
    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats}: serve the programs live at least once")
    refuse_inside(args.out, [wl.trace], "--out")
    out = check_out_dir(args.out, resume=False, can_resume=False)  # before any engine starts
    check_speed_checks(args)
    calibration = None
    if args.calibrate_here:
        cfg, calibration = _calibrate_here(args, d, path, cfg, out / "calibration")
    lives = [out / "live"] + [out / f"live{i + 1}" for i in range(1, args.repeats)]
    live_wall_s = _serve_live(args, cfg, lives, out / "calibration")
    sim = simulate(cfg)
    write_sim(cfg, sim, out / "sim")
    result = compare(sim.programs.to_pandas(), read_table(out / "live", "programs").to_pandas())
    if len(lives) > 1:
        result.update(repeat_errors(sim.programs.to_pandas(), lives))
    result["live_wall_s"] = round(live_wall_s, 2)
    # the prefix cache's share of prompt tokens (the eviction order moves it): a count, not a time
    result["cached_prompt_share"] = {"sim": sim.summary["cached_prompt_share"],
                                     "live": cached_share(read_table(out / "live", "requests"))}
    if calibration is not None:
        result["calibration"] = calibration
    result["machine_speed"] = machine_speed(out / "sim", lives)
    # the same simulation at the live run's own decode speed: the machine's drift since
    # calibrating taken out (beside the errors above, never instead of them)
    result["at_live_speed"] = replay_at_live_speed(d, path.parent, out / "live",
                                                   out / "sim_at_live")
    if args.speed_checks:
        result["judged"] = _judged_beside(d, path.parent, cfg.replicas[0].pool, out, lives)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if result["machine_speed"]["warning"]:
        print(result["machine_speed"]["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_replay(result, len(lives))
    print(f"details: {out / 'compare.json'}")
    return 0


def _serve_live(args, cfg, lives: list[Path], cal_dir: Path) -> float:
    """The config's programs served live into each of `lives` (with --speed-checks, the
    calibration's programs after each, into cal_dir/check<i>); a live run's mean wall time."""
    from live.replay import engine_args, replay_workload
    from validation.replay import fresh_process

    # The live runner draws the same programs from the same workload and seed as the simulator;
    # an in-process engine in a process of its own (`fresh_process`: after the calibration run's
    # engine it would meet fewer never-run shapes than the simulator's fresh replica).
    live_job = partial(fresh_process, replay_workload) if args.url is None else replay_workload
    wall_s = 0.0
    for i, live in enumerate(lives):
        t0 = time.perf_counter()
        live_job(cfg.programs, cfg.scheduler, live, seed=cfg.seed, **engine_args(cfg),
                 model=args.model, url=args.url, config_json=cfg.to_json(), device=args.device)
        wall_s += (time.perf_counter() - t0) / len(lives)
        if args.speed_checks:  # the calibration's programs again, right after the live run
            _serve_calibration(args, cfg, cal_dir / f"check{i + 1}")
    return wall_s


def _load(args, path: Path):
    """The config (as read, and checked): one replica, a program workload, the trace's engine."""
    from programs.workload import load_bank
    from sim.config import parse_config, read_yaml

    d = read_yaml(path)
    if args.count is not None:
        d["workload"]["programs"]["count"] = args.count
    try:
        cfg = parse_config(d, path.parent)
        if len(cfg.replicas) != 1 or cfg.replicas[0].count != 1:
            raise ValueError("live program replay drives one engine: the config needs one replica")
        if cfg.programs is None:
            raise ValueError("dynasor replay needs a program workload (workload.programs)")
        load_bank(cfg.programs)
        _check_engine(args, cfg.programs.trace, cfg)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    return d, cfg


def _print_replay(result: dict, runs: int) -> None:
    """The replay's agreement, errors and errors at live speed, as text."""
    print(f"decision agreement {result['decision_agreement']:.3f}, answer agreement "
          f"{result['answer_agreement']:.3f} over {result['programs']} programs")
    share = result["cached_prompt_share"]
    print(f"prompt tokens found cached: {share['sim']:.1%} simulated, {share['live']:.1%} live")
    print_summary(result["error"], False)
    if "live_spread" in result:
        print(f"over {runs} live runs: " + ", ".join(
            f"{m.removeprefix('program_latency_').upper()} {e:+.1%} against their mean "
            f"(live-vs-live spread {result['live_spread'][m]:.1%})"
            for m, e in result["error_vs_live_mean"].items()))
    at = result["at_live_speed"]
    if at is not None:
        print(f"at the live run's decode speed ({at['decode_level']:.2f}x the calibration's): "
              + ", ".join(f"{m.removeprefix('program_latency_').upper()} {e:+.1%} (noise "
                          f"draws' median {at['error_sampled'][m]:+.1%})"
                          for m, e in at["error"].items()))
    if "judged" in result:
        from validation.beside_checks import judged_line

        print(judged_line(result["judged"]))


def latency_quantiles(programs) -> dict[str, float]:
    """A programs table's program latency P50 and P90 (s)."""
    from sim.program_metrics import program_summary

    lat = program_summary(programs)["program_latency_s"]
    return {f"program_latency_{k}": lat[k] for k in ("p50", "p90")}


def repeat_errors(sim_programs, lives: list[Path]) -> dict:
    """Program latency P50/P90 of the simulation against the live runs' mean
    (`error_vs_live_mean`), and the runs' spread (max - min over their mean, `live_spread`)."""
    from traces.store import read_table

    sim = latency_quantiles(sim_programs)
    live = [latency_quantiles(read_table(d, "programs").to_pandas()) for d in lives]
    mean = {m: sum(q[m] for q in live) / len(live) for m in sim}
    return {"error_vs_live_mean": {m: sim[m] / mean[m] - 1 for m in sim},
            "live_spread": {m: (max(q[m] for q in live) - min(q[m] for q in live)) / mean[m]
                            for m in sim}}


def _check_engine(args, trace, cfg) -> None:
    """`--engine` must name the engine the program trace was recorded on: only that engine's
    sampling reproduces its trajectories; only the in-process vLLM engine takes a pool size
    and eviction hints."""
    from traces.store import read_run

    run = read_run(trace)
    traced = run["engine"]
    if args.model is not None:
        from engines.model_dir import check_same_model

        check_same_model(args.model, run["model_config_hash"], f"{trace} was recorded on")
    if (args.url or traced == "torch") and (cfg.kv_eviction != "free_order"
                                            or cfg.replicas[0].kv_blocks is not None):
        where = "--url's server" if args.url else "the PyTorch engine (the trace's)"
        raise ValueError(f"kv_blocks / kv_eviction: {where} takes neither; the in-process vLLM "
                         "engine does")
    if args.engine is not None and args.engine != traced:
        raise ValueError(f"--engine {args.engine}: {trace} was recorded on {traced}, whose "
                         f"sampling the replay must reproduce; trace it on {args.engine}")
    if traced == "torch" and args.url:
        raise ValueError(f"--url: {trace} was recorded on the PyTorch engine, which serves "
                         "no URL; replay it in-process")


def _calibrate_here(args, d: dict, path: Path, cfg, cal_dir: Path):
    """`--calibrate-here`: the config's programs of another seed served live first, the replica
    calibrated on that run's steps (with the loop's host time); the config with it, and its
    path."""
    from sim.config import parse_config

    if args.url:
        raise UserError("--calibrate-here needs the in-process engine (its steps), not --url")
    _serve_calibration(args, cfg, cal_dir / "live")
    pool = cfg.replicas[0].pool
    path_cal = calibrate_pools({pool: [cal_dir / "live"]}, [cal_dir / "live"], cal_dir)[pool]
    d["cluster"]["replicas"][0]["calibration"] = path_cal
    return parse_config(d, path.parent), path_cal


def _serve_calibration(args, cfg, out_dir: Path) -> None:
    """The config's programs of the calibration's seed (+ CALIBRATION_SEED_OFFSET) served live
    into out_dir, in an engine process of their own."""
    from live.replay import engine_args, replay_workload
    from validation.replay import fresh_process

    fresh_process(replay_workload, cfg.programs, cfg.scheduler, out_dir,
                  seed=cfg.seed + CALIBRATION_SEED_OFFSET, **engine_args(cfg), model=args.model,
                  config_json=cfg.to_json(), device=args.device)


def _judged_beside(d: dict, base_dir: Path, pool: str, out: Path, lives: list[Path]) -> dict:
    """`--speed-checks`: each live run's program latency P50/P90 simulated at the decode level
    of the calibration-traffic runs beside it (`validation.beside_checks`), judged against the
    live runs' mean: the levels and each metric's error, spread and verdict."""
    from sim.simulate import simulate
    from traces.store import read_table
    from validation.beside_checks import beside_levels, judge_quantiles
    from validation.fidelity_judging import scaled_config

    cal_dir = out / "calibration"
    checks = sorted(cal_dir.glob("check*"), key=lambda p: int(p.name.removeprefix("check")))
    levels = beside_levels(out / "sim", [cal_dir / "live", *checks], lives)
    sims = [latency_quantiles(simulate(scaled_config(
        d, lv.get(pool, 1.0), out / "sim_beside" / f"live{i + 1}", base_dir)).programs.to_pandas())
            for i, lv in enumerate(levels)]
    lives_q = [latency_quantiles(read_table(x, "programs").to_pandas()) for x in lives]
    return {"levels": levels, "metrics": judge_quantiles(sims, lives_q)}


def add_replay_parser(dysub) -> None:
    """`reasonsim dynasor replay`."""
    rp = dysub.add_parser("replay", help="run a program config live and compare with sim",
                          description="Drive the engine the config's trace was recorded on "
                          "(vLLM, or the PyTorch engine's serving mode) with the config's "
                          "programs and policy objects (probes as prefix-sharing requests, "
                          "stops as aborts, scheduler priorities as the engine's priorities), "
                          "simulate the same config, and report decision agreement and "
                          "sim-vs-live errors.")
    rp.add_argument("config", help="a program workload config with one replica")
    rp.add_argument("-o", "--out", default="reports/dynasor-replay")
    rp.add_argument("--count", type=int_at_least(1), default=None,
                    help="override the number of programs")
    rp.add_argument("--model", default=None, help="model directory (default: the trace's)")
    rp.add_argument("--url", default=None, type=server_url,
                    help="run on this OpenAI-compatible server instead of an in-process engine "
                    "(start it with the trace's block size and, for non-fcfs schedulers, "
                    "--scheduling-policy priority)")
    rp.add_argument("--engine", default=None, choices=["vllm", "torch"],
                    help="the engine to run on: the one the trace was recorded on (default)")
    rp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="the PyTorch engine's device (a trace recorded on it)")
    rp.add_argument("--calibrate-here", action="store_true",
                    help="first serve the config's programs of another seed (+ "
                    f"{CALIBRATION_SEED_OFFSET}) live, and simulate with a calibration fitted "
                    "on that run's steps (this machine, now)")
    rp.add_argument("--repeats", type=int, default=1,
                    help="serve the programs live this many times (the first in OUT/live, the "
                    "rest in OUT/live2...): the simulation judged against their mean, beside "
                    "their spread")
    add_speed_checks(rp)
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_dynasor_replay)

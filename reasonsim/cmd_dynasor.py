"""`reasonsim dynasor ...`: offline replay, threshold calibration, online sweeps, live replay."""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

from sim.output import write_sim
from reasonsim.common import CALIBRATION_SEED_OFFSET, UserError, calibrate_pools, print_summary


def cmd_dynasor_offline(args: argparse.Namespace) -> int:
    """`reasonsim dynasor offline`."""
    from programs.traced import load_trajectories
    from sim.families.dynasor.reasoning import plot_tokens_to_accuracy, tokens_to_accuracy
    from traces.store import read_run

    if read_run(args.trace)["kind"] == "branches":
        return dynasor_offline_search(args)

    trajs, stride = load_trajectories(args.trace)
    rows = tokens_to_accuracy(trajs, stride, windows=args.windows,
                              intervals=args.intervals or [stride, 2 * stride],
                              budgets=args.budgets)
    out = Path(args.out)
    png = plot_tokens_to_accuracy(rows, out / "tokens_to_accuracy.png")
    (out / "tokens_to_accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tokens to accuracy ({len(trajs)} trajectories, stride {stride})")
    for col in ("policy", "window", "interval", "budget", "tokens", "accuracy", "early stop"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["policy"], str(r["window"] or ""), str(r["interval_tokens"] or ""),
                      str(r["budget_tokens"] or ""), f"{r['tokens_mean']:.1f}",
                      f"{r['accuracy']:.3f}", f"{r['stopped_early_share']:.2f}")
    Console().print(table)
    print(f"plot: {png}")
    return 0


def dynasor_offline_search(args: argparse.Namespace) -> int:
    """`reasonsim dynasor offline` on a branches trace."""
    from sim.families.dynasor.search import plot_search_curves, search_tokens_to_accuracy

    rows = search_tokens_to_accuracy(args.trace, sc_per_round=args.per_round)
    out = Path(args.out)
    png = plot_search_curves(rows, out / "search_tokens_to_accuracy.png")
    (out / "search_tokens_to_accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tokens to accuracy ({rows[0]['programs']} programs per policy; "
                  "threshold: certaindex 1-H/log n at least, baseline-length mean tokens at most)")
    for col in ("method", "policy", "cap", "threshold", "tokens", "requests", "accuracy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["method"], r["policy"], str(r["cap"]),
                      "" if r["threshold"] is None else f"{r['threshold']:g}",
                      f"{r['tokens_mean']:.1f}", f"{r['requests_mean']:.1f}",
                      f"{r['accuracy']:.3f}")
    Console().print(table)
    print(f"plot: {png}")
    return 0


def cmd_dynasor_calibrate(args: argparse.Namespace) -> int:
    """`reasonsim dynasor calibrate`."""
    from sim.families.dynasor.search import calibrate

    try:
        result = calibrate(args.trace, args.method, args.cap, args.signal, args.thresholds,
                           args.detect, args.per_round, args.split_seed)
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.method} cap {args.cap}, signal {args.signal}: calibrated on "
                  f"{result['calibration_questions']} questions, held out "
                  f"{result['held_out_questions']}")
    for col in ("policy", "split", "tokens", "accuracy"):
        table.add_column(col, justify="right")
    for split in ("calibration", "held_out"):
        for name, r in result[split].items():
            if r is not None:
                table.add_row(name, split, f"{r['tokens_mean']:.1f}", f"{r['accuracy']:.3f}")
    Console().print(table)
    print(f"threshold: {result['threshold']}   frontier rules (certaindex >=, solutions): "
          f"{result['frontier_rules']}")
    return 0


def cmd_dynasor_online(args: argparse.Namespace) -> int:
    """`reasonsim dynasor online`."""
    from sim.families.dynasor.online import max_sustainable_rate, plot, sweep

    from sim.sweep import Backend

    out = Path(args.out)
    try:
        with Backend(args.workers) as backend:
            rows = sweep(args.configs, args.schedulers, args.rates, args.slo_scales,
                         out / "sweep", backend, progress=not args.json)
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
    best = max_sustainable_rate(rows, args.target)
    pngs = plot(rows, out)
    result = {"points": rows, "max_sustainable_rate": best}
    (out / "online.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"max sustainable program rate at {args.target:.0%} deadline attainment")
    for col in ("policy", "scheduler", "max rate (1/s)", "accuracy", "tokens/program"):
        table.add_column(col, justify="right")
    for b in best:
        pts = [r for r in rows if (r["policy"], r["scheduler"]) == (b["policy"], b["scheduler"])]
        rate = "below the lowest rate" if b["max_rate_per_s"] is None else \
            f"{b['max_rate_per_s']:.2f}"
        table.add_row(b["policy"], b["scheduler"], rate,
                      f"{sum(r['accuracy'] for r in pts) / len(pts):.3f}",
                      f"{sum(r['tokens_per_program'] for r in pts) / len(pts):.0f}")
    Console().print(table)
    print("plots: " + ", ".join(str(p) for p in pngs))
    return 0


def cmd_dynasor_replay(args: argparse.Namespace) -> int:
    """`reasonsim dynasor replay`."""
    from live.replay import engine_args, replay_workload
    from programs.workload import load_bank
    from sim.config import parse_config, read_yaml
    from sim.engine.tables import cached_share
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from traces.store import read_table
    from validation.fidelity_programs import replay_at_live_speed
    from validation.judge import machine_speed
    from validation.replay import fresh_process

    path = Path(args.config)
    d = read_yaml(path)
    if args.count is not None:
        d["workload"]["programs"]["count"] = args.count
    try:
        cfg = parse_config(d, path.parent)
        if len(cfg.replicas) != 1 or cfg.replicas[0].count != 1:
            raise ValueError("live program replay drives one engine: the config needs one replica")
        wl = cfg.programs
        if wl is None:
            raise ValueError("dynasor replay needs a program workload (workload.programs)")
        load_bank(wl)
        _check_engine(args, wl.trace, cfg)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    out = Path(args.out)
    calibration = None
    if args.calibrate_here:
        cfg, calibration = _calibrate_here(args, d, path, cfg, out / "calibration")
        wl = cfg.programs
    t0 = time.perf_counter()
    # The live runner draws the same programs from the same workload and seed as the simulator;
    # an in-process engine in a process of its own (`fresh_process`: after the calibration run's
    # engine it would meet fewer never-run shapes than the simulator's fresh replica).
    live_job = partial(fresh_process, replay_workload) if args.url is None else replay_workload
    live_job(wl, cfg.scheduler, out / "live", seed=cfg.seed, **engine_args(cfg),
             model=args.model, url=args.url, config_json=cfg.to_json(), device=args.device)
    live_wall_s = time.perf_counter() - t0
    sim = simulate(cfg)
    write_sim(cfg, sim, out / "sim")
    result = compare(sim.programs.to_pandas(), read_table(out / "live", "programs").to_pandas())
    result["live_wall_s"] = round(live_wall_s, 2)
    # the prefix cache's share of prompt tokens (the eviction order moves it): a count, not a time
    result["cached_prompt_share"] = {"sim": sim.summary["cached_prompt_share"],
                                     "live": cached_share(read_table(out / "live", "requests"))}
    if calibration is not None:
        result["calibration"] = calibration
    result["machine_speed"] = machine_speed(out / "sim", [out / "live"])
    # the same simulation at the live run's own decode speed: the machine's drift since
    # calibrating taken out (beside the errors above, never instead of them)
    result["at_live_speed"] = replay_at_live_speed(d, path.parent, out / "live",
                                                   out / "sim_at_live")
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if result["machine_speed"]["warning"]:
        print(result["machine_speed"]["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"decision agreement {result['decision_agreement']:.3f}, answer agreement "
          f"{result['answer_agreement']:.3f} over {result['programs']} programs")
    share = result["cached_prompt_share"]
    print(f"prompt tokens found cached: {share['sim']:.1%} simulated, {share['live']:.1%} live")
    print_summary(result["error"], False)
    at = result["at_live_speed"]
    if at is not None:
        print(f"at the live run's decode speed ({at['decode_level']:.2f}x the calibration's): "
              + ", ".join(f"{m.removeprefix('program_latency_').upper()} {e:+.1%} (noise "
                          f"draws' median {at['error_sampled'][m]:+.1%})"
                          for m, e in at["error"].items()))
    print(f"details: {out / 'compare.json'}")
    return 0


def _check_engine(args, trace, cfg) -> None:
    """`--engine` must name the engine the program trace was recorded on: only that engine's
    sampling reproduces its trajectories; only the in-process vLLM engine takes a pool size
    and eviction hints."""
    from traces.store import read_run

    traced = read_run(trace)["engine"]
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
    from live.replay import engine_args, replay_workload
    from sim.config import parse_config
    from validation.replay import fresh_process

    if args.url:
        raise UserError("--calibrate-here needs the in-process engine (its steps), not --url")
    fresh_process(replay_workload, cfg.programs, cfg.scheduler, cal_dir / "live",
                  seed=cfg.seed + CALIBRATION_SEED_OFFSET, **engine_args(cfg), model=args.model,
                  config_json=cfg.to_json(), device=args.device)
    pool = cfg.replicas[0].pool
    path_cal = calibrate_pools({pool: [cal_dir / "live"]}, [cal_dir / "live"], cal_dir)[pool]
    d["cluster"]["replicas"][0]["calibration"] = path_cal
    return parse_config(d, path.parent), path_cal


def add_dynasor_parser(sub) -> None:
    """The `dynasor` command group."""
    dy = sub.add_parser("dynasor", help="Dynasor experiments on probes traces")
    dysub = dy.add_subparsers(dest="dynasor_command", required=True, metavar="EXPERIMENT")
    _add_offline_parser(dysub)
    _add_calibrate_parser(dysub)
    _add_online_parser(dysub)
    _add_replay_parser(dysub)
    from reasonsim.cmd_dynasor_analysis import (add_ablation_parser, add_allocation_parser,
                                                add_correlate_parser, add_fairness_parser)

    add_correlate_parser(dysub)
    add_fairness_parser(dysub)
    add_allocation_parser(dysub)
    add_ablation_parser(dysub)


def _add_offline_parser(dysub) -> None:
    """`reasonsim dynasor offline`."""
    from reasonsim.common import ints

    off = dysub.add_parser("offline", help="tokens-to-accuracy of certaindex vs fixed budgets",
                           description="Replay probe-consistency stopping (window x interval) "
                           "and fixed token budgets counterfactually on a probes trace; or, on a "
                           "branches trace, certaindex stops vs baseline-even caps for SC, MCTS "
                           "and Rebase.")
    off.add_argument("trace", help="probes or branches trace directory (reasonsim trace ...)")
    off.add_argument("-o", "--out", default="reports/dynasor", help="directory for plot + JSON")
    off.add_argument("--windows", type=ints, default=[2, 3, 4, 5], help="e.g. 2,3,4,5")
    off.add_argument("--intervals", type=ints, default=None,
                     help="probe intervals in tokens (multiples of the stride; default: stride, "
                     "2 x stride)")
    off.add_argument("--budgets", type=ints, default=[32, 64, 96, 128, 160, 192, 256])
    off.add_argument("--json", action="store_true")
    off.add_argument("--per-round", type=int, default=2,
                     help="branches traces: self-consistency paths per round")
    off.set_defaults(func=cmd_dynasor_offline)


def _add_calibrate_parser(dysub) -> None:
    """`reasonsim dynasor calibrate`."""
    from reasonsim.common import floats

    ca = dysub.add_parser("calibrate", help="profiler-guided certaindex threshold and Pareto "
                          "frontier on a branches trace",
                          description="Split the questions (seeded, by difficulty); on the "
                          "calibration half choose the most aggressive threshold, and fit a "
                          "Pareto-frontier curve, that keep the cap's accuracy; report both on "
                          "the held-out half against baseline-even.")
    ca.add_argument("trace", help="branches trace directory (reasonsim trace branches)")
    ca.add_argument("--method", choices=["sc", "mcts", "rebase"], required=True)
    ca.add_argument("--cap", type=int, required=True,
                    help="samples (sc), iterations (mcts) or width (rebase)")
    ca.add_argument("--signal", choices=["entropy", "reward"], default="entropy")
    ca.add_argument("--thresholds", type=floats, default=None,
                    help="candidates; default: 0.05..0.95 (entropy), the traced rewards (reward)")
    ca.add_argument("--detect", type=int, default=None,
                    help="detect@knob: check once at this many solutions (default: every round)")
    ca.add_argument("--per-round", type=int, default=0, help="sc: paths per round")
    ca.add_argument("--split-seed", type=int, default=0)
    ca.add_argument("--json", action="store_true")
    ca.set_defaults(func=cmd_dynasor_calibrate)


def _add_online_parser(dysub) -> None:
    """`reasonsim dynasor online`."""
    from reasonsim.common import floats

    on = dysub.add_parser("online", help="deadline attainment vs rate and SLO scale per scheduler",
                          description="Simulate program configs (same cluster, different "
                          "allocation policies) under each scheduler, sweeping the arrival rate "
                          "and the SLO scale; report the max rate at the target attainment.")
    on.add_argument("configs", nargs="+", help="program workload configs (examples/dynasor-*.yaml)")
    on.add_argument("-o", "--out", default="reports/dynasor", help="directory for plots + JSON")
    on.add_argument("--schedulers", type=lambda t: t.split(","),
                    default=["fcfs", "lpm", "app_fifo", "dynasor"])
    on.add_argument("--rates", type=floats, default=[1, 2, 3, 4, 5, 6])
    on.add_argument("--slo-scales", type=floats, default=[0.5, 1, 1.5, 2, 3, 4])
    on.add_argument("--target", type=float, default=0.9, help="attainment target")
    on.add_argument("--workers", type=int, default=2, help="simulations at once (process pool)")
    on.add_argument("--json", action="store_true")
    on.set_defaults(func=cmd_dynasor_online)


def _add_replay_parser(dysub) -> None:
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
    rp.add_argument("--count", type=int, default=None, help="override the number of programs")
    rp.add_argument("--model", default=None, help="model directory (default: the trace's)")
    rp.add_argument("--url", default=None,
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
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_dynasor_replay)

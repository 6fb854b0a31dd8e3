"""`reasonsim dynasor ...`: offline replay, threshold calibration, online sweeps, live replay."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import UserError, fraction, int_at_least, names, refuse_unread, seed_int


def cmd_dynasor_offline(args: argparse.Namespace) -> int:
    """`reasonsim dynasor offline`."""
    from programs.traced import load_trajectories
    from sim.families.dynasor.reasoning import plot_tokens_to_accuracy, tokens_to_accuracy
    from traces.store import read_run

    kind = read_run(args.trace)["kind"]
    branches = kind == "branches"
    refuse_unread(args.trace, kind, {"--windows": args.windows, "--intervals": args.intervals,
                                     "--budgets": args.budgets} if branches
                  else {"--per-round": args.per_round})
    if branches:
        return dynasor_offline_search(args)

    trajs, stride = load_trajectories(args.trace)
    rows = tokens_to_accuracy(trajs, stride, windows=args.windows or [2, 3, 4, 5],
                              intervals=args.intervals or [stride, 2 * stride],
                              budgets=args.budgets or [32, 64, 96, 128, 160, 192, 256])
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

    rows = search_tokens_to_accuracy(args.trace, sc_per_round=args.per_round or 2)
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

    if args.method != "sc" and args.per_round:
        raise UserError(f"--per-round: only sc launches its solutions in rounds, not "
                        f"{args.method}")
    if args.method == "sc" and not args.per_round and args.detect is None:
        # every path at once: no checkpoint before the last, so no threshold can stop one
        raise UserError("--method sc launches every path at once without --per-round N (or "
                        "--detect): certaindex would never stop a program")
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
    first: dict[str, str] = {}  # policy -> the config that ran it
    for r in rows:  # the table keys by policy: two configs' points would be pooled
        if first.setdefault(r["policy"], r["config"]) != r["config"]:
            raise UserError(f"{r['config']} and {first[r['policy']]} run the same policy "
                            f"({r['policy']}); compare configs of different policies")
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


def add_dynasor_parser(sub) -> None:
    """The `dynasor` command group."""
    from reasonsim.cmd_dynasor_replay import add_replay_parser

    dy = sub.add_parser("dynasor", help="Dynasor experiments on probes traces")
    dysub = dy.add_subparsers(dest="dynasor_command", required=True, metavar="EXPERIMENT")
    _add_offline_parser(dysub)
    _add_calibrate_parser(dysub)
    _add_online_parser(dysub)
    add_replay_parser(dysub)
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
    off.add_argument("--windows", type=ints, default=None,
                     help="probes traces: e.g. 2,3,4,5 (the default)")
    off.add_argument("--intervals", type=ints, default=None,
                     help="probe intervals in tokens (multiples of the stride; default: stride, "
                     "2 x stride)")
    off.add_argument("--budgets", type=ints, default=None,
                     help="probes traces: fixed budgets in tokens (default 32,64,...,256)")
    off.add_argument("--json", action="store_true")
    off.add_argument("--per-round", type=int_at_least(1), default=None,
                     help="branches traces: self-consistency paths per round (default 2)")
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
    ca.add_argument("--cap", type=int_at_least(1), required=True,
                    help="samples (sc), iterations (mcts) or width (rebase)")
    ca.add_argument("--signal", choices=["entropy", "reward"], default="entropy")
    ca.add_argument("--thresholds", type=floats, default=None,
                    help="candidates; default: 0.05..0.95 (entropy), the traced rewards (reward)")
    ca.add_argument("--detect", type=int_at_least(1), default=None,
                    help="detect@knob: check once at this many solutions (default: every round)")
    ca.add_argument("--per-round", type=int_at_least(0), default=0, help="sc: paths per round")
    ca.add_argument("--split-seed", type=seed_int, default=0)
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
    on.add_argument("--schedulers", type=names,
                    default=["fcfs", "lpm", "app_fifo", "dynasor"])
    on.add_argument("--rates", type=floats, default=[1, 2, 3, 4, 5, 6])
    on.add_argument("--slo-scales", type=floats, default=[0.5, 1, 1.5, 2, 3, 4])
    on.add_argument("--target", type=fraction, default=0.9, help="attainment target")
    on.add_argument("--workers", type=int_at_least(1), default=2,
                    help="simulations at once (process pool)")
    on.add_argument("--json", action="store_true")
    on.set_defaults(func=cmd_dynasor_online)

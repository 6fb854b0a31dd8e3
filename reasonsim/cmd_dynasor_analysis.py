"""Dynasor's analyses over traces and simulations: `reasonsim dynasor correlate` (certaindex
against the compute a query still needs, `sim.families.dynasor.correlation`) and `reasonsim
dynasor fairness` (finish-time fairness, `sim.families.dynasor.fairness`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import UserError, fraction, int_at_least, names, refuse_unread, seed_int


def cmd_dynasor_correlate(args: argparse.Namespace) -> int:
    """`reasonsim dynasor correlate`."""
    from programs.traced import load_search, load_trajectories, traced_caps
    from sim.families.dynasor.correlation import (correlations, cot_points, plot_correlation,
                                                  sc_points, search_points)
    from traces.store import read_run

    try:
        kind = read_run(args.trace)["kind"]
        refuse_unread(args.trace, kind, {"--method": args.method, "--cap": args.cap}
                      if kind != "branches" else {"--window": args.window})
        args.method, args.window = args.method or "sc", args.window or 3
        if kind == "branches":
            caps = traced_caps(args.trace).get(args.method)
            if not caps or (args.cap is not None and args.cap not in caps):
                raise ValueError(f"{args.trace}: no {args.method} programs"
                                 f"{'' if args.cap is None else f' of cap {args.cap}'} (traced: "
                                 f"{traced_caps(args.trace)})")
            cap = caps[-1] if args.cap is None else args.cap
            bank = load_search(args.trace, args.method, cap)
            points = sc_points if args.method == "sc" else search_points
            detect = args.detect or ([2, 4, 8] if args.method == "sc" else [1, 2, 3])
            rows = [r for d in detect for r in points(bank, d)]
            what = {"sc": "self-consistency", "mcts": "MCTS", "rebase": "Rebase"}[args.method]
            what, unit = f"{what}, cap {cap}", "samples" if args.method == "sc" else "solutions"
        else:
            trajs, _ = load_trajectories(args.trace)
            detect = args.detect or [32, 64, 128]
            rows = [r for d in detect for r in cot_points(trajs, d, args.window)]
            what, unit = f"chain of thought, probe window {args.window}", "tokens"
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
    if not rows:
        raise UserError(f"{args.trace}: no query is still running at detection points {detect}")
    result = {"trace": str(args.trace), "kind": kind, "detect_unit": unit,
              "by_detect": {str(d): correlations([r for r in rows if r["detect"] == d])
                            for d in detect}}
    out = Path(args.out)
    png = plot_correlation(rows, out / "certaindex_correlation.png",
                           f"certaindex vs remaining tokens ({what})")
    (out / "certaindex_correlation.json").write_text(json.dumps({**result, "rows": rows},
                                                                indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    _print(result, what)
    print(f"plot: {png}")
    return 0


def _print(result: dict, what: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"certaindex and other signals vs remaining tokens ({what}; solvable "
                  "queries; negative: more certain, fewer tokens left)")
    for col in (f"detect ({result['detect_unit']})", "queries", "solvable",
                "still needing tokens", "signal", "Pearson r", "Kendall tau"):
        table.add_column(col, justify="right")
    for d, c in result["by_detect"].items():
        for name, v in c["signals"].items():
            table.add_row(d, str(c["queries"]), str(c["solvable"]),
                          str(c["solvable_needing_tokens"]), name, f"{v['pearson']:+.2f}",
                          f"{v['kendall']:+.2f}")
    Console().print(table)


def add_correlate_parser(dysub) -> None:
    """`reasonsim dynasor correlate`."""
    from reasonsim.common import ints

    co = dysub.add_parser("correlate", help="certaindex vs the compute a query still needs",
                          description="At each detection point, every query's certaindex "
                          "beside the oracle's remaining tokens to its correct, stable answer; "
                          "Pearson and Kendall correlations on solvable queries, for certaindex "
                          "and the signals the paper compares it with (mean output length, mean "
                          "normalised log-probability, their linear combination). SC, MCTS or "
                          "Rebase programs of a branches trace, or chain of thought of a probes "
                          "trace.")
    co.add_argument("trace", help="branches or probes trace directory")
    co.add_argument("-o", "--out", default="reports/dynasor", help="directory for plot + JSON")
    co.add_argument("--method", choices=("sc", "mcts", "rebase"), default=None,
                    help="a branches trace's programs to read (certaindex: answer entropy for "
                    "sc, the default; the reward model's mean (mcts) or max (rebase) score)")
    co.add_argument("--cap", type=int_at_least(1), default=None,
                    help="a branches trace's cap (default: the largest traced)")
    co.add_argument("--detect", type=ints, default=None,
                    help="detection points: samples seen (SC; default 2,4,8), solutions found "
                    "(MCTS, Rebase; default 1,2,3) or reasoning tokens (CoT; default 32,64,128)")
    co.add_argument("--window", type=int_at_least(1), default=None,
                    help="CoT: probe answers certaindex reads (default 3)")
    co.add_argument("--json", action="store_true")
    co.set_defaults(func=cmd_dynasor_correlate)


def cmd_dynasor_fairness(args: argparse.Namespace) -> int:
    """`reasonsim dynasor fairness`."""
    from sim.config import read_yaml
    from sim.families.dynasor.fairness import fairness, plot_fairness

    path = Path(args.config)
    try:
        d = read_yaml(path)
        if not isinstance(d, dict) or "programs" not in (d.get("workload") or {}):
            raise ValueError("not a program workload (workload.programs)")
        if args.count is not None:
            d["workload"]["programs"]["count"] = args.count
        rows = fairness(d, path.parent, args.schedulers)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    out = Path(args.out)
    png = plot_fairness(rows, out / "finish_time_fairness.png",
                        f"finish-time fairness ({path.name})")
    (out / "finish_time_fairness.json").write_text(json.dumps(rows, indent=1) + "\n")
    summary = [{k: v for k, v in r.items() if k != "rho"} for r in rows]
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"finish-time fairness rho = T_shared / T_independent ({path.name})")
    for col in ("scheduler", "programs", "mean", "P50", "P90", "P99", "max"):
        table.add_column(col, justify="right")
    for r in summary:
        table.add_row(r["scheduler"], str(r["programs"]), *(f"{r[k]:.2f}" for k in (
            "rho_mean", "rho_p50", "rho_p90", "rho_p99", "rho_max")))
    Console().print(table)
    print(f"plot: {png}")
    return 0


def add_fairness_parser(dysub) -> None:
    """`reasonsim dynasor fairness`."""
    fa = dysub.add_parser("fairness", help="finish-time fairness T_shared / T_independent",
                          description="Simulate a program config's programs alone (spread out: "
                          "the same programs, none overlapping) and shared under each "
                          "scheduler; per program rho = shared latency / independent latency, "
                          "its summary and CDF per scheduler (Dynasor's Fig 20).")
    fa.add_argument("config", help="a program workload config")
    fa.add_argument("-o", "--out", default="reports/dynasor", help="directory for plot + JSON")
    fa.add_argument("--schedulers", type=names,
                    default=["fcfs", "lpm", "app_fifo", "dynasor", "dynasor_sjf"],
                    help="inter-program schedulers, comma-separated")
    fa.add_argument("--count", type=int_at_least(1), default=None,
                    help="override the number of programs")
    fa.add_argument("--json", action="store_true")
    fa.set_defaults(func=cmd_dynasor_fairness)


def cmd_dynasor_allocation(args: argparse.Namespace) -> int:
    """`reasonsim dynasor allocation`."""
    from sim.families.dynasor.allocation import allocation_table

    if not 1 <= args.detect <= args.cap or args.every < 1:
        raise UserError(f"--detect {args.detect} must be in 1..--cap {args.cap} and --every "
                        f"{args.every} >= 1")
    try:
        result = allocation_table(args.trace, args.method, args.cap, args.detect, args.every,
                                  args.split_seed)
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "allocation_variants.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"allocation variants, {args.method} cap {args.cap}: held-out "
                  f"{result['held_out_questions']} questions, chosen on "
                  f"{result['calibration_questions']}")
    for col in ("variant", "tokens", "savings", "accuracy", "policy"):
        table.add_column(col, justify="left" if col in ("variant", "policy") else "right")
    for r in result["rows"]:
        if "tokens_mean" not in r:
            table.add_row(r["variant"], "", "", "", "no candidate keeps the cap's accuracy")
            continue
        table.add_row(r["variant"], f"{r['tokens_mean']:.1f}", f"{r['token_savings']:+.1%}",
                      f"{r['accuracy']:.3f}", r["policy"])
    Console().print(table)
    return 0


def add_allocation_parser(dysub) -> None:
    """`reasonsim dynasor allocation`."""
    al = dysub.add_parser("allocation", help="fine-grained allocation variants (Table 4)",
                          description="Static threshold, initial-step curve fit, k-step and "
                          "single-step thresholds and dynamic curve fit on a branches trace: "
                          "each chosen on half the questions to keep the cap's accuracy, its "
                          "tokens and savings reported on the other half (Dynasor's Table 4).")
    al.add_argument("trace", help="branches trace directory")
    al.add_argument("--method", choices=["sc", "mcts", "rebase"], required=True)
    al.add_argument("--cap", type=int_at_least(1), required=True,
                    help="solutions per program at most")
    al.add_argument("--detect", type=int_at_least(1), default=4,
                    help="static reads: at this solution")
    al.add_argument("--every", type=int_at_least(1), default=5,
                    help="k-step threshold: every k solutions")
    al.add_argument("--split-seed", type=seed_int, default=0)
    al.add_argument("-o", "--out", default="reports/dynasor", help="directory for the JSON")
    al.add_argument("--json", action="store_true")
    al.set_defaults(func=cmd_dynasor_allocation)


def _stops(policy: dict) -> bool:
    """Whether a Dynasor policy spec stops programs early (certaindex, a frontier, a length)."""
    return policy.get("type") in ("certaindex", "frontier", "length") or any(
        k in policy for k in ("entropy_threshold", "reward_threshold", "length_tokens"))


def _check_ablation_pair(even: str, certaindex: str) -> None:
    """The two configs of `dynasor ablation`: program workloads of one method on one trace, the
    first without an early stop, the second with one (each row's ratio is against the first)."""
    from sim.config import read_yaml

    progs = []
    for path in (even, certaindex):
        d = read_yaml(Path(path))
        p = (d.get("workload") or {}).get("programs") if isinstance(d, dict) else None
        if not isinstance(p, dict) or not isinstance(p.get("policy"), dict):
            raise ValueError(f"{path}: not a program config (workload.programs.policy)")
        progs.append((p, p.get("method"), (Path(path).parent / str(p.get("trace"))).resolve()))
    if progs[0][1:] != progs[1][1:]:
        raise ValueError(f"{even} and {certaindex}: not one method on one trace")
    if _stops(progs[0][0]["policy"]) or not _stops(progs[1][0]["policy"]):
        raise ValueError(f"the first config ({even}) must allocate evenly (no early stop) and "
                         f"the second ({certaindex}) stop early (certaindex)")


def cmd_dynasor_ablation(args: argparse.Namespace) -> int:
    """`reasonsim dynasor ablation`."""
    from sim.families.dynasor.online import ABLATION_SCHEDULERS, ablation, plot_ablation, sweep
    from sim.sweep import Backend

    out = Path(args.out)
    try:
        _check_ablation_pair(args.even, args.certaindex)
        with Backend(args.workers) as backend:
            rows = sweep([args.even, args.certaindex], list(ABLATION_SCHEDULERS), args.rates, [],
                         out / "sweep", backend, progress=not args.json)
        steps = ablation(rows, args.target)
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
    (out / "ablation.json").write_text(json.dumps(steps, indent=1) + "\n")
    png = plot_ablation(steps, out / "ablation.png")
    if args.json:
        print(json.dumps(steps))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"component ablation: mean program latency (x the first row) and the "
                  f"max rate at {args.target:.0%} attainment")
    for col in ("allocation", "scheduler", "max rate (1/s)", "x",
                *(f"latency s @{r:g}/s" for r in args.rates)):
        table.add_column(col, justify="right")
    for s in steps:
        rate = "-" if s["max_rate_per_s"] is None else f"{s['max_rate_per_s']:.2f}"
        vs = "-" if s["max_rate_vs_baseline"] is None else f"{s['max_rate_vs_baseline']:.2f}"
        table.add_row(s["policy"], s["scheduler"], rate, vs, *(
            f"{s['mean_latency_s'][r]:.2f} ({s['mean_latency_vs_baseline'].get(r, 1):.2f})"
            for r in args.rates))
    Console().print(table)
    print(f"plot: {png}")
    return 0


def add_ablation_parser(dysub) -> None:
    """`reasonsim dynasor ablation`."""
    from reasonsim.common import floats

    ab = dysub.add_parser("ablation", help="gang, SJF and certaindex contributions (Fig 19)",
                          description="Simulate an even and a certaindex program config over "
                          "arrival rates under LPM (the baseline), + gang (app_fifo), + gang "
                          "and SJF by finished programs' lengths (dynasor) and by each "
                          "program's own estimate (dynasor_sjf, the paper's); mean program "
                          "latency and max sustainable rate per step, each against the even "
                          "allocation under LPM (Dynasor's Fig 19), and their plot.")
    ab.add_argument("even", help="a program config with an even (fixed) allocation")
    ab.add_argument("certaindex", help="the same workload with a certaindex allocation")
    ab.add_argument("--rates", type=floats, default=[1, 2, 3, 4])
    ab.add_argument("--target", type=fraction, default=0.9, help="attainment target")
    ab.add_argument("--workers", type=int_at_least(1), default=2,
                    help="simulations at once (process pool)")
    ab.add_argument("-o", "--out", default="reports/dynasor", help="directory for JSON")
    ab.add_argument("--json", action="store_true")
    ab.set_defaults(func=cmd_dynasor_ablation)

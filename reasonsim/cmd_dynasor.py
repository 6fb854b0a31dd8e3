"""`reasonsim dynasor ...`: offline replay, threshold calibration, online sweeps, live replay."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reasonsim.cmd_sim import write_sim
from reasonsim.common import UserError, print_summary


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

    table = Table(title=f"tokens to accuracy ({rows[0]['programs']} programs per policy)")
    for col in ("method", "policy", "cap", "1-H/log n >=", "tokens", "requests", "accuracy"):
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
    import yaml

    from live.replay import replay_workload
    from programs.workload import load_bank, program_workload
    from sim.config import parse_config
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from traces.store import read_table

    path = Path(args.config)
    d = yaml.safe_load(path.read_text())
    if args.count is not None:
        d["workload"]["programs"]["count"] = args.count
    try:
        cfg = parse_config(d, path.parent)
        if len(cfg.replicas) != 1 or cfg.replicas[0].count != 1:
            raise ValueError("live program replay drives one engine: the config needs one replica")
        wl = program_workload(cfg.workload["programs"], cfg.base_dir)
        load_bank(wl)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    out = Path(args.out)
    t0 = time.perf_counter()
    # The live runner draws the same programs from the same workload and seed as the simulator.
    replay_workload(wl, cfg.scheduler, out / "live", seed=cfg.seed,
                    max_num_seqs=cfg.replicas[0].max_num_seqs, model=args.model, url=args.url,
                    config_json=cfg.to_json())
    live_wall_s = time.perf_counter() - t0
    sim = simulate(cfg)
    write_sim(cfg, sim, out / "sim")
    result = compare(sim.programs.to_pandas(), read_table(out / "live", "programs").to_pandas())
    result["live_wall_s"] = round(live_wall_s, 2)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"decision agreement {result['decision_agreement']:.3f}, answer agreement "
          f"{result['answer_agreement']:.3f} over {result['programs']} programs")
    print_summary(result["error"], False)
    print(f"details: {out / 'compare.json'}")
    return 0

"""`reasonsim trace conformity` and `reasonsim a1 ...`: A1 on conformity traces."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonsim.common import (CALIBRATION_SEED_OFFSET, TESTBED, UserError, calibrate_pools,
                              print_summary, program_config)


def cmd_trace_conformity(args: argparse.Namespace) -> int:
    """`reasonsim trace conformity`."""
    from policies.a1 import A1Settings
    from live.conformity import ConformityWorkload, trace_conformity

    try:
        wl = ConformityWorkload(
            questions_per_cell=args.questions, samples=args.samples,
            calib_samples=args.calib_samples, alphas=tuple(args.alphas), seed=args.seed,
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
    c.add_argument("--questions", type=int, default=3,
                   help="evaluation questions per family x level (as many for calibration)")
    c.add_argument("--samples", type=int, default=8, help="evaluated paths per question")
    c.add_argument("--calib-samples", type=int, default=8,
                   help="calibration paths per evaluated question (conditional coverage)")
    c.add_argument("--alphas", type=floats, default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    c.add_argument("--turns", type=int, default=16, help="T: most steps a path takes")
    c.add_argument("--draft-tokens", type=int, default=32, help="Kd: longest draft step")
    c.add_argument("--target-tokens", type=int, default=32, help="Kt: longest target step")
    c.add_argument("--temperature", type=float, default=0.8)
    c.add_argument("--kv-cache-gb", type=float, default=0.5, help="KV cache per engine")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true")
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=cmd_trace_conformity)


def cmd_a1_offline(args: argparse.Namespace) -> int:
    """`reasonsim a1 offline`: rejection rate vs alpha, accuracy and tokens per policy."""
    from sim.families.a1.offline import offline_grid
    from sim.families.a1.report import plot_rates, plot_tokens_accuracy

    try:
        rows = offline_grid(args.trace, args.alphas, args.samples, args.calib_samples)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_rates(rows, out / "rejection_vs_alpha.png")
        plot_tokens_accuracy(rows, out / "tokens_to_accuracy.png")
        (out / "a1_offline.json").write_text(json.dumps(rows, indent=1))
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"A1 offline on {args.trace}: {rows[0]['questions']} held-out questions")
    cols = ("policy", "samples", "rejection", "|rate - alpha|", "per question", "vote acc",
            "best-of-n", "path acc", "draft tok", "target tok", "score tok", "uncovered")
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right")

    def f(x, fmt):
        return "-" if x is None or x != x else format(x, fmt)

    for r in rows:
        t.add_row(r["policy"], str(r["samples"]), f(r["rejection_rate"], ".3f"),
                  f(r["rate_error"], ".3f"), f(r["question_rate_error"], ".3f"),
                  f(r["accuracy_vote"], ".3f"), f(r["accuracy_best_of_n"], ".3f"),
                  f(r["accuracy_path"], ".3f"), str(r["draft_tokens"]),
                  str(r["target_tokens"]), str(r["score_prefill_tokens"]),
                  str(r["uncovered_paths"]))
    Console(width=200).print(t)
    return 0


def add_a1_parser(sub) -> None:
    """The `a1` command group."""
    from reasonsim.common import floats, ints

    a1 = sub.add_parser("a1", help="A1 (conformal draft/target test-time scaling) experiments")
    asub = a1.add_subparsers(dest="a1_command", required=True, metavar="EXPERIMENT")
    o = asub.add_parser("offline", help="rejection rate vs alpha, accuracy, tokens by model",
                        description="Replay every policy of a conformity trace counterfactually: "
                        "realised target rejection rate vs alpha (marginal and conditional "
                        "coverage), majority-vote / best-of-n / per-path accuracy against the "
                        "gold answer, and tokens by model, per sample count.")
    o.add_argument("trace", help="conformity trace directory (reasonsim trace conformity)")
    o.add_argument("--alphas", type=floats, default=None,
                   help="alphas to replay (default: the trace's grid; others may leave it)")
    o.add_argument("--samples", type=ints, default=None,
                   help="sample counts (default: 1, 2, 4, ... up to the trace's)")
    o.add_argument("--calib-samples", type=int, default=None,
                   help="calibrate on each question's first N calibration samples only")
    o.add_argument("-o", "--out", help="write a1_offline.json, rejection_vs_alpha.png and "
                   "tokens_to_accuracy.png here")
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_a1_offline)
    r = asub.add_parser("replay", help="an A1 config live on two vLLM engines vs simulated",
                        description="Run the config's A1 programs live on two in-process vLLM "
                        "engines (draft, target) with the simulator's program and policy "
                        "objects, --repeats times (each in a fresh process: the live-vs-live "
                        "spread), simulate the same config, and report decision agreement (same "
                        "decision string per path) and sim-vs-live latency and throughput errors.")
    r.add_argument("config", help="an A1 program config with a draft and a target replica")
    r.add_argument("-o", "--out", default="reports/a1-replay")
    r.add_argument("--count", type=int, default=None, help="override the number of programs")
    r.add_argument("--repeats", type=int, default=2, help="live runs (>= 2 gives the spread)")
    r.add_argument("--seed", type=int, default=None, help="override the config's seed")
    r.add_argument("--calibrate-here", action="store_true",
                   help="first serve other programs of the config (seed "
                   f"+ {CALIBRATION_SEED_OFFSET}) live, and simulate with draft and target "
                   "calibrations fitted on that run's steps (this machine, now)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_a1_replay)
    sa = asub.add_parser("samples", help="simulated latency vs samples: async, sync, target-only",
                         description="Simulate an A1 config at each sample count with its "
                         "policy asynchronous, synchronous, and the target-only baseline (same "
                         "workload and seed); a table and latency_vs_samples.png.")
    sa.add_argument("config", help="an A1 program config")
    sa.add_argument("--samples", type=ints, default=[1, 2, 4, 8, 16])
    sa.add_argument("-o", "--out", help="write latency_vs_samples.{png,json} here")
    sa.add_argument("--json", action="store_true")
    sa.set_defaults(func=cmd_a1_samples)


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
    busy = {role: float(read_table(d, "steps").to_pandas().duration_ms.sum()) / 1e3
            for role, d in (("target", out), ("draft", out / "draft"))}
    log = request_log({r.key: r.program for r in runs}, requests)
    summary = a1_summary([r.program for r in runs], log, busy, makespan)
    summary["rescored_scores"] = res["rescored"]
    (out / "a1.json").write_text(json.dumps(summary, indent=1) + "\n")


def cmd_a1_replay(args: argparse.Namespace) -> int:
    """`reasonsim a1 replay`: the config live (twice: the noise floor) and simulated, compared."""
    from rich.console import Console
    from rich.table import Table

    from traces.store import read_table
    from validation.a1 import replay_result
    from validation.judge import machine_speed
    from validation.replay import fresh_process

    path = Path(args.config)
    try:
        cfg, _ = _config(path, args.count, args.seed)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    out = Path(args.out)
    if args.calibrate_here:  # other programs first, live here: each pool calibrated on them
        cal = out / "calibration"
        fresh_process(live_job, str(path), args.count, cfg.seed + CALIBRATION_SEED_OFFSET,
                      str(cal / "live0"))
        calibrations = calibrate_pools({"target": [cal / "live0"],
                                        "draft": [cal / "live0" / "draft"]}, [cal / "live0"], cal)
        cfg, _ = _config(path, args.count, args.seed, calibrations)
    lives = []
    for i in range(args.repeats):
        d = out / f"live{i}"
        fresh_process(live_job, str(path), args.count, args.seed, str(d))
        lives.append((read_table(d, "programs").to_pandas(),
                      read_table(d, "conformity").to_pandas(),
                      json.loads((d / "a1.json").read_text())))
    result, s_progs = replay_result(cfg, out, lives)
    result["machine_speed"] = speed = machine_speed(out / "sim", [out / f"live{i}" for i in
                                                                  range(args.repeats)])
    if args.calibrate_here:
        result["calibrations"] = calibrations
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if speed["warning"]:
        print(speed["warning"], file=sys.stderr)
    keys = tuple(result["error_vs_live_mean"])
    if args.json:
        print(json.dumps(result))
        return 0
    t = Table(title=f"A1 sim vs live: {path.name}, {len(s_progs)} programs")
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
    print(f"details: {out / 'compare.json'}")
    return 0


def cmd_a1_samples(args: argparse.Namespace) -> int:
    """`reasonsim a1 samples`: simulated latency vs samples, async vs sync vs target-only."""
    from sim.config import read_yaml
    from sim.families.a1.report import latency_vs_samples, plot_latency_vs_samples

    path = Path(args.config)
    d = read_yaml(path)
    policy = {k: v for k, v in d["workload"]["programs"]["policy"].items()
              if k not in ("samples", "sync")}
    variants = {"A1 async": policy, "A1 sync": {**policy, "sync": True},
                "target-only": {"type": "target_only"}}
    try:
        rows = latency_vs_samples(d, path.parent, args.samples, variants)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_latency_vs_samples(rows, out / "latency_vs_samples.png")
        (out / "latency_vs_samples.json").write_text(json.dumps(rows, indent=1))
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Simulated A1 latency vs samples: {path.name}")
    for c in ("variant", "samples", "P50 s", "P90 s", "accuracy", "rejection", "r"):
        t.add_column(c, justify="left" if c == "variant" else "right")
    for r in rows:
        t.add_row(r["variant"], str(r["samples"]), f"{r['p50_s']:.3f}", f"{r['p90_s']:.3f}",
                  f"{r['accuracy']:.3f}", "-" if r["rejection_rate"] is None else
                  f"{r['rejection_rate']:.3f}", f"{r['async_arithmetic_intensity']:.1f}")
    Console(width=160).print(t)
    return 0

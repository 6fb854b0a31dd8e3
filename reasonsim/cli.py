"""The `reasonsim` command: one entry point, subcommands imported lazily so `--help` stays fast."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "models" / "testbed"
DEFAULT_MODEL = TESTBED / "target-large"  # the trained testbed target: real latency and behaviour


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


# ------------------------------------------------------------------------------ trace steps

def _cmd_trace_steps(args: argparse.Namespace) -> int:
    from tracers.step_profile import StepGrid, profile_steps

    grid = StepGrid(batch_sizes=args.batch_sizes, prompt_tokens=args.prompt_tokens,
                    output_tokens=args.output_tokens, repeats=args.repeats,
                    warmup_steps=args.warmup_steps)
    summary = profile_steps(model=args.model, out_dir=args.out, grid=grid,
                            load_format=args.load_format, dtype=args.dtype, seed=args.seed,
                            resume=args.resume, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            kv_cache_gb=args.kv_cache_gb, progress=not args.quiet)
    _print_summary(summary, args.json)
    return 0


def _cmd_trace_serve(args: argparse.Namespace) -> int:
    from tracers.serve import ServeWorkload, trace_serve

    wl = ServeWorkload(num_requests=args.num_requests, rate_per_s=args.rate,
                       prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                       seed=args.seed, concurrency=args.concurrency,
                       warmup_requests=args.warmup_requests)
    summary = trace_serve(url=args.url, model=args.model, out_dir=args.out, workload=wl,
                          resume=args.resume, progress=not args.quiet)
    _print_summary(summary, args.json)
    return 0


def _cmd_trace_probes(args: argparse.Namespace) -> int:
    from tracers.probes import ProbeWorkload, trace_probes

    wl = ProbeWorkload(questions_per_cell=args.questions, samples=args.samples,
                       stride_tokens=args.stride, budget_tokens=args.budget,
                       probe_tokens=args.probe_tokens, temperature=args.temperature,
                       probe_temperature=args.probe_temperature, seed=args.seed)
    summary = trace_probes(args.model, args.out, wl, resume=args.resume,
                           progress=not args.quiet)
    _print_summary(summary, args.json)
    return 0


def _cmd_trace_branches(args: argparse.Namespace) -> int:
    from tracers.search import BranchWorkload, SearchSettings, trace_branches

    try:
        wl = BranchWorkload(questions_per_cell=args.questions, sc_samples=args.samples,
                            mcts_iterations=args.iterations, rebase_widths=tuple(args.widths),
                            methods=tuple(args.methods), seed=args.seed,
                            settings=SearchSettings(budget_tokens=args.budget,
                                                    temperature=args.temperature))
    except ValueError as e:
        raise UserError(str(e)) from None
    summary = trace_branches(args.model, args.out, wl, resume=args.resume,
                             progress=not args.quiet)
    _print_summary(summary, args.json)
    return 0


def _cmd_traces_check(args: argparse.Namespace) -> int:
    from traces.store import check_trace

    bad = 0
    for path in args.paths:
        violations = check_trace(path)
        if violations:
            bad += 1
            for v in violations[: args.max_errors]:
                print(f"FAIL {v}", file=sys.stderr)
            if len(violations) > args.max_errors:
                print(f"FAIL {path}: {len(violations) - args.max_errors} more violations",
                      file=sys.stderr)
        else:
            print(f"ok   {path}")
    if bad:
        raise UserError(f"{bad} of {len(args.paths)} trace paths violate the contract")
    return 0


# ------------------------------------------------------------------------------ simulator

DEMO_CONFIG = REPO / "examples" / "demo.yaml"


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from sim.calibration import calibrate

    cal = calibrate(args.trace_dirs, seed=args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
    h = cal.heldout
    summary = {"heldout_mape": h["mape"], "heldout_p50_ape": h["p50_ape"],
               "heldout_p90_ape": h["p90_ape"], "heldout_rows": h["rows"],
               "train_rows": h["train_rows"], "fit_s": cal.provenance["fit_s"],
               "output": str(out)}
    for phase in ("decode", "prefill"):
        if phase in h:
            summary[f"heldout_mape_{phase}"] = h[phase]["mape"]
    _print_summary(summary, args.json)
    return 0


def _sim_run_row(cfg, result) -> dict:
    from importlib import metadata

    from sim.calibration import load_calibration
    from traces.provenance import run_row

    cal = load_calibration(cfg.replicas[0].calibration)
    p = cal.provenance
    return run_row("sim", "reasonsim-sim", metadata.version("reasonsim"),
                   f"simulated {p['device']}", sum(g.count for g in cfg.replicas),
                   p["model_id"], p["model_config_hash"], p["dtype"], "calibrated", cfg.seed,
                   {"config": json.loads(cfg.to_json()), "summary": result.summary})


def _write_sim(cfg, result, out_dir: Path) -> None:
    from traces.store import write_tables

    tables = {"requests": result.requests}
    if result.programs is not None:
        tables["programs"] = result.programs
    if result.steps is not None:
        tables["steps"] = result.steps
    write_tables(out_dir, _sim_run_row(cfg, result), tables)
    (out_dir / "summary.json").write_text(json.dumps(result.summary, indent=1) + "\n")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from sim.cluster import simulate
    from sim.config import load_config

    cfg = load_config(args.config)
    result = simulate(cfg)
    if args.out:
        _write_sim(cfg, result, Path(args.out))
    _print_summary(result.summary, args.json)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sim.demo import run_demo

    summary = run_demo(DEMO_CONFIG, Path(args.out), quick=args.quick)
    _print_summary(summary, args.json)
    if not args.json:
        print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def _resolve_model(model_id: str) -> str:
    """A calibration's model path, found again in this checkout if it was traced in another."""
    if Path(model_id).is_dir():
        return model_id
    cut = model_id.find("models/")
    if cut >= 0 and (REPO / model_id[cut:]).is_dir():
        return str(REPO / model_id[cut:])
    raise UserError(f"model {model_id} of the calibration is not here; pass --model DIR")


def _cmd_replay(args: argparse.Namespace) -> int:
    from sim.calibration import load_calibration
    from sim.config import load_config
    from sim.workload import workload_from_config
    from tracers.replay import replay_live

    cfg = load_config(args.config)
    if sum(g.count for g in cfg.replicas) != 1:
        raise UserError(f"{args.config}: live replay drives one engine; the config has "
                        f"{sum(g.count for g in cfg.replicas)} replicas")
    group = cfg.replicas[0]
    cal = load_calibration(group.calibration)
    w = workload_from_config(cfg.workload, cfg.seed, cfg.base_dir)
    model = args.model or _resolve_model(cal.provenance["model_id"])
    kv_gb = cal.provenance.get("kv_cache_gb") or 1.0  # same KV space as when traced
    summary = replay_live(model, args.out, w.arrival_s, w.prompt_tokens, w.output_tokens,
                          seed=cfg.seed, max_num_seqs=group.max_num_seqs or cal.max_num_seqs,
                          max_num_batched_tokens=group.max_num_batched_tokens
                          or cal.max_num_batched_tokens, kv_cache_gb=kv_gb,
                          params={"config": json.loads(cfg.to_json())}, progress=not args.quiet)
    _print_summary(summary, args.json)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from sim.validate import compare, plot_cdfs

    rows = compare(args.sim_dir, args.live_dir)
    png = plot_cdfs(args.sim_dir, args.live_dir, args.out)
    if args.json:
        print(json.dumps(rows, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulated vs live")
    for col in ("metric", "sim", "live", "rel_err"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for k, v in rows.items():
        table.add_row(k, f"{v['sim']:.4g}", f"{v['live']:.4g}", f"{v['rel_err']:+.1%}")
    Console().print(table)
    print(f"CDF plot: {png}")
    return 0


def _print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict):  # {mean, p50, p90, p99}
            value = "  ".join(f"{k}={v:.4g}" for k, v in value.items())
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)


# ------------------------------------------------------------------------------ dynasor

def _cmd_dynasor_offline(args: argparse.Namespace) -> int:
    from sim.reasoning import load_trajectories, plot_tokens_to_accuracy, tokens_to_accuracy
    from traces.store import read_run

    if read_run(args.trace)["kind"] == "branches":
        return _dynasor_offline_search(args)

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


def _dynasor_offline_search(args: argparse.Namespace) -> int:
    from sim.search import plot_search_curves, search_tokens_to_accuracy

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


def _cmd_dynasor_calibrate(args: argparse.Namespace) -> int:
    from sim.search import calibrate

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


def _cmd_dynasor_online(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from sim.online import max_sustainable_rate, plot, sweep

    total = len(args.configs) * len(args.schedulers) * (len(args.rates) + len(args.slo_scales))
    with Progress(disable=args.json, transient=True) as bar:
        task = bar.add_task("simulating", total=total)
        try:
            rows = sweep(args.configs, args.schedulers, args.rates, args.slo_scales,
                         progress=lambda: bar.advance(task))
        except (OSError, ValueError) as e:
            raise UserError(str(e)) from None
    best = max_sustainable_rate(rows, args.target)
    out = Path(args.out)
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


def _cmd_dynasor_replay(args: argparse.Namespace) -> int:
    import yaml

    from policies.search import SearchBudget
    from sim.cluster import simulate
    from sim.config import parse_config
    from sim.programs import (compare, load_bank, plan_programs, program_id, program_seed,
                              program_workload)
    from traces.store import read_table
    from tracers.program_replay import ProgramPlan, replay_programs

    path = Path(args.config)
    d = yaml.safe_load(path.read_text())
    if args.count is not None:
        d["workload"]["programs"]["count"] = args.count
    try:
        cfg = parse_config(d, path.parent)
        if len(cfg.replicas) != 1 or cfg.replicas[0].count != 1:
            raise ValueError("live program replay drives one engine: the config needs one replica")
        wl = program_workload(cfg.workload["programs"], cfg.base_dir)
        bank = load_bank(wl)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    search = isinstance(wl.policy, SearchBudget)
    # The simulator's draw, handed to the tracer as plain plans.
    plans = [ProgramPlan(program_id(p.idx), p.q.question_id, p.q.difficulty, p.arrival_s,
                         p.deadline_s, () if search else
                         tuple(t.sample_id for t in p.q.samples) if wl.method == "sc" else
                         (p.q.samples[p.sample].sample_id,))
             for p in plan_programs(wl, bank, program_seed(cfg, 1))]
    out = Path(args.out)
    t0 = time.perf_counter()
    if search:
        from tracers.search import replay_search

        replay_search(plans, wl.method, wl.policy, cfg.scheduler, wl.trace, out / "live",
                      max_num_seqs=cfg.replicas[0].max_num_seqs, seed=cfg.seed,
                      model=args.model, config_json=cfg.to_json())
    else:
        replay_programs(plans, wl.method, wl.policy, cfg.scheduler, wl.trace, bank.stride_tokens,
                        out / "live", max_num_seqs=cfg.replicas[0].max_num_seqs, seed=cfg.seed,
                        model=args.model, config_json=cfg.to_json())
    live_wall_s = time.perf_counter() - t0
    sim = simulate(cfg)
    _write_sim(cfg, sim, out / "sim")
    result = compare(sim.programs.to_pandas(), read_table(out / "live", "programs").to_pandas())
    result["live_wall_s"] = round(live_wall_s, 2)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"decision agreement {result['decision_agreement']:.3f}, answer agreement "
          f"{result['answer_agreement']:.3f} over {result['programs']} programs")
    _print_summary(result["error"], False)
    print(f"details: {out / 'compare.json'}")
    return 0


# ------------------------------------------------------------------------------ testbed

def _cmd_testbed_build(args: argparse.Namespace) -> int:
    import torch

    from tracers.testbed.train import build

    if args.threads:
        torch.set_num_threads(args.threads)
    build(args.out, names=args.models, steps_scale=args.steps_scale, init_dir=args.init_from,
          log=(lambda *a: None) if args.quiet else (lambda msg: print(msg, flush=True)))
    return 0


def _cmd_testbed_eval(args: argparse.Namespace) -> int:
    from tracers.testbed.evaluate import evaluate

    result = evaluate(args.models, items_per_cell=args.items, samples=args.samples,
                      seed=args.seed, progress=not (args.quiet or args.json))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


# ------------------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs test)."""
    p = argparse.ArgumentParser(prog="reasonsim", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = sub.add_parser("trace", help="record traces from a real engine")
    tsub = trace.add_subparsers(dest="trace_command", required=True, metavar="TRACER")

    s = tsub.add_parser("steps", help="profile vLLM's offline engine step by step over a grid",
                        description="Drive vLLM's LLMEngine step by step over a grid of batch "
                        "sizes x prompt lengths x output lengths; record every iteration "
                        "(steps table) and every request (requests table).")
    s.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="model directory (config.json; weights optional with --load-format "
                   "dummy); default: the testbed's target-large")
    s.add_argument("-o", "--out", required=True, help="trace directory to write")
    s.add_argument("--batch-sizes", type=_ints, default=[1, 4, 16, 64], help="e.g. 1,4,16,64")
    s.add_argument("--prompt-tokens", type=_ints, default=[32, 128, 512, 1024])
    s.add_argument("--output-tokens", type=_ints, default=[16, 64, 128, 256])
    s.add_argument("--repeats", type=int, default=2,
                   help="repeats of each grid cell (>= 2 gives every shape warm samples)")
    s.add_argument("--warmup-steps", type=int, default=3,
                   help="first N iterations of the run flagged is_warmup; the first iteration "
                   "of each new shape is flagged too")
    s.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy = random weights from config.json alone")
    s.add_argument("--dtype", default="auto", help="auto = float32 on CPU, bfloat16 on GPU")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--max-num-batched-tokens", type=int, default=None)
    s.add_argument("--kv-cache-gb", type=float, default=1.0, help="CPU KV cache space (GiB)")
    s.add_argument("--resume", action="store_true", help="continue an interrupted trace")
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_trace_steps)

    v = tsub.add_parser("serve", help="stream a workload against an OpenAI-compatible server",
                        description="Send a seeded Poisson workload to /v1/completions with "
                        "streaming and record per-token arrival times (token_times) and "
                        "per-request timings (requests).")
    v.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    v.add_argument("--model", default=None, help="model name on the server (default: first "
                   "model listed by /v1/models)")
    v.add_argument("-o", "--out", required=True, help="trace directory to write")
    v.add_argument("--num-requests", type=int, default=32)
    v.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second "
                   "(0 = all at once)")
    v.add_argument("--prompt-tokens", type=_ints, default=[64, 256], help="choices, sampled")
    v.add_argument("--output-tokens", type=_ints, default=[32, 128], help="choices, sampled")
    v.add_argument("--concurrency", type=int, default=64, help="max requests in flight")
    v.add_argument("--warmup-requests", type=int, default=2,
                   help="unrecorded requests sent before the clock starts (server warm-up)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--resume", action="store_true")
    v.add_argument("--json", action="store_true")
    v.add_argument("-q", "--quiet", action="store_true")
    v.set_defaults(func=_cmd_trace_serve)

    pr = tsub.add_parser("probes", help="probe chain-of-thought mid-reasoning on vLLM (Dynasor)",
                         description="Decode each question x sample in chunks and probe the "
                         "answer after every chunk; never stop early (counterfactual replay).")
    pr.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    pr.add_argument("-o", "--out", required=True, help="trace directory to write")
    pr.add_argument("--questions", type=int, default=4, help="questions per family x level")
    pr.add_argument("--samples", type=int, default=4, help="reasoning samples per question")
    pr.add_argument("--stride", type=int, default=16, help="reasoning tokens between probes")
    pr.add_argument("--budget", type=int, default=256, help="reasoning token budget")
    pr.add_argument("--probe-tokens", type=int, default=20, help="tokens per probe")
    pr.add_argument("--temperature", type=float, default=0.7, help="reasoning temperature")
    pr.add_argument("--probe-temperature", type=float, default=0.6,
                    help="probe temperature (0.6 is the public reference's; 0 is greedy)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--resume", action="store_true", help="continue a killed trace")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("-q", "--quiet", action="store_true")
    pr.set_defaults(func=_cmd_trace_probes)

    br = tsub.add_parser("branches", help="SC, MCTS and Rebase programs on vLLM (Dynasor)",
                         description="Run each question's self-consistency, MCTS and Rebase "
                         "programs to their caps and record every request (the branches table) "
                         "with its path reward: the model's own path likelihood.")
    br.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    br.add_argument("-o", "--out", required=True, help="trace directory to write")
    br.add_argument("--questions", type=int, default=6, help="questions per family x level")
    br.add_argument("--methods", type=lambda t: t.split(","), default=["sc", "mcts", "rebase"])
    br.add_argument("--samples", type=int, default=16, help="self-consistency samples")
    br.add_argument("--iterations", type=int, default=16, help="MCTS iterations")
    br.add_argument("--widths", type=_ints, default=[4, 8, 16], help="Rebase widths")
    br.add_argument("--budget", type=int, default=256, help="reasoning tokens per path")
    br.add_argument("--temperature", type=float, default=0.7)
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--resume", action="store_true", help="continue a killed trace")
    br.add_argument("--json", action="store_true")
    br.add_argument("-q", "--quiet", action="store_true")
    br.set_defaults(func=_cmd_trace_branches)

    tr = sub.add_parser("traces", help="inspect and validate trace directories")
    trsub = tr.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    c = trsub.add_parser("check", help="validate trace directories or part files",
                         description="Validate schema, version, columns, times; name file, "
                         "column and row of every violation. Exit 2 if any path fails.")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--max-errors", type=int, default=20)
    c.set_defaults(func=_cmd_traces_check)

    cal = sub.add_parser("calibrate", help="fit the latency model from steps traces",
                         description="Fit per-iteration latency from steps tables (NNLS, relative "
                         "error); report held-out error on grid cells the fit never saw.")
    cal.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR")
    cal.add_argument("-o", "--out", required=True, help="calibration JSON to write")
    cal.add_argument("--seed", type=int, default=0, help="held-out split seed")
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=_cmd_calibrate)

    sm = sub.add_parser("simulate", help="simulate a cluster from a YAML config",
                        description="Run the SimPy cluster model; print a summary; with -o write "
                        "requests/steps tables (same schema as live traces) and summary.json.")
    sm.add_argument("config")
    sm.add_argument("-o", "--out", help="directory for the tables")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(func=_cmd_simulate)

    dm = sub.add_parser("demo", help="simulate the default cluster and write a report",
                        description="Simulate examples/demo.yaml from the shipped calibration, "
                        "sweep the arrival rate, write PNG plots and report.md.")
    dm.add_argument("-o", "--out", default="reports/demo")
    dm.add_argument("--quick", action="store_true", help="smaller workload (tests)")
    dm.add_argument("--json", action="store_true")
    dm.set_defaults(func=_cmd_demo)

    rp = sub.add_parser("replay", help="serve a config's workload live on vLLM (one replica)",
                        description="Same arrivals, lengths (ignore_eos) and seed as `simulate`, "
                        "in real time on vLLM's engine; writes the same tables.")
    rp.add_argument("config")
    rp.add_argument("-o", "--out", required=True)
    rp.add_argument("--model", help="model directory (default: the calibration's model)")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("-q", "--quiet", action="store_true")
    rp.set_defaults(func=_cmd_replay)

    va = sub.add_parser("validate", help="compare simulated and live tables",
                        description="Per metric (mean/P50/P90/P99 of TTFT, TPOT, e2e; throughput) "
                        "print simulated, live and relative error; write overlaid CDF plots.")
    va.add_argument("sim_dir")
    va.add_argument("live_dir")
    va.add_argument("-o", "--out", default="reports/validate", help="plot directory")
    va.add_argument("--json", action="store_true")
    va.set_defaults(func=_cmd_validate)
    dy = sub.add_parser("dynasor", help="Dynasor experiments on probes traces")
    dysub = dy.add_subparsers(dest="dynasor_command", required=True, metavar="EXPERIMENT")
    off = dysub.add_parser("offline", help="tokens-to-accuracy of certaindex vs fixed budgets",
                           description="Replay probe-consistency stopping (window x interval) "
                           "and fixed token budgets counterfactually on a probes trace; or, on a "
                           "branches trace, certaindex stops vs baseline-even caps for SC, MCTS "
                           "and Rebase.")
    off.add_argument("trace", help="probes or branches trace directory (reasonsim trace ...)")
    off.add_argument("-o", "--out", default="reports/dynasor", help="directory for plot + JSON")
    off.add_argument("--windows", type=_ints, default=[2, 3, 4, 5], help="e.g. 2,3,4,5")
    off.add_argument("--intervals", type=_ints, default=None,
                     help="probe intervals in tokens (multiples of the stride; default: stride, "
                     "2 x stride)")
    off.add_argument("--budgets", type=_ints, default=[32, 64, 96, 128, 160, 192, 256])
    off.add_argument("--json", action="store_true")
    off.add_argument("--per-round", type=int, default=2,
                     help="branches traces: self-consistency paths per round")
    off.set_defaults(func=_cmd_dynasor_offline)
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
    ca.add_argument("--thresholds", type=_floats, default=None,
                    help="candidates; default: 0.05..0.95 (entropy), the traced rewards (reward)")
    ca.add_argument("--detect", type=int, default=None,
                    help="detect@knob: check once at this many solutions (default: every round)")
    ca.add_argument("--per-round", type=int, default=0, help="sc: paths per round")
    ca.add_argument("--split-seed", type=int, default=0)
    ca.add_argument("--json", action="store_true")
    ca.set_defaults(func=_cmd_dynasor_calibrate)
    on = dysub.add_parser("online", help="deadline attainment vs rate and SLO scale per scheduler",
                          description="Simulate program configs (same cluster, different "
                          "allocation policies) under each scheduler, sweeping the arrival rate "
                          "and the SLO scale; report the max rate at the target attainment.")
    on.add_argument("configs", nargs="+", help="program workload configs (examples/dynasor-*.yaml)")
    on.add_argument("-o", "--out", default="reports/dynasor", help="directory for plots + JSON")
    on.add_argument("--schedulers", type=lambda t: t.split(","),
                    default=["fcfs", "lpm", "app_fifo", "dynasor"])
    on.add_argument("--rates", type=_floats, default=[1, 2, 3, 4, 5, 6])
    on.add_argument("--slo-scales", type=_floats, default=[0.5, 1, 1.5, 2, 3, 4])
    on.add_argument("--target", type=float, default=0.9, help="attainment target")
    on.add_argument("--json", action="store_true")
    on.set_defaults(func=_cmd_dynasor_online)
    rp = dysub.add_parser("replay", help="run a program config live on vLLM and compare with sim",
                          description="Drive real vLLM with the config's programs and policy "
                          "objects (probes as prefix-sharing requests, stops as aborts, "
                          "scheduler priorities as vLLM priorities), simulate the same config, "
                          "and report decision agreement and sim-vs-live errors.")
    rp.add_argument("config", help="a program workload config with one replica")
    rp.add_argument("-o", "--out", default="reports/dynasor-replay")
    rp.add_argument("--count", type=int, default=None, help="override the number of programs")
    rp.add_argument("--model", default=None, help="model directory (default: the trace's)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_cmd_dynasor_replay)

    tb = sub.add_parser("testbed", help="build and measure the small trained testbed models")
    tbsub = tb.add_subparsers(dest="testbed_command", required=True, metavar="ACTION")
    b = tbsub.add_parser("build", help="train target-large, target-small and draft (CPU, ~1 h)",
                         description="Train the testbed models on the synthetic reasoning task, "
                         "deterministically (seeded data and initialisation).")
    b.add_argument("-o", "--out", default=str(TESTBED), help="directory for the model folders")
    b.add_argument("--models", nargs="+", default=None, help="subset of models to train")
    b.add_argument("--steps-scale", type=float, default=1.0,
                   help="multiply every model's step budget (e.g. 0.01 for a smoke run)")
    b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    b.add_argument("--init-from", default=None,
                   help="directory of models that finished stage 1: run only the later stages")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=_cmd_testbed_build)
    e = tbsub.add_parser("eval", help="measure accuracy, probes, entropy, exits and acceptance",
                         description="Evaluate the testbed models on held-out items and print "
                         "one JSON object.")
    e.add_argument("--models", default=str(TESTBED), help="directory holding the model folders")
    e.add_argument("--items", type=int, default=24, help="held-out items per family x level")
    e.add_argument("--samples", type=int, default=8, help="samples per item at temperature 0.7")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--save", default=None, help="also write the JSON object to this file")
    e.add_argument("--json", action="store_true", help="print compact JSON, no progress")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_cmd_testbed_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `reasonsim` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UserError, ValueError, OSError, RuntimeError) as e:
        # Bad input, unreachable servers, dead engines: one line. REASONSIM_DEBUG=1 shows where.
        if os.environ.get("REASONSIM_DEBUG"):
            raise
        print(f"reasonsim: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

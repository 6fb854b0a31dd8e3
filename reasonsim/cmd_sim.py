"""`reasonsim calibrate | simulate | demo | replay | validate`: the simulator's commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import REPO, UserError, int_at_least, print_summary, refuse_inside

DEMO_CONFIG = REPO / "examples" / "demo.yaml"


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`reasonsim calibrate`."""
    from dataclasses import asdict, replace

    from sim.step_time.calibration import calibrate
    from sim.step_time.host_time import fit_host_ms

    refuse_inside(args.out, args.trace_dirs + (args.host_from or []), "-o")
    cal = calibrate(args.trace_dirs, seed=args.seed, model=args.model, spec_k=args.spec_k)
    if args.host_from:
        p = cal.provenance
        cal = replace(cal, **asdict(fit_host_ms(args.host_from, (p["engine"], p["device"]))))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
    h = cal.heldout
    summary = {"heldout_mape": h["mape"], "heldout_p50_ape": h["p50_ape"],
               "heldout_p90_ape": h["p90_ape"], "heldout_rows": h["rows"],
               "train_rows": h["train_rows"], "fit_s": cal.provenance["fit_s"],
               "step_time_model": cal.latency.kind, "add_request_ms": cal.add_request_ms,
               "add_next_ms": cal.add_next_ms, "step_gap_ms": cal.step_gap_ms,
               "wake_ms": cal.wake_ms,
               "logprob_token_ms": cal.logprob_token_ms,
               "logprob_top_k_ms": cal.logprob_top_k_ms,
               "logprob_step_ms": cal.logprob_step_ms, "seeded_step_ms": cal.seeded_step_ms,
               "seeded_seq_ms": cal.seeded_seq_ms, "output": str(out)}
    for part in ("decode", "prefill", "mixed", "seqs_1", "seqs_2_4", "seqs_5_16", "seqs_17_plus",
                 "greedy", "seeded", "logprobs"):
        if part in h:
            summary[f"heldout_mape_{part}"] = h[part]["mape"]
    print_summary(summary, args.json)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """`reasonsim simulate`."""
    from sim.config import load_config
    from sim.simulate import simulate

    if args.help_config:
        from sim.config_schema import describe

        print("\n".join(describe()))
        print("workload: see docs/config.md (synthetic: arrival, num_requests | duration_s, "
              "prompt_tokens, output_tokens, prefix; trace: {format, path, ...}; programs)")
        return 0
    if args.config is None:
        raise UserError("simulate needs CONFIG.yaml (or --help-config)")
    from sim.config import read_yaml
    from sim.families.registry import section_of

    if section_of(read_yaml(args.config)) is not None:
        from reasonsim.cmd_helios import run_helios_simulate

        return run_helios_simulate(args.config, args.out, args.json)
    from sim.bands import MAX_DRAWS
    from sim.output import write_sim

    if args.seeds is not None and not 2 <= args.seeds <= MAX_DRAWS:  # before simulating
        raise UserError(f"--seeds {args.seeds}: a band needs 2 to {MAX_DRAWS} noise draws")
    cfg = load_config(args.config)
    if args.out:  # refuse a used output directory before simulating, not after
        from traces.store import check_out_dir

        check_out_dir(args.out, resume=False, can_resume=False)
    if not args.json:  # which device's timings this simulation stands on
        _print_fingerprints(cfg)
    try:
        result = simulate(cfg)
    except ValueError as e:  # workload generation and limits: name the config they came from
        raise UserError(f"{args.config}: {e}") from None
    if not args.json and result.why_simpy:  # the slower path, and what put it there
        print(f"simulator: simpy ({result.why_simpy})")
    summary = dict(result.summary)
    band = None
    if args.seeds:
        band = _band(cfg, args.seeds)
        summary.update({f"band_{k}": [round(v["lo"], 6), round(v["hi"], 6)]
                        for k, v in band["metrics"].items()
                        if k.endswith((".p50", ".p90")) or k.startswith(("throughput",
                                                                         "program_latency_p"))})
    if args.out:
        write_sim(cfg, result, Path(args.out), None if band is None else
                  {"bands.json": json.dumps(band, indent=1) + "\n"})
    print_summary(summary, args.json)
    return 0


def _print_fingerprints(cfg) -> None:
    """Each pool's calibration and the device, cores and engine it was traced on."""
    from sim.output import calibration_fingerprints

    for c in calibration_fingerprints(cfg):
        print(f"pool {c['pool']}: {c['calibration']} (traced on {c['device']}, "
              f"{c['device_count']} cores/devices, {c['engine']} {c['engine_version']})"
              + (f"; speculative: {c['speculative']}" if c["speculative"] else ""))


def _band(cfg, draws: int) -> dict:
    """The noise band of `draws` seeded simulations (`sim.bands`), its errors one line."""
    from sim.bands import bands

    try:
        return bands(cfg, draws)
    except ValueError as e:
        raise UserError(str(e)) from None


def cmd_demo(args: argparse.Namespace) -> int:
    """`reasonsim demo`."""
    from sim.demo import run_demo

    summary = run_demo(DEMO_CONFIG, Path(args.out), quick=args.quick)
    print_summary(summary, args.json)
    if not args.json:
        print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """`reasonsim replay`."""
    from sim.config import load_config
    from validation.replay import replay_config

    cfg = load_config(args.config)
    if cfg.programs is not None:
        raise UserError(f"{args.config}: a program workload (workload.programs); `reasonsim "
                        "dynasor replay` replays one-engine program configs, `reasonsim a1 "
                        "replay` and `reasonsim seed replay` A1's and SEED's")
    if sum(g.count for g in cfg.replicas) != 1:
        raise UserError(f"{args.config}: live replay drives one engine; the config has "
                        f"{sum(g.count for g in cfg.replicas)} replicas")
    try:
        summary = replay_config(cfg, args.out, args.model, progress=not args.quiet,
                                engine=args.engine, device=args.device)
    except ValueError as e:
        raise UserError(str(e)) from None
    print_summary(summary, args.json)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """`reasonsim validate`."""
    from validation.judge import plot_cdfs, validate_dirs

    result = validate_dirs(args.sim_dir, args.live_dir, args.allow_device_mismatch)
    rows, device, speed = result["metrics"], result["device"], result["speed"]
    png = plot_cdfs(args.sim_dir, args.live_dir, args.out)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not device["match"]:
        console.print(f"[bold red]DEVICE MISMATCH[/]: simulated with timings from "
                      f"{device['calibrated_on']}; the live run ran on {device['live']}")
    if speed is not None and not speed["match"]:
        console.print(f"[bold red]SPEED MISMATCH[/]: the live run's decode steps took "
                      f"{speed['decode_step_ratio']:.2f}x what the calibration predicts "
                      f"(median of {speed['steps']}); its timings are not this device's")
    if speed is not None and speed.get("probe_match") is False:
        console.print(f"[bold red]PROBE MISMATCH[/]: the calibration's own speed probe ran at "
                      f"{speed['probe']['level']:.2f}x its reference here: another machine's "
                      "speed, or this one far from it")
    if speed is not None:
        pf = speed["prefill_step_ratio"]
        console.print(f"live steps / the calibration's prediction (median): decode "
                      f"{speed['decode_step_ratio']:.2f}x ({speed['steps']} steps), prefill "
                      + (f"{pf:.2f}x ({speed['prefill_steps']} steps)" if pf is not None
                         else "none"))
        if speed.get("probe"):
            probe = dict(speed["probe"])
            pre = probe.pop("prefill", None)
            levels = ", ".join(f"{k} {v:.2f}x" for k, v in probe.items())
            if pre:
                levels += "; its one-prompt prefills: " + ", ".join(
                    f"{k} {v:.2f}x" for k, v in pre.items() if k != "factor")
            console.print(f"speed probe (fixed decode batches) / {speed['probe_against']}: "
                          + levels)
        if speed.get("host_steal") is not None:
            console.print(f"CPU stolen by the host while the live run served: "
                          f"{speed['host_steal']:.1%}")
    table = Table(title="simulated vs live")
    banded = any("band" in v for v in rows.values())
    for col in ("metric", "sim", "live", "rel_err") + (("band 5-95%", "live in band")
                                                         if banded else ()):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for k, v in rows.items():
        cells = [k, f"{v['sim']:.4g}", f"{v['live']:.4g}", f"{v['rel_err']:+.1%}"]
        if banded:
            cells += [f"{v['band'][0]:.4g}-{v['band'][1]:.4g}", "yes" if v["in_band"] else "no"] \
                if "band" in v else ["", ""]
        table.add_row(*cells)
    console.print(table)
    console.print(f"verdict: {result['verdict']['status']} ({result['verdict']['reason']})")
    print(f"CDF plot: {png}")
    return 0


def add_calibrate_parser(sub) -> None:
    """`reasonsim calibrate`."""
    cal = sub.add_parser("calibrate", help="fit the latency model from steps traces",
                         description="Fit per-iteration latency from steps tables (NNLS, relative "
                         "error); report held-out error on grid cells the fit never saw.")
    cal.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR")
    cal.add_argument("-o", "--out", required=True, help="calibration JSON to write")
    cal.add_argument("--seed", type=int, default=0, help="held-out split seed")
    cal.add_argument("--model", choices=["serving", "linear"], default="serving",
                     help="step-time model: serving (linear + first-of-shape, idle and prefill-"
                     "step terms) or linear")
    cal.add_argument("--host-from", nargs="+", default=[], metavar="RUN_DIR",
                     help="live runs of in-process engines stepped from one loop (each a trace "
                     "or a directory of one per engine), on the traces' engine and device: "
                     "fit the host time per added request and after idle from them (default: "
                     "from the live replays among the traces)")
    cal.add_argument("--spec-k", type=int_at_least(1), default=None, metavar="K",
                     help="fit the steps of vLLM's speculative decoding with K draft tokens (a "
                     "spec trace's K cells, or live replays of a speculative engine)")
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=cmd_calibrate)


def add_simulate_parser(sub) -> None:
    """`reasonsim simulate`."""
    sm = sub.add_parser("simulate", help="simulate a cluster from a YAML config",
                        description="Run the SimPy cluster model; print a summary; with -o write "
                        "requests/steps tables (same schema as live traces) and summary.json.")
    sm.add_argument("config", nargs="?")
    sm.add_argument("-o", "--out", help="directory for the tables")
    sm.add_argument("--json", action="store_true")
    sm.add_argument("--seeds", type=int, default=None, metavar="N",
                    help="also simulate N draws of the step-time noise (same workload) and "
                    "report each metric's 5-95%% band (bands.json under -o)")
    sm.add_argument("--help-config", action="store_true",
                    help="list every cluster/slo/output config key with its type, default and "
                    "bounds (from the schema the config is validated against), then exit")
    sm.set_defaults(func=cmd_simulate)


def add_demo_parser(sub) -> None:
    """`reasonsim demo`."""
    dm = sub.add_parser("demo", help="simulate the default cluster and write a report",
                        description="Simulate examples/demo.yaml from the shipped calibration, "
                        "sweep the arrival rate, write PNG plots and report.md.")
    dm.add_argument("-o", "--out", default="reports/demo")
    dm.add_argument("--quick", action="store_true", help="smaller workload (tests)")
    dm.add_argument("--json", action="store_true")
    dm.set_defaults(func=cmd_demo)


def add_replay_parser(sub) -> None:
    """`reasonsim replay`."""
    rp = sub.add_parser("replay", help="serve a config's workload live on vLLM or the PyTorch "
                        "engine (one replica)",
                        description="Same arrivals, lengths (ignore_eos) and seed as `simulate`, "
                        "in real time on the engine the replica's calibration was traced on "
                        "(vLLM's, or the PyTorch engine's serving mode); writes the same "
                        "tables.")
    rp.add_argument("config")
    rp.add_argument("-o", "--out", required=True)
    rp.add_argument("--model", help="model directory (default: the calibration's model)")
    rp.add_argument("--engine", choices=["vllm", "torch"],
                    help="the engine to serve on (default: the calibration's; another is "
                    "refused: the simulation would price a different engine)")
    rp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="the PyTorch engine's device (auto: cuda where there is one)")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("-q", "--quiet", action="store_true")
    rp.set_defaults(func=cmd_replay)


def add_validate_parser(sub) -> None:
    """`reasonsim validate`."""
    va = sub.add_parser("validate", help="compare simulated and live tables",
                        description="Per metric (mean/P50/P90/P99 of TTFT, TPOT, e2e; throughput) "
                        "print simulated, live and relative error; write overlaid CDF plots.")
    va.add_argument("sim_dir")
    va.add_argument("live_dir")
    va.add_argument("-o", "--out", default="reports/validate", help="plot directory")
    va.add_argument("--allow-device-mismatch", action="store_true",
                    help="give a pass/fail verdict even when the calibration was traced on "
                    "another device than the live run")
    va.add_argument("--json", action="store_true")
    va.set_defaults(func=cmd_validate)

"""`reasonsim helios ...`: HELIOS early-exit analysis on exits traces."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonsim.common import (UserError, fraction, int_at_least, ints_in_order, names,
                              refuse_inside)


def cmd_helios_offline(args: argparse.Namespace) -> int:
    """`reasonsim helios offline`: exit distribution per model and threshold, breach rates."""
    from rich.table import Table

    from sim.families.helios.exits import depth_summary, exit_summary, load_exits, plot_exit_shares

    if any(not 0 < t <= 1 for t in args.thresholds):
        raise UserError("--thresholds: each must be in (0, 1]")
    result, shares = {}, {}
    for trace in args.traces:
        try:
            m = load_exits(trace)
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
        name = Path(m.model_id).name
        if name in result:  # one row per model: the second would replace the first
            raise UserError(f"{trace}: a second trace of model {name!r} (the first: "
                            f"{result[name]['trace']}); give one trace per model")
        rows = exit_summary(m, args.thresholds)
        result[name] = {"trace": str(trace), "tokens": int(len(m.max_prob)),
                        "thresholds": rows, "depths": depth_summary(m, args.breach_threshold)}
        shares[name] = rows
    if args.out:
        plot_exit_shares(shares, Path(args.out) / "exit_shares.png")
        (Path(args.out) / "exits.json").write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
        return 0
    console = _console()
    for name, res in result.items():
        t = Table(title=f"{name}: {res['tokens']} tokens ({res['trace']})")
        layers = len(res["thresholds"][0]["exit_share"])
        for col in ["threshold", *[f"L{i + 1}" for i in range(layers)], "mean exit",
                    "early = final", "agree"]:
            t.add_column(col, justify="right")
        for r in res["thresholds"]:
            t.add_row(f"{r['threshold']:g}", *[f"{x:.1%}" for x in r["exit_share"]],
                      f"{r['mean_exit_layer']:.2f}", f"{r['early_equals_final']:.1%}",
                      f"{r['agree_with_final']:.1%}")
        console.print(t)
        d = Table(title=f"{name}: loaded depth, breach threshold {args.breach_threshold:g}")
        for col in ("depth", "breach rate", "agree with full depth"):
            d.add_column(col, justify="right")
        for r in res["depths"]:
            d.add_row(str(r["depth"]), f"{r['breach_rate']:.1%}", f"{r['agree_with_final']:.1%}")
        console.print(d)
    return 0


def _console():
    """A rich console as wide as the terminal, or 160 columns when output is not a terminal."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


def retrace_models(config: dict, base_dir: Path, out_dir: Path,
                   prompts_per_phase: int | None = None,
                   waves: list[int] | None = None) -> dict:
    """The config with every model's exits trace recorded again on this machine (same model,
    workload, load format and layer-skipping thresholds; optionally a longer stream, or other
    arrival waves: the prefill sizes the step-time fit sees) into
    `out_dir/<model>`, the models' phases interleaved (`tracers.exits.trace_exits_together`:
    every model traced at the same spells of the machine)."""
    import copy
    from dataclasses import replace

    from sim.families.helios.profile import load_profile
    from testbed.streams import ExitsWorkload
    from tracers.exits import ExitsJob, trace_exits_together
    from traces.store import read_run
    from validation.replay import fresh_process

    out = copy.deepcopy(config)
    jobs, models = [], out.get("helios", {}).get("models", [])
    for k, m in enumerate(models):
        if not isinstance(m, dict) or "exits" not in m:
            raise ValueError(f"helios.models[{k}]: --retrace needs a model with an exits trace "
                             "(what-if models are not run live)")
        path = Path(m["exits"]) if Path(m["exits"]).is_absolute() else base_dir / m["exits"]
        old = load_profile(path, m.get("name"))
        params = read_run(path)["params"]
        wl = ExitsWorkload(**{key: tuple(v) if isinstance(v, list) else v
                              for key, v in old.workload.items()})
        if prompts_per_phase is not None:
            wl = replace(wl, prompts_per_phase=prompts_per_phase)
        if waves is not None:
            wl = replace(wl, waves=tuple(waves))
        refuse_inside(out_dir / old.name, [path], "--retrace")
        if (out_dir / old.name).exists() and any((out_dir / old.name).iterdir()):
            raise ValueError(f"--retrace {out_dir}: {out_dir / old.name} is not empty; choose a "
                             "new directory")
        jobs.append(ExitsJob(old.model_dir, out_dir / old.name, wl,
                             params["engine"].get("load_format", "auto"),
                             tuple(params.get("ee_thresholds", ()))))
    # in a process of its own, as each live run: kernels built for one engine's shapes would
    # serve the next's (`validation.replay.fresh_process`)
    fresh_process(trace_exits_together, jobs, progress=False)
    for m, job in zip(models, jobs):
        m["exits"] = str(Path(job.out_dir).resolve())
    return out


def _experiment(path: str, retrace: str | None = None, prompts_per_phase: int | None = None,
                waves: list[int] | None = None):
    from sim.config import read_yaml
    from sim.families.helios.config import Experiment

    d = read_yaml(path)
    try:
        if retrace:
            d = retrace_models(d, Path(path).parent, Path(retrace), prompts_per_phase, waves)
        return Experiment(d, Path(path).parent)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None


def run_helios_simulate(config: str, out: str | None, as_json: bool) -> int:
    """`reasonsim simulate` of a config with a `helios:` section: every policy, one stream."""
    from rich.table import Table

    from sim.families.helios.report import plot_exit_shares, plot_policies, plot_timeline

    exp = _experiment(config)
    if out:
        from traces.store import check_out_dir

        check_out_dir(out, resume=False, can_resume=False)
    results = exp.simulate()
    summary = {name: r.summary() for name, r in results.items()}
    devices = exp.devices()
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        plot_policies(results, d / "helios_policies.png")
        plot_timeline(results, d / "helios_timeline.png")
        plot_exit_shares(results, d / "helios_exit_shares.png")
        (d / "summary.json").write_text(json.dumps({"devices": devices, "policies": summary},
                                                   indent=1))
    if as_json:
        print(json.dumps({"devices": devices, "policies": summary}))
        return 0
    h = exp.spec.helios
    where = f" on {h.replicas} replicas ({h.router})" if h.replicas > 1 else ""
    t = Table(title=f"{config}: {exp.num_prompts} prompts{where}; profiles traced on "
              f"{', '.join(devices)}")
    for col in ("policy", "candidates", "tok/s", "TTFT p50 ms", "TPOT p50 ms", "mean batch",
                "perplexity", "layer-tokens*", "LD/SW at prompt"):
        t.add_column(col, justify="right", no_wrap=col == "policy")
    t.caption = "* layer-token executions: the energy proxy (no power reading calibrates it)"
    for name, s in summary.items():
        t.add_row(name, ",".join(s["candidates"]), f"{s['throughput_tok_s']:.0f}",
                  f"{s['ttft_p50_s'] * 1e3:.1f}",
                  f"{s['tpot_p50_s'] * 1e3:.2f}", f"{s['mean_batch']:.1f}",
                  f"{s['perplexity']:.3f}", f"{s['layer_token_executions']}",
                  " ".join(e for e in s["events"] if ":load:" in e or ":switch:" in e) or "-")
    _console().print(t)
    _console().print(exit_table(summary))
    return 0


def exit_table(summary: dict):
    """HELIOS's Table 5: the share of output tokens by model and exit layer, per policy."""
    from rich.table import Table

    keys = sorted({k for s in summary.values() for k in s["exit_shares"]})
    t = Table(title="tokens by model @ exit layer (HELIOS Table 5), % of each policy's")
    t.add_column("policy", no_wrap=True)
    for k in keys:
        t.add_column(k, justify="right")
    for name, s in summary.items():
        t.add_row(name, *[f"{100 * s['exit_shares'][k]:.1f}" if k in s["exit_shares"] else "-"
                          for k in keys])
    return t


def cmd_helios_replay(args: argparse.Namespace) -> int:
    """`reasonsim helios replay`: each policy live on the PyTorch engine vs simulated."""
    from live.helios import run_live, stream_prompts
    from sim.families.helios.serving import HeliosResult, candidates_of, simulate_stream
    from validation.helios import compare
    from validation.replay import fresh_process

    exp, specs = _replay_experiment(args)
    first = next(iter(exp.profiles.values()))
    try:
        prompts = stream_prompts(first.workload, first.prompt_tokens)
    except ValueError as e:
        raise UserError(f"{args.config}: {e}") from None
    dirs = {name: p.model_dir for name, p in exp.profiles.items()}
    references = {name: p.reference for name, p in exp.profiles.items()}
    max_tokens = int(first.workload.get("max_tokens", 96))
    report = {}
    for p in specs:
        sim = simulate_stream(exp.program(p), exp.profiles)
        lives = []
        for _ in range(args.repeats):
            program = exp.program(p)
            # each live run in a fresh process: the simulator's engines start with no kernels
            lives.append(HeliosResult(*fresh_process(run_live, program, dirs, prompts,
                                                     exp.memory.seq_tokens, max_tokens,
                                                     seed=exp.spec.seed, references=references),
                                      candidates_of(program.policy)))
        report[exp.policy_name(p)] = compare(sim, lives)
        if report[exp.policy_name(p)]["speed_warning"]:
            print(report[exp.policy_name(p)]["speed_warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(report))
        return 0
    _print_replay(report)
    return 0


def _replay_experiment(args: argparse.Namespace) -> tuple:
    """`helios replay`'s experiment and the policy specs it serves, its arguments checked."""
    if args.repeats < 1:
        raise UserError("--repeats must be >= 1")
    if args.prompts_per_phase is not None and (not args.retrace or args.prompts_per_phase < 1):
        raise UserError("--prompts-per-phase needs --retrace and must be >= 1")
    if args.waves is not None and (not args.retrace or not args.waves or min(args.waves) < 1):
        raise UserError("--waves needs --retrace and prompts per wave >= 1")
    from sim.config import read_yaml

    helios = read_yaml(args.config).get("helios")
    if isinstance(helios, dict) and "what_if" in helios:  # no model of it was traced or exists
        raise UserError(f"{args.config}: a what-if config (helios.what_if): its models are "
                        "stated, not traced, and cannot run live; replay a config of traced "
                        "models (examples/helios-testbed.yaml)")
    exp = _experiment(args.config, args.retrace, args.prompts_per_phase, args.waves)
    if exp.spec.helios.replicas > 1:
        raise UserError(f"{args.config}: helios.replicas is {exp.spec.helios.replicas}; live "
                        "replay serves the stream on one device (set replicas: 1)")
    if exp.spec.helios.overlap_loading:
        raise UserError(f"{args.config}: helios.overlap_loading is simulated only (live replay "
                        "serves on one engine with no standby server; set it false)")
    specs = exp.spec.helios.policies
    if args.policies:
        known = {exp.policy_name(p): p for p in specs}
        unknown = [n for n in args.policies if n not in known]
        if unknown:
            raise UserError(f"--policies: unknown {unknown[0]!r}; known: {', '.join(known)}")
        specs = [known[n] for n in args.policies]
    return exp, specs


def _print_replay(report: dict) -> None:
    """`cmd_helios_replay`'s table per policy: decisions, each metric and its errors."""
    from rich.table import Table

    from validation.helios import METRICS

    console = _console()
    for name, r in report.items():
        d = r["decisions"]
        t = Table(title=f"{name}: same model/depth {d['prompts']:.0%} of prompts, events "
                  f"{'equal' if d['events_equal'] else 'DIFFER'} ({d['events']}), same "
                  f"output lengths {d['same_output_tokens']:.0%}, same exit layers "
                  f"{d['same_exit_layers']:.1%} of tokens")
        for col in ("metric", "sim", "live (median)", "error", "at live step speed",
                    "at local step speed", "live-vs-live spread"):
            t.add_column(col, justify="right")
        for m in METRICS:
            x = r["metrics"][m]
            lvl, local = x.get("error_at_live_speed"), x.get("error_at_local_speed")
            t.add_row(m, f"{x['sim']:.4g}", f"{x['live']:.4g}", f"{x['error']:+.1%}",
                      "" if lvl is None else f"{lvl:+.1%}",
                      "" if local is None else f"{local:+.1%}", f"{x['live_spread']:.1%}")
        console.print(t)
        console.print("live step time / simulated, per run: "
                      + ", ".join(f"{v:.2f}x" for v in r["step_speed"]))


def add_helios_parser(sub) -> None:
    """The `helios` command group."""
    he = sub.add_parser("helios", help="HELIOS early-exit experiments on exits traces")
    hesub = he.add_subparsers(dest="helios_command", required=True, metavar="EXPERIMENT")
    _add_offline_parser(hesub)
    _add_replay_parser(hesub)


def _add_offline_parser(hesub) -> None:
    """`reasonsim helios offline`."""
    from reasonsim.common import floats

    ho = hesub.add_parser("offline", help="exit distribution per model and threshold",
                          description="Counterfactually, from exits traces (reasonsim trace "
                          "exits): the share of tokens exiting at each layer per threshold, how "
                          "often an early token equals the full model's (HELIOS's insight), and "
                          "per loaded depth the confidence-breach rate.")
    ho.add_argument("traces", nargs="+", help="exits trace directories")
    ho.add_argument("--thresholds", type=floats, default=[0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
    ho.add_argument("--breach-threshold", type=fraction, default=0.9,
                    help="a token at the last loaded layer below it is a confidence breach")
    ho.add_argument("-o", "--out", help="write exits.json and exit_shares.png here")
    ho.add_argument("--json", action="store_true")
    ho.set_defaults(func=cmd_helios_offline)


def _add_replay_parser(hesub) -> None:
    """`reasonsim helios replay`."""
    hr = hesub.add_parser("replay", help="each policy live on the PyTorch engine vs simulated",
                          description="Serve a helios config's prompt stream live with each "
                          "policy (the same policy objects and round program as the simulator) "
                          "and compare: decision agreement, throughput, TTFT, TPOT, batch, "
                          "perplexity, with the live-vs-live spread over --repeats runs.")
    hr.add_argument("config", help="a config with a helios: section (examples/helios-*.yaml)")
    hr.add_argument("--policies", type=names,
                    help="policy names to replay (default: all)")
    hr.add_argument("--repeats", type=int_at_least(1), default=2, help="live runs per policy")
    hr.add_argument("--retrace", metavar="DIR",
                    help="first trace every model's exits again on this machine, with its "
                    "trace's own workload, into DIR/<model>, the models' phases taking turns (each "
                    "model sees the machine's same spells), and simulate from those (profiles "
                    "belong to the device that traced them)")
    hr.add_argument("--prompts-per-phase", type=int_at_least(1),
                    help="with --retrace: a longer (or shorter) stream than the trace's, so "
                    "live runs last long enough to average a shared machine's speed spells")
    hr.add_argument("--waves", type=ints_in_order,
                    help="with --retrace: prompts per arrival wave, cycled (`trace exits "
                    "--waves`; default the trace's own where it recorded them, else `trace "
                    "exits`' default, up to 32): the prefill sizes the step-time fit sees, as "
                    "large as the rounds the policies admit")
    hr.add_argument("--json", action="store_true")
    hr.set_defaults(func=cmd_helios_replay)

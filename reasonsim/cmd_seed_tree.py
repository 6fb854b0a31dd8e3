"""`reasonsim trace tot`, `seed replay` and `seed modes`: Tree-of-Thoughts under AR, SD, SEED."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inputs.repeats import repeated
from reasonsim.common import (CACHE_GB, CALIBRATION_SEED_OFFSET, TEMPERATURE, TESTBED, UserError,
                             add_speed_checks, calibrate_pools, check_speed_checks, int_at_least,
                             ints, names, print_summary, program_config, seed_int)

MODES_DEFAULT = "ar,ar_batched,sd,seed,seed_batched"


def cmd_trace_tot(args: argparse.Namespace) -> int:
    """`reasonsim trace tot`."""
    from policies.seed import ToTSettings
    from live.seed_trace import TotWorkload, trace_tot

    try:
        settings = ToTSettings(
            breadth=args.breadth, thoughts=args.thoughts, depth=args.depth,
            thought_tokens=args.thought_tokens, temperature=args.temperature,
            draft_tokens=args.draft_tokens, eval_tokens=args.eval_tokens)
        k_configs = tuple(ToTSettings(draft_tokens=args.draft_tokens, k_config=tuple(
            int(x) for x in k.split(","))).k_config for k in args.k_config)
        if repeated(k_configs):  # the same trees grown twice
            raise ValueError(f"--k-config {repeated(k_configs)[0]} given twice")
        wl = TotWorkload(args.questions, settings, args.seed, k_configs, args.speculative_eval)
    except ValueError as e:
        raise UserError(str(e)) from None
    print_summary(trace_tot(args.draft, args.target, args.out, wl, args.kv_cache_gb,
                            progress=not args.quiet), args.json)
    return 0


def _config(path: Path, mode: str | None = None, count: int | None = None, depth=None,
            seed: int | None = None, calibrations: dict[str, str] | None = None):
    """A ToT config with its policy's mode (and count, depth, seed, pool calibrations)
    overridden; its workload. The target evaluates states in the ar modes (a config's
    speculative_eval is the speculative modes')."""
    policy = {k: v for k, v in (("type", mode), ("depth", depth)) if v is not None}
    from policies.seed import SPECULATIVE

    if mode is not None and mode not in SPECULATIVE:
        policy["speculative_eval"] = False
    return program_config(path, "tot", count, seed, policy, calibrations)


def live_job(config: str, mode: str, count: int | None, seed: int | None, out_dir: str) -> None:
    """One live replay of a config under a mode (run in its own process)."""
    from live.seed import replay_tot

    cfg, wl = _config(Path(config), mode, count, seed=seed)
    replay_tot(wl, cfg, out_dir)


def cmd_seed_replay(args: argparse.Namespace) -> int:
    """`reasonsim seed replay`: each mode live (repeated: the noise floor) and simulated."""
    import shutil

    from sim.output import write_sim
    from sim.simulate import simulate
    from validation.judge import machine_speed
    from validation.seed import add_at_live_speed, add_judged, compare_modes
    from traces.store import check_out_dir, read_table

    path, out = Path(args.config), Path(args.out)
    modes = args.modes
    check_speed_checks(args)
    try:  # every mode's config, before any engine starts
        cfg, _ = _config(path, modes[0], args.count, seed=args.seed)
        for mode in modes[1:]:
            _config(path, mode, args.count, seed=args.seed)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    if not args.rejudge:  # a rejudge reads the live runs already there
        check_out_dir(out, resume=False, can_resume=False)
    cal_seed = (cfg.seed if args.seed is None else args.seed) + CALIBRATION_SEED_OFFSET
    lives = _live_runs(args, path, out, modes, cal_seed)
    try:
        calibrations = seed_calibrations(cfg, out / "calibration") if args.calibrate_here \
            else None
    except ValueError as e:
        raise UserError(f"--calibrate-here: {e}") from None
    results = {}
    for mode in modes:
        cfg, _ = _config(path, mode, args.count, seed=args.seed, calibrations=calibrations)
        sim = simulate(cfg)
        if args.rejudge:  # the simulation's own output, written again
            shutil.rmtree(out / mode / "sim", ignore_errors=True)
        write_sim(cfg, sim, out / mode / "sim")
        results[mode] = ((sim.programs.to_pandas(),
                          read_table(out / mode / "sim", "tot_requests").to_pandas()),
                         lives[mode])
    result = compare_modes(results)
    add_at_live_speed(result, {mode: at_live_speed(path, args, mode, out, calibrations)
                               for mode in modes})
    if args.speed_checks:
        add_judged(result, _beside(path, args, out, modes, calibrations))
    if calibrations:
        result["calibrations"] = calibrations
    result["machine_speed"] = {mode: machine_speed(out / mode / "sim", [
        out / mode / f"live{i}" for i in range(args.repeats)]) for mode in modes}
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    for speed in result["machine_speed"].values():
        if speed["warning"]:
            print(speed["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_modes(result, f"ToT sim vs live: {path.name}")
    print(f"details: {out / 'compare.json'}")
    return 0


def _live_runs(args, path: Path, out: Path, modes: list[str], cal_seed: int) -> dict[str, list]:
    """Per mode, each repeat's live (programs, tot_requests) tables: run now (with
    --calibrate-here, each after its calibration run), or read back with --rejudge."""
    from traces.store import read_table
    from validation.replay import fresh_process

    lives: dict[str, list] = {mode: [] for mode in modes}
    # Repeat-major: every mode's i-th run (and, with --calibrate-here, its calibration run just
    # before it) close in time, so a shared machine's drift lands on all modes alike.
    for i in range(args.repeats):
        for mode in modes:
            d = out / mode / f"live{i}"
            if args.rejudge:  # the live runs are there: judge them again, nothing runs live
                if not (d / "tot_requests").is_dir():
                    raise UserError(f"--rejudge: {d} holds no live run (tot_requests)")
                _check_served(d, _config(path, mode, args.count, seed=args.seed)[0])
            else:
                if args.calibrate_here:
                    fresh_process(live_job, str(path), mode, args.count, cal_seed,
                                  str(out / "calibration" / mode / f"live{i}"))
                fresh_process(live_job, str(path), mode, args.count, args.seed, str(d))
                if args.speed_checks:  # the calibration's programs again, right after it
                    fresh_process(live_job, str(path), mode, args.count, cal_seed,
                                  str(out / "calibration" / mode / f"check{i}"))
            lives[mode].append((read_table(d, "programs").to_pandas(),
                                read_table(d, "tot_requests").to_pandas()))
    return lives


def _check_served(live_dir: Path, cfg) -> None:
    """A live run judged again was served from this config (its count, seed and mode): judged
    against another, its decisions would agree or not by chance."""
    import json

    from traces.store import read_run

    served = read_run(live_dir)["params"].get("config")
    wanted = json.loads(cfg.to_json())
    if served != wanted:
        keys = sorted(k for k in set(served or {}) | set(wanted)
                      if (served or {}).get(k) != wanted.get(k))
        raise UserError(f"--rejudge: {live_dir} was served from another config than this one "
                        f"(differs in {', '.join(keys) or 'everything'}); give the config, "
                        "--count and --seed it was served with")


def _beside(path: Path, args, out: Path, modes: list[str], calibrations) -> dict:
    """`--speed-checks`: per mode, each live run re-simulated at the decode level of the
    calibration-traffic runs beside it (`validation.beside_checks`: any mode's, on each pool)."""
    from validation.beside_checks import beside_levels

    cal = out / "calibration"
    fitted, checks = sorted(cal.glob("*/live*")), sorted(cal.glob("*/check*"))
    if not checks:  # a --rejudge of runs served without them
        raise UserError(f"--speed-checks: {cal} holds no speed check (calibration/MODE/check<i>)")
    lives = [out / mode / f"live{i}" for mode in modes for i in range(args.repeats)]
    # every mode simulates with the same pooled calibrations: the traffic is priced once
    levels = beside_levels(out / modes[0] / "sim", fitted + checks, lives, fitted=len(fitted))
    return {mode: at_live_speed(path, args, mode, out, calibrations,
                                levels[k * args.repeats:(k + 1) * args.repeats], "sim_beside")
            for k, mode in enumerate(modes)}


def at_live_speed(path: Path, args, mode: str, out: Path, calibrations,
                  levels: list[dict] | None = None, name: str = "sim_at_live") -> list[dict]:
    """The mode re-simulated once per live run, every pool's step times scaled to that run's
    measured speed (`sim.step_time.live_speed`), or to `levels` (per run, pool -> factor);
    per run: the factors by pool and the simulated programs."""
    from dataclasses import replace

    from sim.step_time.live_speed import scaled_calibration, step_speed_ratio
    from sim.simulate import simulate

    cfg, _ = _config(path, mode, args.count, seed=args.seed, calibrations=calibrations)
    pools = {g.pool: g.calibration for g in cfg.replicas}
    runs = []
    for i in range(args.repeats):
        # a pool the mode never used (ar: the draft) ran no step: left as calibrated
        live = out / mode / f"live{i}"
        speed = levels[i] if levels is not None else {
            p: step_speed_ratio(cal, live / p) if (live / p).is_dir() else None
            for p, cal in pools.items()}
        scaled = {p: str(scaled_calibration(pools[p], f, out / mode / f"{name}{i}"
                                            / f"{p}.calib.json"))
                  for p, f in speed.items() if f is not None}
        cfg_i, _ = _config(path, mode, args.count, seed=args.seed,
                           calibrations={**(calibrations or {}), **scaled})
        runs.append({"step_speed": speed,
                     "programs": simulate(replace(cfg_i, write_steps=False)).programs.to_pandas()})
    return runs


def seed_calibrations(cfg, cal_dir: Path) -> dict[str, str]:
    """`--calibrate-here`: one calibration per pool from the calibration runs under `cal_dir`
    (`<mode>/live<i>/<pool>`), the loop's host time from every run; pool -> path."""
    pools = dict.fromkeys(g.pool for g in cfg.replicas)
    return calibrate_pools({p: sorted(cal_dir.glob(f"*/live*/{p}")) for p in pools},
                           sorted(cal_dir.glob("*/live*")), cal_dir)


def cmd_seed_modes(args: argparse.Namespace) -> int:
    """`reasonsim seed modes`: every mode simulated at every depth; speedups and figures."""
    import pandas as pd

    from sim.simulate import simulate
    from sim.families.seed.report import mode_sweep, plot_speedup, plot_timeline

    path = Path(args.config)
    modes = args.modes
    depths = args.depths or [None]

    def load(mode, depth):
        try:
            return _config(path, mode, args.count, depth)[0]
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: {e}") from None

    rows = mode_sweep(load, modes, depths)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "seed_modes.json").write_text(json.dumps(rows, indent=1) + "\n")
        if len(depths) > 1:
            plot_speedup(rows, out / "seed_speedup_vs_depth.png",
                         f"ToT on the testbed (simulated): {path.name}")
        timeline = {}
        for mode in [m for m in ("sd", "seed") if m in modes]:
            cfg = _config(path, mode, 1, depths[-1])[0]
            sim = simulate(cfg)
            steps = sim.steps.to_pandas()
            pools = {g.pool: i for i, g in enumerate(cfg.replicas)}
            timeline[mode] = (steps, pools)
        if timeline:
            plot_timeline(timeline, out / "seed_timeline.png", "one tree: draft and target "
                          "busy (simulated)")
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"ToT modes (simulated): {path.name}")
    for c in ("depth", "mode", "mean s", "P90 s", "vs ar", "vs sd", "acceptance",
              "target busy", "verify wait P90 ms", "TG vs ar", "SE vs ar", "SE acceptance"):
        t.add_column(c, justify="right")
    f = lambda x, p: "-" if x is None or pd.isna(x) else p.format(x)
    for r in rows:
        t.add_row(str(r["depth"] or ""), r["mode"], f(r["latency_mean_s"], "{:.3f}"),
                  f(r["latency_p90_s"], "{:.3f}"), f(r["speedup_vs_ar"], "{:.2f}x"),
                  f(r["speedup_vs_sd"], "{:.2f}x"), f(r["acceptance_rate"], "{:.3f}"),
                  f(r["target_busy_fraction"], "{:.2f}"),
                  f(r["verify_queue_wait_p90_s"] and r["verify_queue_wait_p90_s"] * 1e3,
                    "{:.1f}"), f(r["generator_speedup_vs_ar"], "{:.2f}x"),
                  f(r["evaluator_speedup_vs_ar"], "{:.2f}x"),
                  f(r["eval_acceptance_rate"], "{:.3f}"))
    Console(width=170).print(t)
    print("TG / SE: the Thought Generator's / State Evaluator's time in flight (mean per tree) "
          "over ar's")
    return 0


def _print_modes(result: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    cols = ("mode", "sim mean s", "live mean s", "error", "at live speed", "live vs live",
            "agreement", "speedup vs ar sim", "at live speed", "live", "vs sd sim",
            "at live speed", "live")
    for c in cols:
        t.add_column(c, justify="left" if c == "mode" else "right")
    f = lambda x, p="{:.3f}": "-" if x is None else p.format(x)
    x = "{:.2f}x"
    for mode, r in result["modes"].items():
        ar, sd = r["speedup_vs_ar"], r["speedup_vs_sd"]
        t.add_row(mode, f(r["sim_mean_s"]), " ".join(f(v) for v in r["live_mean_s"]),
                  f(r["error"], "{:+.1%}"), f(r.get("at_live_speed", {}).get("error"), "{:+.1%}"),
                  f(r.get("live_vs_live"), "{:+.1%}"), f(r.get("decision_agreement")),
                  f(ar["sim"], x), f(ar.get("sim_at_live_speed"), x), f(ar["live"], x),
                  f(sd["sim"], x), f(sd.get("sim_at_live_speed"), x), f(sd["live"], x))
    Console(width=200).print(t)
    for mode, r in result["modes"].items():
        if "judged" in r:
            from validation.beside_checks import judged_line

            print(f"{mode}: " + judged_line(r["judged"]))
    print("at live speed: re-simulated with every engine's step times scaled to each live run's "
          "measured speed (median live step / predicted), beside the raw figures")
    for mode, r in result["modes"].items():
        for base in ("ar", "sd"):
            j = r[f"speedup_vs_{base}"].get("judged")
            if j is None or mode == "ar":  # ar over sd: sd over ar, inverted
                continue
            fast = j.get("at_live_speed")
            print(f"{mode} over {base}: sim {j['sim']:.2f}x, live runs "
                  + ", ".join(f"{v:.2f}x" for v in j["live"])
                  + f" (spread {j['spread']:.0%}): error {j['error']:+.1%} "
                  + ("ok" if j["ok"] else "NOT ok")
                  + ("" if fast is None else f"; at live speed {fast['sim']:.2f}x, "
                     f"{fast['error']:+.1%} " + ("ok" if fast["ok"] else "NOT ok"))
                  + f" (within {j['tolerance']:.0%} or the spread)")


def add_tot_trace_parser(tsub) -> None:
    """The `trace tot` subparser."""
    s = tsub.add_parser("tot", help="Tree-of-Thoughts on two vLLM engines: every request",
                        description="Grow a Tree-of-Thoughts BFS on held-out testbed questions "
                        "twice, through the live runner on two in-process vLLM engines: by the "
                        "target alone (ar) and in speculative rounds (sd: the draft writes K "
                        "tokens, the target verifies them from prompt log-probabilities), and "
                        "with --k-config in multi-candidate rounds. Every request's outcome "
                        "goes to the tot_requests table.")
    s.add_argument("--draft", default=str(TESTBED / "draft"), help="draft model directory")
    s.add_argument("--target", default=str(TESTBED / "target-large"),
                   help="target model directory")
    s.add_argument("-o", "--out", required=True, help="trace directory to write")
    s.add_argument("--questions", type=int_at_least(1), default=2,
                   help="questions per family x level")
    s.add_argument("--breadth", type=int_at_least(1), default=2, help="states kept per level (b)")
    s.add_argument("--thoughts", type=int_at_least(1), default=3, help="thoughts per state (n)")
    s.add_argument("--depth", type=int_at_least(1), default=4, help="levels (T)")
    s.add_argument("--thought-tokens", type=int_at_least(1), default=24, help="cap on one thought")
    s.add_argument("--temperature", type=TEMPERATURE, default=0.7, help="0 = greedy")
    s.add_argument("--draft-tokens", type=int_at_least(1), default=4, help="K drafted per round")
    s.add_argument("--k-config", action="append", default=[], metavar="K1,K2,..",
                   help="also grow the tree of multi-candidate rounds (MCSD; SEED's tree "
                   "drafts) with this many candidates per drafted position, e.g. 2,1,1,1 "
                   "(repeatable)")
    s.add_argument("--eval-tokens", type=int_at_least(1), default=1,
                   help="tokens a value prompt writes (the state's answer; its value is the "
                   "probability of the first)")
    s.add_argument("--speculative-eval", action="store_true",
                   help="also grow the tree whose value prompts' answers are drafted and "
                   "verified too (sd-se: SEED's State Evaluator under speculative execution)")
    s.add_argument("--kv-cache-gb", type=CACHE_GB, default=0.5)
    s.add_argument("--seed", type=seed_int, default=0)
    s.add_argument("--json", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_trace_tot)


def add_replay_parser(ssub) -> None:
    """The `seed replay` subparser."""
    r = ssub.add_parser("replay", help="a ToT config live under each mode vs simulated",
                        description="For each mode: the config's programs live on two vLLM "
                        "engines (--repeats times, each in a fresh process: the live-vs-live "
                        "spread) and simulated; per-tree latency errors, decision agreement "
                        "(same requests, same accepted lengths, same trees) and each mode's "
                        "speedup over ar and sd, simulated and live.")
    r.add_argument("config", help="a ToT config (workload.programs.method: tot)")
    r.add_argument("-o", "--out", required=True, help="directory for the runs and compare.json")
    r.add_argument("--modes", type=names, default="ar,sd,seed", help=f"of {MODES_DEFAULT}")
    r.add_argument("--repeats", type=int_at_least(1), default=2)
    r.add_argument("--count", type=int_at_least(1), help="programs (default: the config's)")
    r.add_argument("--seed", type=seed_int, help="the config's seed, overridden (other traffic)")
    r.add_argument("--calibrate-here", action="store_true",
                   help="before each validation run, serve other programs of the config (seed "
                   f"+ {CALIBRATION_SEED_OFFSET}) live under the same mode, and simulate with "
                   "pool calibrations fitted on those runs' steps (this machine, now)")
    add_speed_checks(r)
    r.add_argument("--rejudge", action="store_true",
                   help="run nothing live: simulate again and judge against the live runs "
                   "already in -o (the same --modes, --repeats and --calibrate-here), e.g. "
                   "after a simulator change")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_seed_replay)

    m = ssub.add_parser("modes", help="every ToT mode simulated (per depth): speedups, figures",
                        description="Simulate a ToT config under each mode (and each tree "
                        "depth up to the trace's): mean and P90 tree latency, speedup over ar "
                        "and sd, acceptance, target busy fraction, verify queue wait; with -o, "
                        "seed_modes.json, the speedup-vs-depth figure and a one-tree timeline "
                        "of draft and target busy time under sd and seed.")
    m.add_argument("config", help="a ToT config (workload.programs.method: tot)")
    m.add_argument("--modes", type=names, default=MODES_DEFAULT)
    m.add_argument("--depths", type=ints, help="comma-separated depths (default: the config's)")
    m.add_argument("--count", type=int_at_least(1), help="programs (default: the config's)")
    m.add_argument("-o", "--out", help="write seed_modes.json and the figures here")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_seed_modes)

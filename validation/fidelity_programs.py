"""The fidelity suite's program workloads (`validation.fidelity`): an example program config on
this machine's calibration, replayed live on the engine of its trace, judged on program latency,
tokens and decision agreement. On the PyTorch engine the example's trace is recorded again on
that engine first (same workload settings): only an engine's own trace reproduces its sampling.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from validation.bursts import tails_against
from validation.fidelity_judging import (LIVE_RUNS, Planned, leveled_errors, probe_levels,
                                         sampled_medians, scaled_config, simulate_with_band)
from validation.replay import REPO, fresh_process, resolve_model
from validation.speed_checks import NEIGHBOURS, medians_at

PROGRAM_TOLERANCE = {"program_latency_p50": 0.05, "program_latency_p90": 0.05,
                     "tokens_per_program": 0.01}


def program_config(spec: dict, cal: Path, quick: bool, trace: Path | None = None) -> dict:
    """The simulation config of a suite's program workload (an example config, its paths
    relative to `examples/`) on calibration `cal` (on `trace` instead of the example's, where
    given: one recorded on the PyTorch engine, which has no prefix cache)."""
    from sim.config import read_yaml
    from traces.store import read_run

    example = REPO / "examples" / spec["program"]
    d = read_yaml(example)
    # A suite entry's `programs:` settles the example's workload settings it names (a rate,
    # a policy, a deadline): held-out variants of a shipped example.
    d["workload"]["programs"].update(spec.get("programs", {}))
    d["workload"]["programs"]["count"] = spec.get("quick_count" if quick else "count",
                                                  spec.get("count", 16))
    d["seed"] = spec.get("seed", d.get("seed", 0))
    d["cluster"]["replicas"][0]["calibration"] = str(cal)
    if trace is not None:
        d["workload"]["programs"]["trace"] = str(trace)
        d["cluster"]["replicas"][0]["enable_prefix_caching"] = False
    # The live program engine pages KV (and caches the shared reasoning prefixes) in the
    # blocks its trace ran with, not the grid engine's: simulate that engine.
    trace = (example.parent / d["workload"]["programs"]["trace"]).resolve()
    d["cluster"]["replicas"][0]["block_size"] = int(
        read_run(trace)["params"]["engine"].get("block_size", 32))
    d["output"] = {"steps": True}
    return d


def check_program_spec(spec: dict) -> None:
    """Fail before any engine starts on a program entry whose example is missing, is of a
    family the loop cannot replay on one engine, or whose `programs:` / `seed:` / count
    settings the example's config does not take (quick and full)."""
    from live.families import FAMILIES as LIVE
    from programs.families import family_of
    from sim.config import parse_config, read_yaml

    example = REPO / "examples" / str(spec["program"])
    if not example.is_file():
        raise ValueError(f"program: no example config {example.name} in examples/")
    d = read_yaml(example)
    if "programs" not in (d.get("workload") or {}):
        raise ValueError(f"program: {example.name} is not a program config (workload.programs)")
    cal = example.parent / d["cluster"]["replicas"][0]["calibration"]
    for quick in (False, True):
        wl = parse_config(program_config(spec, cal, quick), example.parent).programs
        family = family_of(wl.method, wl.policy).name
        if family not in LIVE.all():
            raise ValueError(f"program: {example.name} is of the {family} family; the loop "
                             f"replays one-engine families live ({', '.join(sorted(LIVE.all()))})"
                             f"; `reasonsim {family} replay` replays its configs")


def program_workload(name: str, spec: dict, cal: Path, out: Path, quick: bool,
                     engine: str = "vllm", device: str = "auto") -> Planned:
    """One program workload (an example config with this machine's calibration) set up under
    out/name: its LIVE_RUNS live replays and its judging (decision agreement too). On the
    PyTorch engine its trace is recorded again there first."""
    from live.replay import engine_args, replay_workload
    from sim.config import parse_config

    example = REPO / "examples" / spec["program"]
    (out / name).mkdir(parents=True)
    trace = None
    if engine == "torch":
        trace = out / name / "trace"
        fresh_process(retrace_on_torch, example_trace(example), trace, spec.get("retrace", {}),
                      device)
    d = program_config(spec, cal, quick, trace)
    (out / name / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    cfg = parse_config(d, example.parent)
    wl = cfg.programs
    lives = [out / name / f"live{i + 1}" for i in range(LIVE_RUNS)]
    return Planned(lives, lambda live: fresh_process(
        replay_workload, wl, cfg.scheduler, live, seed=cfg.seed,
        **engine_args(cfg), config_json=cfg.to_json(), device=device),
        lambda levels: judge_programs(name, d, out / name, lives, levels),
        lambda factors: medians_at(d, factors, out / name, REPO / "examples", NEIGHBOURS),
        # every chunk and probe samples with a seed, as `judge_programs` prices them
        tails_against(d["cluster"]["replicas"][0]["calibration"], all_seeded=True))


def judge_programs(name: str, d: dict, out_dir: Path, lives: list[Path],
                   levels: list[dict]) -> dict:
    """Simulate the program workload config `d` (an example's, paths relative to examples/)
    into out_dir and judge it against its live runs, and at the speed checks' `levels` where
    there are any: the table row with decision agreement."""
    from sim.config import parse_config
    from sim.step_time.calibration import load_calibration
    from sim.step_time.live_speed import probes_level
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from validation.bursts import calibration_tail, run_speed
    from validation.judge import judge, judge_at_probe
    from validation.speed_checks import at_traffic_speed, judge_at_traffic
    from traces.store import read_table

    base_dir = REPO / "examples"
    sim, band = simulate_with_band(parse_config(d, base_dir), out_dir / "sim")
    live_tables = [read_table(live, "programs").to_pandas() for live in lives]
    results = [compare(sim.programs.to_pandas(), t) for t in live_tables]
    # the live engine against itself: batch-dependent numerics can flip a sampled probe answer
    live_agreement = (compare(live_tables[0], live_tables[1])["decision_agreement"]
                      if len(live_tables) > 1 else 1.0)
    # every chunk and probe samples with a seed: the prediction the ratio divides by says so
    cal = d["cluster"]["replicas"][0]["calibration"]
    runs = [run_speed(cal, live, all_seeded=True) for live in lives]
    speeds = [r["decode"] for r in runs]
    cal_tail = calibration_tail(load_calibration(cal).latency)
    leveled = [programs_at_live_speed(d, f, out_dir / f"sim_at_live{i + 1}", live, base_dir)
               for i, (f, live) in enumerate(zip(speeds, lives))]
    metrics = {m: judge(results[0]["sim"]["program_latency_s"][m[-3:]],
                        [r["live"]["program_latency_s"][m[-3:]] for r in results],
                        PROGRAM_TOLERANCE[m], band.get(m))
               for m in ("program_latency_p50", "program_latency_p90")}
    leveled_errors(metrics, leveled)
    probe = probes_level(cal, lives) or {}
    if probe:  # simulated at the speeds the probes measured around the live runs
        cfg = scaled_config(d, probe["decode"], out_dir / "sim_at_probe", base_dir,
                            probe["prefill_factor"])
        lat = compare(simulate(cfg).programs.to_pandas(), live_tables[0])["sim"][
            "program_latency_s"]
        med = sampled_medians(cfg)
        for m in ("program_latency_p50", "program_latency_p90"):
            judge_at_probe(metrics[m], med[m], lat[m[-3:]])
    traffic = at_traffic_speed(d, lives, levels, out_dir, base_dir)
    for m in ("program_latency_p50", "program_latency_p90") if traffic else ():
        judge_at_traffic(metrics[m], traffic["median"][m])
    metrics["tokens_per_program"] = judge(results[0]["sim"]["tokens_per_program"],
                                          [r["live"]["tokens_per_program"] for r in results],
                                          PROGRAM_TOLERANCE["tokens_per_program"])
    agreement = min(r["decision_agreement"] for r in results)
    return {"workload": name, "kind": "programs", "metrics": metrics,
            "decision_agreement": agreement, "live_agreement": live_agreement,
            # as the latency metrics: no further off than live is from live (1.0 if exact)
            "agreement_ok": agreement >= live_agreement,
            "step_speed": [{"decode": r["decode"], "prefill": None, "tail": r["tail"],
                            "calibration_tail": cal_tail} for r in runs],
            **probe_levels(probe), "traffic_factors": traffic and traffic["factors"]}


def programs_at_live_speed(d: dict, factor: float | None, out_dir: Path, live: Path,
                           base_dir: Path) -> dict | None:
    """A program workload's latency errors against one live run with the simulation's step
    times scaled to that run's decode speed (`at_live_speed`, for programs)."""
    from sim.program_metrics import compare
    from sim.simulate import simulate
    from traces.store import read_table

    if factor is None:
        return None
    cfg = scaled_config(d, factor, out_dir, base_dir)
    c = compare(simulate(cfg).programs.to_pandas(), read_table(live, "programs").to_pandas())
    med = sampled_medians(cfg)
    return {m: (err, med[m] / c["live"]["program_latency_s"][m[-3:]] - 1)
            for m, err in c["error"].items() if m in ("program_latency_p50", "program_latency_p90")}


def replay_at_live_speed(d: dict, base_dir: Path, live: Path, out_dir: Path) -> dict | None:
    """A program replay's latency errors at its live run's decode speed (every step priced as
    seeded, as the programs sample): the level, and the mean run's and the noise draws'
    median errors (`programs_at_live_speed`); None where the live run had no decode step."""
    from sim.step_time.live_speed import step_speed_ratio

    group = d["cluster"]["replicas"][0]
    cal = (base_dir / group["calibration"]).resolve()  # an absolute path stays as it is
    d = {**d, "cluster": {**d["cluster"], "replicas": [{**group, "calibration": str(cal)}]}}
    level = step_speed_ratio(cal, live, all_seeded=True, decode_only=True)
    got = programs_at_live_speed(d, level, out_dir, live, base_dir)
    if got is None:
        return None
    return {"decode_level": level, "error": {m: v[0] for m, v in got.items()},
            "error_sampled": {m: v[1] for m, v in got.items()}}


def example_trace(example: Path) -> Path:
    """The probes or branches trace an example program config reads."""
    from sim.config import read_yaml

    trace = read_yaml(example)["workload"]["programs"]["trace"]
    return (example.parent / trace).resolve()


def retrace_on_torch(trace: Path, out_dir: Path, overrides: dict, device: str) -> None:
    """Record `trace`'s probes or branches workload again on the PyTorch engine (`overrides`:
    workload settings changed, e.g. fewer questions)."""
    from live.branches import BranchWorkload, trace_branches
    from programs.search import SearchSettings
    from tracers.probes import ProbeWorkload, trace_probes
    from traces.store import read_run

    run = read_run(trace)
    w = {**run["params"]["workload"], **overrides}
    if run["kind"] == "probes":
        trace_probes(resolve_model(run["model_id"]), out_dir, ProbeWorkload(**w), progress=False,
                     engine="torch", device=device)
    elif run["kind"] == "branches":
        w = {**w, "settings": SearchSettings(**w["settings"]), "methods": tuple(w["methods"]),
             "rebase_widths": tuple(w["rebase_widths"])}
        trace_branches(resolve_model(run["model_id"]), out_dir, BranchWorkload(**w), progress=False,
                       engine="torch", device=device)
    else:
        raise ValueError(f"{trace}: a {run['kind']} trace; programs replay probes or branches")

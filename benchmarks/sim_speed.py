"""Simulator speed: simulated requests per CPU-second and events per request, by scale.

    python benchmarks/sim_speed.py --quick --json     # about 1 minute
    python benchmarks/sim_speed.py --families         # every program family, compiled, under
                                                      # SimPy, its decisions alone and doubled
                                                      # outputs (`family_speed`), and HELIOS's
                                                      # what-if stream (`helios_speed`; ~6 min)
    python benchmarks/sim_speed.py                    # 1k -> 1M requests, 1 -> 1,000 replicas,
                                                      # 1M Dynasor CoT and SC programs on
                                                      # 1,000 replicas (--program-families:
                                                      # any family's), Vidur beside if --vidur

The same plain workload is timed with each step-time model kind (`calibrations`): the shipped
linear calibration and a `serving` one (`calibrate`'s default) fitted in the run on the shipped
testbed traces, each compiled and under SimPy (and beside Vidur's loop with --vidur).

Cost must grow with scheduling events, not tokens: the same requests with output lengths doubled
should cost about the same, both at the same arrival rate (double_tokens_cost_ratio: twice the
concurrency, so larger batches) and at half the rate (double_tokens_half_rate_cost_ratio: the
same concurrency). Every figure is the median of
`--repeats` runs measured in this process (CPU time via time.process_time), with the spread.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from family_speed import FAMILIES, families, program_config, table  # noqa: E402  (this directory)
from helios_speed import at_scale, helios_row, line, peak_rss_gb  # noqa: E402  (this dir)
from programs.workload import forget_banks  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.config import parse_config  # noqa: E402
from sim.workloads.requests import workload_from_config, workload_to_vidur_csv  # noqa: E402

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
TRACES = REPO / "traces" / "data" / "testbed-large-cpu"
"""the shipped testbed traces the serving calibration is fitted on (`serving_calibration`)"""


def serving_calibration() -> Path:
    """A `serving` calibration (`calibrate`'s default model, every term it fits) of the
    shipped testbed traces, written under .bench/."""
    from sim.step_time.calibration import calibrate

    path = REPO / ".bench" / "serving.calib.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(calibrate([TRACES]).to_json()))
    return path


def config(n: int, replicas: int, per_replica_rate: float = 15.0, cal: Path = CAL):
    """Poisson load near 70% of one testbed replica's capacity (~22 req/s), lognormal lengths."""
    return parse_config({
        "seed": 0,
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": per_replica_rate * replicas},
                     "num_requests": n,
                     # Maxima keep prompt + doubled output within max_model_len (1280).
                     "prompt_tokens": {"kind": "lognormal", "mean": 256, "sigma": 0.8,
                                       "max": 512},
                     "output_tokens": {"kind": "lognormal", "mean": 128, "sigma": 0.8,
                                       "max": 384}},
        "cluster": {"router": "least_outstanding",
                    "replicas": [{"calibration": str(cal), "count": replicas}]},
        "output": {"steps": False}})


def measure(cfg, workload, repeats: int, lazy: bool = True, compiled: bool = True) -> dict:
    """Median CPU seconds of simulate() over repeats, with min/max (lazy=False: the reference
    replica, `sim.engine.lazy_replica`; compiled=False: under SimPy, `sim.kernels.plain`)."""
    cpu = []
    for _ in range(repeats):
        gc.collect()  # the garbage of what ran before (a calibration's fit) is not this run's
        t0 = time.process_time()
        res = simulate(cfg, workload, lazy=lazy, compiled=compiled)
        cpu.append(time.process_time() - t0)
    n = len(workload)
    med = statistics.median(cpu)
    return {"requests": n, "replicas": res.summary["replicas"], "cpu_s": med,
            "cpu_s_min": min(cpu), "cpu_s_max": max(cpu),
            "requests_per_cpu_s": n / med, "events_per_request": res.summary["events_per_request"],
            "iterations_per_request": res.summary["iterations"] / n,
            "output_tokens": res.summary["output_tokens"],
            "simulated_s": res.summary["makespan_s"],
            "real_time_factor": med / res.summary["makespan_s"]}


PROGRAMS = {**{name: example for name, (example, _, _) in FAMILIES.items()},
            "helios": "helios-opt-whatif.yaml"}
"""per program family, the example timed at scale (`--program-families`; Dynasor CoT with
probes and self-consistency by default)"""


def programs(n: int, replicas: int, method: str = "cot", simpy: bool = False,
             fold: bool = False) -> dict:
    """A family's example programs (`PROGRAMS[method]`) on `replicas` replicas per group at
    half of the example's rate each: CPU seconds of one run, its simulated requests per
    CPU-second and the process's peak memory (`simpy`: and the same run under SimPy; `fold`:
    no requests table, `output.requests: false`; HELIOS: a stream of `n` prompts,
    `helios_speed.at_scale`)."""
    if method == "helios":
        return at_scale(n, replicas)
    cfg = program_config(PROGRAMS[method], n, replicas, requests=not fold)
    forget_banks()  # the trace's load timed, as a process's first run
    t0 = time.process_time()
    res = simulate(cfg)
    cpu = time.process_time() - t0
    s = res.summary
    out = {"method": method, "simulator": s["simulator"], "programs": n, "replicas": replicas,
           "requests": s["requests"], "requests_table": not fold, "cpu_s": cpu,
           "programs_per_cpu_s": n / cpu, "requests_per_cpu_s": s["requests"] / cpu,
           "events_per_program": s["events"] / n, "peak_rss_gb": peak_rss_gb(),
           "simulated_s": s["makespan_s"], "real_time_factor": cpu / s["makespan_s"]}
    if simpy:
        del res
        t0 = time.process_time()
        simulate(cfg, compiled=False)
        out["simpy_cpu_s"] = time.process_time() - t0
        out["compiled_speedup"] = out["simpy_cpu_s"] / cpu
    return out


def _families(value: str) -> list[str]:
    """`--program-families`: known family names, comma-separated."""
    names = [f for f in value.split(",") if f]
    if unknown := [f for f in names if f not in PROGRAMS]:
        raise argparse.ArgumentTypeError(f"unknown families {unknown}; known: {list(PROGRAMS)}")
    return names


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k requests only (< 1 minute)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    pair = lambda v: tuple(int(x) for x in v.split(","))  # noqa: E731
    ap.add_argument("--scale", type=pair, action="append", metavar="REQUESTS,REPLICAS",
                    help="plain request scales to time, instead of the grid (repeatable)")
    ap.add_argument("--programs", type=pair, metavar="PROGRAMS,REPLICAS",
                    help="the program scale (default 20000,40 quick, else 1000000,1000)")
    ap.add_argument("--program-families", default="cot,sc", type=_families,
                    help="the families timed at that scale, comma-separated, of "
                         f"{', '.join(PROGRAMS)} (default cot,sc; none: '')")
    ap.add_argument("--fold-requests", action="store_true",
                    help="the program runs keep no requests table: each request folds into the "
                         "summary as it finishes (output.requests: false; A1's and SEED's "
                         "million programs need it to fit in memory)")
    ap.add_argument("--programs-simpy", action="store_true",
                    help="also time the program runs under SimPy (the compiled path's reference)")
    ap.add_argument("--double-at", type=pair,
                    metavar="REQUESTS,REPLICAS",
                    help="where to measure doubled output lengths (default: the first scale)")
    ap.add_argument("--families", action="store_true",
                    help="only the per-family table (`family_speed`): every program family's "
                         "example compiled, under SimPy, its decisions alone and doubled outputs, "
                         "and HELIOS's what-if stream (`helios_speed`; about 6 minutes)")
    ap.add_argument("--vidur", action="store_true",
                    help="also run Vidur on the same arrivals/lengths (benchmarks/vidur_runner.py;"
                         " with --families: on --quick's plain workload, beside the families)")
    return ap


def measure_all(args) -> tuple[dict, object, dict]:
    """Every figure: (the result, the doubling workload, its base measurement)."""
    grid = args.scale or ([(10_000, 4)] if args.quick else [(1_000, 1), (10_000, 10),
                                                             (100_000, 100), (1_000_000, 1_000)])
    # The compiled kernel's first call in a process loads it from numba's cache (compiling it
    # anew, ~10 s, once per checkout): timed apart, as Vidur's predictor training is.
    t0 = time.process_time()
    simulate(config(100, 1), compiled=True)
    kernel_load_cpu_s = time.process_time() - t0
    rows = []
    for n, replicas in grid:
        cfg = config(n, replicas)
        w = workload_from_config(cfg.workload, cfg.seed)
        rows.append(measure(cfg, w, args.repeats if n <= 100_000 else 1))
    # Same requests, outputs doubled: cost should track events, not tokens.
    n, replicas = args.double_at or (grid[0] if args.quick or len(grid) < 2 else grid[1])
    cfg = config(n, replicas, per_replica_rate=7.5)  # half rate keeps load equal when doubled
    w = workload_from_config(cfg.workload, cfg.seed)
    base = measure(cfg, w, args.repeats)
    double = measure(cfg, w.with_output_scale(2.0), args.repeats)
    # Doubled tokens at half the arrival rate: the same concurrency, so the same batch sizes.
    half = config(n, replicas, per_replica_rate=3.75)
    w_half = workload_from_config(half.workload, half.seed)
    double_half = measure(half, w_half.with_output_scale(2.0), args.repeats)
    # The same doubling on the reference replica (every running request touched per event)
    ref_base = measure(cfg, w, args.repeats, lazy=False)
    ref_double = measure(cfg, w.with_output_scale(2.0), args.repeats, lazy=False)
    # The same workload under SimPy (the lazy replica): what the compiled kernel must equal
    simpy_base = measure(cfg, w, args.repeats, compiled=False)
    simpy_double = measure(cfg, w.with_output_scale(2.0), args.repeats, compiled=False)
    cals = calibrations(n, replicas, args.repeats)
    at = args.programs or ((20_000, 40) if args.quick else (1_000_000, 1_000))
    prog = {method: programs(*at, method, args.programs_simpy, args.fold_requests)
            for method in args.program_families}
    out = {"scales": rows, "programs": prog, "requests_per_cpu_s": rows[0]["requests_per_cpu_s"],
           "calibrations": cals,
           "double_at": [n, replicas],
           "events_per_request": rows[0]["events_per_request"],
           "double_tokens_cost_ratio": double["cpu_s"] / base["cpu_s"],
           "double_tokens_token_ratio": double["output_tokens"] / base["output_tokens"],
           "double_tokens_half_rate_cost_ratio": double_half["cpu_s"] / base["cpu_s"],
           "kernel_load_cpu_s": kernel_load_cpu_s,
           "simpy": {"requests_per_cpu_s": simpy_base["requests_per_cpu_s"],
                     "compiled_speedup": simpy_base["cpu_s"] / base["cpu_s"],
                     "double_tokens_cost_ratio": simpy_double["cpu_s"] / simpy_base["cpu_s"]},
           "reference_replica": {"cpu_s": ref_base["cpu_s"],
                                 "lazy_speedup": ref_base["cpu_s"] / simpy_base["cpu_s"],
                                 "double_tokens_cost_ratio": ref_double["cpu_s"]
                                 / ref_base["cpu_s"]}}
    return out, w, base


def calibrations(n: int, replicas: int, repeats: int) -> dict:
    """Per step-time model kind, the doubling workload's base (half rate) compiled and under
    SimPy: requests per CPU-second, events per request, the kernel's speedup."""
    out, repeats = {}, max(repeats, 5)  # a 10k-request run takes ~0.05 CPU-s: more repeats
    for kind, cal in (("linear", CAL), ("serving", serving_calibration())):
        cfg = config(n, replicas, per_replica_rate=7.5, cal=cal)
        w = workload_from_config(cfg.workload, cfg.seed)
        fast, simpy = measure(cfg, w, repeats), measure(cfg, w, repeats, compiled=False)
        out[kind] = {"requests_per_cpu_s": fast["requests_per_cpu_s"],
                     "events_per_request": fast["events_per_request"],
                     "simpy_requests_per_cpu_s": simpy["requests_per_cpu_s"],
                     "compiled_speedup": simpy["cpu_s"] / fast["cpu_s"]}
    return out


def vidur_beside(repeats: int) -> dict:
    """`--families --vidur`: the plain workload of `--quick`'s doubling row (10,000 requests, 4
    replicas) compiled at each step-time model kind and on Vidur's event loop, in the same run
    as the families' rows, which are read against it."""
    cfg = config(10_000, 4, per_replica_rate=7.5)
    w = workload_from_config(cfg.workload, cfg.seed)
    out = {"calibrations": calibrations(10_000, 4, repeats)}
    add_vidur(out, w, measure(cfg, w, repeats))
    return out


def vidur_line(out: dict) -> str:
    """The families' rates over Vidur's loop on the plain workload of the same run (text)."""
    vid = out.get("vidur_beside", {}).get("vidur", {})
    if "requests_per_event_loop_cpu_s" not in vid:
        return f"\nvidur: {vid}" if "vidur_beside" in out else ""
    loop = vid["requests_per_event_loop_cpu_s"]
    rates = {m: r["requests_per_cpu_s"] for m, r in out.items() if m not in ("helios",
                                                                           "vidur_beside")}
    rates["helios"] = out["helios"]["prompts_per_cpu_s"]
    plain = out["vidur_beside"]["calibrations"]
    return (f"\nvidur {vid['vidur_version']}'s event loop on the plain {vid['requests']} requests "
            f"in this run: {loop:.0f} req/cpu-s (reasonsim compiled there: linear "
            f"{plain['linear']['requests_per_cpu_s']:.0f}, serving "
            f"{plain['serving']['requests_per_cpu_s']:.0f}); each family's rate over it: "
            + ", ".join(f"{m} {r / loop:.0f}x" for m, r in rates.items()))


def add_vidur(out: dict, w, base: dict) -> None:
    """Vidur on the same arrivals and lengths, and the speedups against it."""
    csv = workload_to_vidur_csv(w, REPO / ".bench" / "speed_workload.csv")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vidur_runner.py"),
                           "--trace-csv", str(csv), "--out", str(REPO / ".bench" / "vidur-out"),
                           "--json"], capture_output=True, text=True)
    vid = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
        "error": proc.stderr[-500:]}
    out["vidur"] = vid
    if "requests_per_cpu_s" in vid:
        # Loop to loop is the headline; end to end counts Vidur's start-up and predictor,
        # which is only comparable once its predictor is cached (a cold one trains ~15 s).
        out["speedup_vs_vidur_loop"] = (base["requests_per_cpu_s"]
                                        / vid["requests_per_event_loop_cpu_s"])
        for row in out["calibrations"].values():  # the same workload, each model kind
            row["speedup_vs_vidur_loop"] = (row["requests_per_cpu_s"]
                                            / vid["requests_per_event_loop_cpu_s"])
        out["speedup_vs_vidur_end_to_end"] = (base["requests_per_cpu_s"]
                                              / vid["requests_per_cpu_s"])
        if "simpy" in out:
            out["simpy_speedup_vs_vidur_loop"] = (out["simpy"]["requests_per_cpu_s"]
                                                  / vid["requests_per_event_loop_cpu_s"])
        out["vidur_predictor_cached"] = vid.get("predictor_cache") == "hit"
        # the ratios' own numerator: reasonsim on the very workload Vidur ran
        out["same_workload_requests_per_cpu_s"] = base["requests_per_cpu_s"]


def main() -> None:
    """Run the benchmark and print a table or one JSON object."""
    args = _parser().parse_args()
    if args.families:
        fam = families(args.repeats)
        helios = helios_row(24_000, 8, args.repeats)  # the what-if's five policies, 120k prompts
        out = {**fam, "helios": helios}
        if args.vidur:
            out["vidur_beside"] = vidur_beside(args.repeats)
        print(json.dumps(out) if args.json else
              table(fam) + "\n" + line(helios) + vidur_line(out))
        return
    out, w, base = measure_all(args)
    if args.vidur:
        add_vidur(out, w, base)
    if args.json:
        print(json.dumps(out))
        return
    print_table(out, base)


def print_table(out: dict, base: dict) -> None:
    """The result as text."""
    rows, prog, kernel_load_cpu_s = out["scales"], out["programs"], out["kernel_load_cpu_s"]
    print(f"{'requests':>10} {'replicas':>8} {'cpu_s':>8} {'req/cpu-s':>10} {'events/req':>10} "
          f"{'x real time':>11}")
    for r in rows:
        print(f"{r['requests']:>10} {r['replicas']:>8} {r['cpu_s']:>8.2f} "
              f"{r['requests_per_cpu_s']:>10.0f} {r['events_per_request']:>10.2f} "
              f"{r['real_time_factor']:>11.2g}")
    sp = out["simpy"]
    print(f"plain requests compiled (sim/kernels/plain_kernel.py; its cached load "
          f"{kernel_load_cpu_s:.2f} CPU-s apart); under SimPy {sp['requests_per_cpu_s']:.0f} "
          f"req/cpu-s, the kernel "
          f"{sp['compiled_speedup']:.1f}x faster; doubled output tokens there: cost ratio "
          f"{sp['double_tokens_cost_ratio']:.2f}")
    for kind, c in out["calibrations"].items():
        print(f"{kind} step-time model on the doubling workload: {c['requests_per_cpu_s']:.0f} "
              f"req/cpu-s compiled ({c['events_per_request']:.2f} events/req), "
              f"{c['simpy_requests_per_cpu_s']:.0f} under SimPy ({c['compiled_speedup']:.1f}x)"
              + (f", {c['speedup_vs_vidur_loop']:.1f}x Vidur's loop"
                 if "speedup_vs_vidur_loop" in c else ""))
    for method, p in prog.items():
        print(f"{p['programs']} {method} programs ({p['requests']} requests) on "
              f"{p['replicas']} replicas per group ({p['simulator']}): {p['cpu_s']:.1f} CPU-s, "
              f"{p['programs_per_cpu_s']:.0f} programs/cpu-s "
              f"({p['requests_per_cpu_s']:.0f} req/cpu-s, peak {p['peak_rss_gb']:.1f} GB), "
              f"{p['real_time_factor']:.2f}x real time" + (
                  f"; under SimPy {p['simpy_cpu_s']:.1f} CPU-s ({p['compiled_speedup']:.2f}x)"
                  if "simpy_cpu_s" in p else ""))
    print(f"doubled output tokens ({out['double_tokens_token_ratio']:.2f}x tokens): "
          f"cost ratio {out['double_tokens_cost_ratio']:.2f} at the same rate (twice the "
          f"concurrency), {out['double_tokens_half_rate_cost_ratio']:.2f} at half the rate")
    ref = out["reference_replica"]
    print(f"reference replica (sim/engine/replica.py, every running request per event): "
          f"{ref['cpu_s']:.2f} CPU-s, the lazy one (SimPy) {ref['lazy_speedup']:.2f}x faster; "
          f"doubled "
          f"output tokens there: cost ratio {ref['double_tokens_cost_ratio']:.2f}")
    if "speedup_vs_vidur_loop" in out:
        v = out["vidur"]
        print(f"vidur {v['vidur_version']} on the same {v['requests']} requests: "
              f"{v['requests_per_event_loop_cpu_s']:.0f} req/cpu-s (event loop), "
              f"{v['requests_per_cpu_s']:.0f} end to end; reasonsim "
              f"{base['requests_per_cpu_s']:.0f}: {out['speedup_vs_vidur_loop']:.1f}x loop to "
              f"loop, {out['speedup_vs_vidur_end_to_end']:.1f}x end to end (under SimPy "
              f"{out['simpy_speedup_vs_vidur_loop']:.1f}x loop to loop)"
              + ("" if out["vidur_predictor_cached"] else
                 " (Vidur's predictor was trained in this run: run again for a cached one)"))
    elif "vidur" in out:
        print(f"vidur: {out['vidur']}")


if __name__ == "__main__":
    main()

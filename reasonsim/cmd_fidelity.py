"""`reasonsim fidelity`: the table of the whole sim-vs-live loop (the loop: `validation.fidelity`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cmd_fidelity(args: argparse.Namespace) -> int:
    """`reasonsim fidelity`."""
    from validation.fidelity import SUITE, run_fidelity
    from validation.fidelity_report import attempts_text, probe_text, reruns_text, speed_text

    result = run_fidelity(Path(args.out), args.quick, Path(args.suite) if args.suite else SUITE,
                          progress=not args.quiet and not args.json, engine=args.engine,
                          device=args.device, speed_checks=args.speed_checks,
                          **{k: v for k, v in (("retraces", args.retraces),
                                               ("noisy_p90", args.retrace_above),
                                               ("live_reruns", args.live_reruns))
                             if v is not None})
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simulated vs live on {result['device']} (sim: the median of the "
                  "noise draws, each live run's step times at its neighbouring runs' decode "
                  "speed; error vs the mean of the live runs; ok: within tolerance or the "
                  "live-vs-live spread; raw: at the calibration's speed alone; mean run: the "
                  "mean-latency simulation's error)")
    for col in ("workload", "metric", "sim", "live", "error", "spread", "ok", "raw", "mean run",
                "at probe speed", "ok", "at live speed", "sampled at live speed", "in band"):
        table.add_column(col, justify="left" if col in ("workload", "metric") else "right")
    for r in result["workloads"]:
        for m, v in r["metrics"].items():
            table.add_row(r["workload"], m, f"{v['sim']:.4g}",
                          " ".join(f"{x:.4g}" for x in v["live"]), f"{v['error']:+.1%}",
                          f"{v['spread']:.1%}", yes_no(v["ok"]), pct(v.get("error_raw")),
                          pct(v.get("error_mean")),
                          pct(v.get("error_at_probe_speed")), yes_no(v.get("ok_at_probe_speed")),
                          pct(v.get("error_at_live_speed")),
                          pct(v.get("error_sampled_at_live_speed")),
                          f"{sum(v['in_band'])}/{len(v['in_band'])}" if "in_band" in v else "")
        if r.get("step_speed"):
            table.add_row(r["workload"], "steps/predicted", "",
                          " ".join(speed_text(v) for v in r["step_speed"]), "", "", "", "",
                          "", probe_text(r), "", "", "", "")
        if "decision_agreement" in r:
            table.add_row(r["workload"], "decision agreement", "", "",
                          f"{r['decision_agreement']:.3f}", f"live {r['live_agreement']:.3f}",
                          yes_no(r["agreement_ok"]), "", "", "", "", "", "", "")
    Console().print(table)
    c = result["band_coverage"]
    ms = [m for r in result["workloads"] for m in r["metrics"].values()]
    probed = [m["ok_at_probe_speed"] for m in ms if "ok_at_probe_speed" in m]
    traffic = [m["ok_at_traffic_speed"] for m in ms if "ok_at_traffic_speed" in m]
    print(f"within tolerance or spread: {sum(m['ok'] for m in ms)} of {len(ms)} metrics as "
          "judged (at the neighbouring live runs' speed); raw (the calibration's speed alone) "
          f"{sum(m.get('ok_raw', m['ok']) for m in ms)}; at the probes' speed {sum(probed)} of "
          f"{len(probed)}"
          + (f"; at traffic speed {sum(traffic)} of {len(traffic)}" if traffic else ""))
    print(f"live values inside the step-time noise band ({c['band']}, {c['seeds']} draws): "
          f"{c['inside']} of {c['of']}")
    for name, why in result["skipped"].items():
        print(f"not run: {name} ({why})")
    for text in (attempts_text(result), reruns_text(result)):
        if text:
            print(text)
    print(f"report: {Path(args.out) / 'report.md'} ({result['wall_s']} s)")
    return 0


def yes_no(ok: bool | None) -> str:
    """A verdict cell: yes, a red NO, or empty where there is none."""
    return "" if ok is None else "yes" if ok else "[red]NO[/]"


def pct(v: float | None) -> str:
    """An error cell: signed percent, or empty."""
    return "" if v is None else f"{v:+.1%}"


def add_fidelity_parser(sub) -> None:
    """`reasonsim fidelity`."""
    fi = sub.add_parser("fidelity", help="trace, calibrate, simulate and replay live a suite "
                        "of workloads on this machine; one sim-vs-live table",
                        description="Traces a step grid here, calibrates (serving model), then "
                        "simulates each workload of the suite and replays it live twice; each "
                        "metric passes within its tolerance or the live-vs-live spread.")
    fi.add_argument("--quick", action="store_true", help="the quick grid and suite (~3 min)")
    fi.add_argument("-o", "--out", default="reports/fidelity", help="directory to write (new)")
    fi.add_argument("--engine", default="vllm", choices=["vllm", "torch"],
                    help="torch: the PyTorch engine's serving mode (the program workloads' "
                    "traces recorded again on it; prefix-caching workloads not run)")
    fi.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="with --engine torch: where it runs")
    fi.add_argument("--suite", default=None, help="suite YAML (default "
                    "examples/fidelity/suite.yaml)")
    fi.add_argument("--speed-checks", action="store_true",
                    help="replay the calibration traffic again after each live pass and judge "
                    "each live run at the speed of the traffic nearest it too (`at traffic "
                    "speed`; adds about a third to the run)")
    # defaults: validation.fidelity_calibration's (not imported here: every command builds this)
    fi.add_argument("--retraces", type=int, default=None,
                    help="how many times a calibration traced on a noisy spell is traced again "
                    "(default 2; 0 with --quick; the one of lowest held-out step P90 error is "
                    "kept)")
    fi.add_argument("--retrace-above", type=float, default=None, metavar="P90",
                    help="the held-out step P90 error (a fraction) above which a calibration "
                    "is noisy (default 0.2)")
    fi.add_argument("--live-reruns", type=int, default=None, metavar="N",
                    help="how many times a live run that served through a burst of other work "
                    "(its steps 10%% over the calibration's in total against their median) is "
                    "run again (default 1; 0 with --quick; the quietest attempt is judged)")
    fi.add_argument("--json", action="store_true")
    fi.add_argument("-q", "--quiet", action="store_true")
    fi.set_defaults(func=cmd_fidelity)

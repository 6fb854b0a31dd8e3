"""`reasonsim fidelity`: the table of the whole sim-vs-live loop (see reasonsim/fidelity.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cmd_fidelity(args: argparse.Namespace) -> int:
    """`reasonsim fidelity`."""
    from reasonsim.fidelity import SUITE, run_fidelity, speed_text

    result = run_fidelity(Path(args.out), args.quick, Path(args.suite) if args.suite else SUITE,
                          progress=not args.quiet and not args.json)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simulated vs live on {result['device']} (error vs the mean of "
                  "the live runs; ok: within tolerance or the live-vs-live spread)")
    for col in ("workload", "metric", "sim", "live", "error", "at live speed",
                "sampled at live speed", "spread", "ok", "in band"):
        table.add_column(col, justify="left" if col in ("workload", "metric") else "right")
    for r in result["workloads"]:
        for m, v in r["metrics"].items():
            table.add_row(r["workload"], m, f"{v['sim']:.4g}",
                          " ".join(f"{x:.4g}" for x in v["live"]), f"{v['error']:+.1%}",
                          f"{v['error_at_live_speed']:+.1%}" if "error_at_live_speed" in v
                          else "", f"{v['error_sampled_at_live_speed']:+.1%}"
                          if "error_sampled_at_live_speed" in v else "", f"{v['spread']:.1%}", "yes" if v["ok"] else "[red]NO[/]",
                          f"{sum(v['in_band'])}/{len(v['in_band'])}" if "in_band" in v else "")
        if r.get("step_speed"):
            table.add_row(r["workload"], "steps/predicted", "",
                          " ".join(speed_text(v) for v in r["step_speed"]), "", "", "", "", "",
                          "")
        if "decision_agreement" in r:
            table.add_row(r["workload"], "decision agreement", "", "",
                          f"{r['decision_agreement']:.3f}", "", "",
                          f"live {r['live_agreement']:.3f}",
                          "yes" if r["agreement_ok"] else "[red]NO[/]", "")
    Console().print(table)
    c = result["band_coverage"]
    print(f"live values inside the step-time noise band ({c['band']}, {c['seeds']} draws): "
          f"{c['inside']} of {c['of']}")
    print(f"report: {Path(args.out) / 'report.md'} ({result['wall_s']} s)")
    return 0

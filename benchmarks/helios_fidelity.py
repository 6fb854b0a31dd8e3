"""HELIOS sim vs live over several rounds of (re-trace here, replay live): how far the simulated
figures sit from live ones, and how much that moves from round to round on this machine.

    python benchmarks/helios_fidelity.py [--config examples/helios-testbed.yaml] [--rounds 5]
                                         [--repeats 3] [--policies NAME,...]
                                         [--prompts-per-phase N] [--json]

Each round is one fresh `reasonsim helios replay CONFIG --retrace DIR --repeats N --json`: every
model's exits traced again on this machine, then each policy simulated and run live N times. Per
policy and metric it prints the median over rounds of the error (sim vs the round's live median),
the range of that error over rounds, and the median live-vs-live spread within a round. The
error's range over rounds is what this machine's drift between tracing and serving does to one
comparison; the within-round spread is the noise of back-to-back live runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METRICS = ("throughput_tok_s", "tpot_p50_s", "ttft_p50_s")


def one_round(config: str, repeats: int, policies: str | None,
              prompts_per_phase: int | None = None) -> dict:
    """One `helios replay --retrace` in a fresh process; its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reasonsim.cli", "helios", "replay", config, "--retrace",
               str(Path(tmp) / "exits"), "--repeats", str(repeats), "--json"]
        if policies:
            cmd += ["--policies", policies]
        if prompts_per_phase:
            cmd += ["--prompts-per-phase", str(prompts_per_phase)]
        out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def summarise(reports: list[dict]) -> dict:
    """Per policy: decision agreement (worst round) and per metric the error's median and range
    over rounds, the same at each round's live step speed, and the median within-round live
    spread."""
    out = {}
    for name in reports[0]:
        rows = [r[name] for r in reports]
        dec = [r["decisions"] for r in rows]
        out[name] = {"prompts": min(d["prompts"] for d in dec),
                     "events_equal": all(d["events_equal"] for d in dec),
                     "same_exit_layers": min(d["same_exit_layers"] for d in dec)}
        for m in METRICS:
            errors = [r["metrics"][m]["error"] for r in rows]
            spreads = [r["metrics"][m]["live_spread"] for r in rows]
            # the error at each round's live step speed (`validation.helios.compare`)
            at_speed = [r["metrics"][m]["error_at_live_speed"] for r in rows]
            out[name][m] = {"error_median": statistics.median(errors), "error_min": min(errors),
                            "error_max": max(errors), "live_spread": statistics.median(spreads),
                            "at_live_speed_median": statistics.median(at_speed),
                            "at_live_speed_min": min(at_speed),
                            "at_live_speed_max": max(at_speed)}
    return out


def main() -> int:
    """Run the rounds and print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/helios-testbed.yaml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policies")
    ap.add_argument("--prompts-per-phase", type=int, help="a longer stream than the trace's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reports = []
    for k in range(args.rounds):
        reports.append(one_round(args.config, args.repeats, args.policies,
                                 args.prompts_per_phase))
        print(f"round {k + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    result = {"rounds": args.rounds, "repeats": args.repeats,
              "prompts_per_phase": args.prompts_per_phase, "policies": summarise(reports),
              "per_round": reports}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.config}: {args.rounds} rounds of re-trace + {args.repeats} live runs per "
          "policy; error = sim vs the round's live median: median over rounds [min, max] "
          "(median live-vs-live spread in a round); then at each round's live step speed")
    print(f"{'policy':30s} {'agreement':>10s}  " + "  ".join(f"{m:>32s}" for m in METRICS))
    for name, p in result["policies"].items():
        agree = f"{p['prompts']:.0%}/{p['same_exit_layers']:.0%}"
        cells = [f"{p[m]['error_median']:+6.1%} [{p[m]['error_min']:+.1%}, "
                 f"{p[m]['error_max']:+.1%}] ({p[m]['live_spread']:.0%})" for m in METRICS]
        print(f"{name:30s} {agree:>10s}  " + "  ".join(f"{c:>32s}" for c in cells))
        cells = [f"{p[m]['at_live_speed_median']:+6.1%} [{p[m]['at_live_speed_min']:+.1%}, "
                 f"{p[m]['at_live_speed_max']:+.1%}]" for m in METRICS]
        print(f"{'  at live speed':30s} {'':>10s}  " + "  ".join(f"{c:>32s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

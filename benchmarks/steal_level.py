"""Judge fidelity runs at the speed level the host's CPU steal gives each live run, offline.

    python benchmarks/steal_level.py OUT RUN1 RUN2 ... [--stat-log LOG] [--estimates ...]

A live run's steps run at the calibration's price times the machine's level; the host's steal
(`engines.host_cpu`: ticks the hypervisor gave to other guests) stalls steps for seconds, and
the time-weighted level exceeded the median by about twice the stolen share over 22 live runs
([record](../docs/measurements/2026-12-03-heldout-reference-and-steal.md)). Per live run,
with s its stolen share while serving and c the calibration traffic's (0 where unmeasured):

- `steal`: level (1 + 2 s) / (1 + 2 c): the calibration's level moved by the steal the OS
  counted, nothing read from the live steps (a state a simulation could be given)
- `live`: the live run's median decode level (`at live speed` as the run judged it)
- `live_steal`: that median times (1 + 2 s) / (1 + 2 c)

Each workload is simulated again at each level (the band's median, as judged), errors averaged
over its live runs and judged against tolerance or the run's live-vs-live spread
(`reference_level.rejudge_at`). Shares come from the traces' `host_cpu` tables; runs traced
before those take them from a `host_steal.py sample` LOG where it covers them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from engines.host_cpu import stall_share, trace_stolen_share  # noqa: E402
from host_steal import read_samples, served_steal  # noqa: E402
from reference_level import rejudge_at, summary  # noqa: E402

ESTIMATES = ("steal", "live", "live_steal")


def trace_steal(trace: Path, samples: tuple | None) -> float | None:
    """A trace's stolen share: its own samples, else the log's over its span; None without."""
    own = trace_stolen_share(trace)
    if own is not None or samples is None:
        return own
    return served_steal(samples, trace)


def run_steals(run: Path, samples: tuple | None) -> tuple[float | None, dict]:
    """(calibration traffic's mean stolen share, {(workload, live index): share}) of RUN."""
    traffic = [s for t in sorted(run.glob("calibration_traffic_*"))
               if (s := trace_steal(t, samples)) is not None]
    lives = {}
    for w in json.loads((run / "fidelity.json").read_text())["workloads"]:
        for i, live in enumerate(sorted((run / w["workload"]).glob("live[0-9]*"))):
            lives[(w["workload"], i)] = trace_steal(live, samples)
    return (float(np.mean(traffic)) if traffic else None), lives


def steal_factors(run: Path, estimate: str, samples: tuple | None
                  ) -> dict[tuple[str, int], float] | None:
    """(workload, live index) -> the level `estimate` gives that live run; None where a live
    run lacks what it needs (a stolen share, a decode level)."""
    cal, lives = run_steals(run, samples)
    speed = {(w["workload"], i): s.get("decode")
             for w in json.loads((run / "fidelity.json").read_text())["workloads"]
             for i, s in enumerate(w.get("step_speed", []))}
    out = {}
    for key, s in lives.items():
        median = speed.get(key)
        if (estimate != "live" and s is None) or (estimate != "steal" and median is None):
            return None
        moved = (1 + stall_share(s)) / (1 + stall_share(cal))
        out[key] = {"steal": moved, "live": median,
                    "live_steal": (median or 0.0) * moved}[estimate]
    return out


def main(argv: list[str] | None = None) -> int:
    """Rejudge each run at each estimate's levels and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="where the new simulations go")
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--stat-log", type=Path, help="a host_steal.py sample LOG")
    ap.add_argument("--estimates", default=",".join(ESTIMATES))
    args = ap.parse_args(argv)
    chosen = args.estimates.split(",")
    if not set(chosen) <= set(ESTIMATES):
        ap.error(f"--estimates: choose from {', '.join(ESTIMATES)}")
    samples = read_samples(args.stat_log) if args.stat_log else None
    print("| run | estimate | steal (calibration; live runs) | ok (latency metrics) | "
          "median abs P50 | mean P50 |")
    print("|---|---|---|---|---|---|")
    result = {}
    for run in args.runs:
        cal, lives = run_steals(run, samples)
        shares = [s for s in lives.values() if s is not None]
        steal = (f"{'-' if cal is None else f'{cal:.1%}'}; "
                 + (f"{min(shares):.1%}-{max(shares):.1%}" if shares else "-"))
        for k, e in enumerate(chosen):
            factors = steal_factors(run, e, samples)
            if factors is None:
                print(f"| {run.name} | at {e} level | {steal} | unmeasured | | |")
                continue
            rows = rejudge_at(run, args.out / run.name / e, factors)
            result[f"{run.name}:{e}"] = rows
            if k == 0:
                print(f"| {run.name} | as judged | {steal} | "
                      f"{summary(rows, 'judged', 'ok_judged')} |")
            print(f"| {run.name} | at {e} level | {steal} | {summary(rows, 'error', 'ok')} |",
                  flush=True)
    (args.out / "steal_level.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The decode steps just after a prefill, against a calibration: what the serving model's echo
(`sim.step_time.serving_latency`, ECHO_WEIGHTS) is for.

    reasonsim fidelity -o RUN
    python benchmarks/decode_after_prefill.py RUN [--calibration CAL] [--traces DIR,...] [--json]

For the first live run of each request workload of a fidelity run (or the given trace
directories): each decode-only step's measured minus predicted time (ms, the calibration at its
mean fit, the echo included where it has one), less its trace's median over steps 20 or more
after a prefill (the trace's own level), by steps since the last prefill step (1-8) and by that
prefill's tokens; medians over the traces' steps. Run it with a calibration fitted without the
echo (one from before it, or `reasonsim calibrate` on an older checkout) to see the echo
itself, with the run's own to see what is left of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402

REQUEST_WORKLOADS = ("poisson", "bursty", "short_prompts", "long_prompts", "mixed_outputs",
                     "near_saturation", "prefix_sharing")
PREFILL_BANDS = [0, 64, 256, 768, 1600, 4096]
FAR = 20
"""steps after a prefill from which a step counts as the trace's own level"""


def after_prefill(calibration: Path, trace: Path) -> pd.DataFrame:
    """The trace's decode-only steps with `since` (steps since the last prefill step), that
    prefill's tokens and `extra_ms` (measured - predicted, less the trace's far level)."""
    ratio, s = step_ratios(calibration, trace)
    s = s.assign(pred_ms=s.duration_ms / ratio).sort_values(["run_id", "replica_id", "step_id"])
    pre = s.prefill_tokens.gt(0)
    s["since"] = s.groupby(pre.cumsum().to_numpy()).cumcount()
    s["prefill"] = s.prefill_tokens.where(pre).ffill()
    s = s[~pre & pre.cummax() & s.decode_seqs.gt(0)]
    extra = s.duration_ms - s.pred_ms
    return s.assign(extra_ms=extra - extra[s.since >= FAR].median(), trace=trace.parent.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("--calibration", type=Path, help="default: RUN/calibration.json")
    ap.add_argument("--traces", help="comma-separated trace directories (default: the first "
                    "live run of each request workload)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cal = args.calibration or args.run / "calibration.json"
    traces = [Path(t) for t in args.traces.split(",")] if args.traces else \
        [args.run / w / "live1" for w in REQUEST_WORKLOADS if (args.run / w / "live1").is_dir()]
    s = pd.concat([after_prefill(cal, t) for t in traces])
    s["steps_since"] = s.since.clip(upper=8).astype(str).replace("8", "8+")
    s["prefill_tokens"] = pd.cut(s.prefill, PREFILL_BANDS)
    table = s.pivot_table(index="prefill_tokens", columns="steps_since", values="extra_ms",
                          aggfunc="median", observed=True).round(2)
    counts = s.pivot_table(index="prefill_tokens", columns="steps_since", values="extra_ms",
                           aggfunc="size", observed=True)
    if args.json:
        print(json.dumps({"extra_ms": json.loads(table.to_json(orient="split")),
                          "steps": json.loads(counts.to_json(orient="split"))}))
        return
    pd.set_option("display.width", 200)
    print(f"decode-only steps, measured - predicted ms less each trace's level ({cal}), median:")
    print(table)
    print("\nsteps:")
    print(counts)


if __name__ == "__main__":
    main()

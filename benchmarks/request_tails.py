"""Which requests make a workload's latency tail, and how fast the machine ran while they did.

    reasonsim fidelity -o RUN
    python benchmarks/request_tails.py RUN WORKLOAD [--metric tpot_s|ttft_s|e2e_s] [--top 8]
        [--quiet-level 1.2] [--at-live-speed] [--json]

For each live run of a request workload in a fidelity run (`RUN/WORKLOAD/live*`) beside the
simulation (`RUN/WORKLOAD/sim`, the same requests): each request's metric live and simulated,
and the machine's level over the request's span (TTFT: arrival to first token; TPOT: first
token to finish; e2e: arrival to finish), the median of the live steps' measured / predicted
time (`sim.step_time.live_speed.step_ratios`, the run's calibration) over the steps that start
in the span, over that median for the whole live run. A tail the simulation misses where the
level is high is the machine's spell, not the model's; the P90 over requests whose level is at
most `--quiet-level` says what the tail is without them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.metrics import latency_columns  # noqa: E402
from sim.step_time.live_speed import step_ratios  # noqa: E402
from traces import read_table  # noqa: E402

SPANS = {"ttft_s": ("arrival_s", "first_token_s"), "tpot_s": ("first_token_s", "finish_s"),
         "e2e_s": ("arrival_s", "finish_s")}


def _by_request(run_dir: Path) -> pd.DataFrame:
    """A run's requests by request id, with their latency columns."""
    r = read_table(run_dir, "requests").to_pandas().set_index("request_id").sort_index()
    return r.join(latency_columns(r))


def span_levels(requests: pd.DataFrame, ratio: np.ndarray, steps: pd.DataFrame,
                metric: str) -> np.ndarray:
    """Per request, the median step ratio over the steps starting in its span, over the run's
    median (NaN where no step starts in it)."""
    lo, hi = SPANS[metric]
    start = steps.start_s.to_numpy()
    order = np.argsort(start)
    start, ratio = start[order], ratio[order]
    a = np.searchsorted(start, requests[lo].to_numpy(), side="left")
    b = np.searchsorted(start, requests[hi].to_numpy(), side="right")
    own = np.median(ratio)
    return np.array([np.median(ratio[i:j]) / own if j > i else np.nan for i, j in zip(a, b)])


def tails(run: Path, workload: str, metric: str, top: int, quiet_level: float,
          at_live_speed: bool = False) -> list[dict]:
    """One row per live run: its tail requests and the metric's P90 live, simulated and over
    the requests the machine ran at most `quiet_level` slow for. With `at_live_speed`, each
    live run beside the simulation at its own step speed (`sim_at_live<i>`)."""
    rows = []
    sim = None if at_live_speed else _by_request(run / workload / "sim")
    for live_dir in sorted((run / workload).glob("live[0-9]*")):
        if at_live_speed:
            sim = _by_request(run / workload / f"sim_at_{live_dir.name}" / "sim")
        live = _by_request(live_dir)
        ratio, steps = step_ratios(run / "calibration.json", live_dir)
        level = pd.Series(span_levels(live, ratio, steps, metric), index=live.index)
        t = pd.DataFrame({"live_ms": 1e3 * live[metric], "sim_ms": 1e3 * sim[metric],
                          "level": level}).dropna(subset=["live_ms"])
        quiet = t[t.level <= quiet_level]
        head = t.sort_values("live_ms", ascending=False).head(top)
        rows.append({"live": live_dir.name, "requests": int(len(t)),
                     "p90_live_ms": float(t.live_ms.quantile(0.9)),
                     "p90_sim_ms": float(t.sim_ms.quantile(0.9)),
                     "slow_requests": int((t.level > quiet_level).sum()),
                     "p90_live_quiet_ms": float(quiet.live_ms.quantile(0.9)),
                     "p90_sim_quiet_ms": float(quiet.sim_ms.quantile(0.9)),
                     "tail": [{"request": str(k), **{c: round(float(v), 3) for c, v in r.items()}}
                              for k, r in head.iterrows()]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("workload", help="a request workload of that run")
    ap.add_argument("--metric", choices=sorted(SPANS), default="tpot_s")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--quiet-level", type=float, default=1.2)
    ap.add_argument("--at-live-speed", action="store_true",
                    help="each live run beside the simulation at its own step speed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = tails(args.run, args.workload, args.metric, args.top, args.quiet_level,
                 args.at_live_speed)
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['live']}: P90 live {r['p90_live_ms']:.3f} ms, sim {r['p90_sim_ms']:.3f}; "
              f"{r['slow_requests']} of {r['requests']} requests ran above "
              f"{args.quiet_level}x; without them: live {r['p90_live_quiet_ms']:.3f}, "
              f"sim {r['p90_sim_quiet_ms']:.3f}")
        for t in r["tail"]:
            print(f"  {t['request']}: live {t['live_ms']:.3f} sim {t['sim_ms']:.3f} "
                  f"level {t['level']:.2f}")


if __name__ == "__main__":
    main()

"""Several `reasonsim fidelity` runs against the fidelity goal: every metric within tolerance or
the live-vs-live spread in at least four of five consecutive runs, and each run's median absolute
e2e/program P50 error at most 3%.

    for k in 1 2 3 4 5; do reasonsim fidelity -o runs/$k; done
    python benchmarks/fidelity_streak.py runs/1 runs/2 runs/3 runs/4 runs/5 [--json]

Reads each run's `fidelity.json` (in the order given: the order they ran) and prints a row per
run (metrics ok as judged and at the live runs' decode speed, the median absolute P50 error of
each, the live decode levels, whether the run passes), the metrics that missed in more than one
run, and whether some five consecutive runs hold four passing ones. A run passes when every
metric is ok as judged and its median absolute P50 error is at most `P50_GOAL`; the verdict at
live speed is shown beside it, not counted (it reads each live run's own speed, so it is not a
prediction).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from validation.fidelity_judging import table_summary  # noqa: E402

P50_GOAL = 0.03
"""the median absolute e2e/program P50 error a passing run stays within"""
WINDOW, NEEDED = 5, 4
"""consecutive runs looked at, and how many of them must pass"""


def run_row(result: dict) -> dict:
    """One run against the goal: its summary counts, the metrics that missed, whether it passes;
    the same at probe speed (a metric without a probe-speed verdict counts as judged)."""
    s = result.get("summary") or table_summary(result)
    metrics = [(r["workload"], m, v) for r in result["workloads"] for m, v in r["metrics"].items()]
    missed = [f"{w} {m}" for w, m, v in metrics if not v["ok"]]
    missed_probe = [f"{w} {m}" for w, m, v in metrics if not v.get("ok_at_probe_speed", v["ok"])]
    p50, p50_probe = s["p50_median_abs"], s.get("p50_median_abs_at_probe_speed")
    return {"metrics": s["metrics"], "ok": s["ok"], "at_live_speed": s["at_live_speed"],
            "ok_at_live_speed": s["ok_at_live_speed"], "p50_median_abs": p50,
            "p50_median_abs_at_live_speed": s["p50_median_abs_at_live_speed"],
            "ok_at_probe_speed": s["metrics"] - len(missed_probe),
            "p50_median_abs_at_probe_speed": p50_probe,
            "decode_levels": s["decode_levels"], "missed": missed, "missed_at_probe": missed_probe,
            "passes": not missed and p50 is not None and p50 <= P50_GOAL,
            "passes_at_probe": not missed_probe and p50_probe is not None
            and p50_probe <= P50_GOAL}


def streak(results: list[dict]) -> dict:
    """The rows of runs in the order they ran, the metrics missed in more than one, and whether
    some `WINDOW` consecutive runs hold `NEEDED` passing ones (as judged, and at probe speed)."""
    rows = [run_row(r) for r in results]

    def windows(key: str) -> list[int]:
        passing = [r[key] for r in rows]
        return [sum(passing[i:i + WINDOW]) for i in range(max(len(rows) - WINDOW + 1, 0))]
    counts = Counter(m for r in rows for m in r["missed"])
    judged, at_probe = windows("passes"), windows("passes_at_probe")
    return {"runs": rows, "passing": sum(r["passes"] for r in rows),
            "best_window": max(judged) if judged else None,
            "goal_met": any(w >= NEEDED for w in judged),
            "passing_at_probe": sum(r["passes_at_probe"] for r in rows),
            "goal_met_at_probe": any(w >= NEEDED for w in at_probe),
            "missed_repeatedly": {m: n for m, n in counts.most_common() if n > 1}}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render(names: list[str], out: dict) -> str:
    """The streak as a text table and a verdict."""
    lines = [f"{'run':<28} {'ok':>7} {'at live':>8} {'at probe':>8} {'|P50|':>7} {'at live':>8} "
             f"{'at probe':>8} {'decode levels':>14}  passes (at probe)"]
    def yes(x: bool) -> str:
        return "yes" if x else "no"
    for name, r in zip(names, out["runs"]):
        lv = r["decode_levels"]
        levels = "-" if lv is None else f"{lv[0]:.2f}-{lv[1]:.2f}"
        lines.append(f"{name[-28:]:<28} {r['ok']:>3}/{r['metrics']:<3} "
                     f"{r['ok_at_live_speed']:>3}/{r['at_live_speed']:<4} "
                     f"{r['ok_at_probe_speed']:>4}/{r['metrics']:<3} "
                     f"{_pct(r['p50_median_abs']):>7} {_pct(r['p50_median_abs_at_live_speed']):>8} "
                     f"{_pct(r['p50_median_abs_at_probe_speed']):>8} {levels:>14}  "
                     f"{yes(r['passes'])} ({yes(r['passes_at_probe'])})")
    if out["missed_repeatedly"]:
        lines.append("missed in more than one run: " + ", ".join(
            f"{m} ({n})" for m, n in out["missed_repeatedly"].items()))
    window = ("fewer runs than a window" if out["best_window"] is None else
              f"the best {WINDOW} consecutive runs hold {out['best_window']} passing")
    lines.append(f"{out['passing']} of {len(out['runs'])} runs pass (every metric ok, median "
                 f"|P50| <= {P50_GOAL:.0%}); {window}; goal ({NEEDED} of {WINDOW}): "
                 f"{'met' if out['goal_met'] else 'not met'}; at probe speed: "
                 f"{out['passing_at_probe']} pass, goal "
                 f"{'met' if out['goal_met_at_probe'] else 'not met'}")
    return "\n".join(lines)


def main() -> None:
    """Read the runs, print the streak."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="`reasonsim fidelity -o` directories, "
                    "in the order they ran")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    missing = [str(r) for r in args.runs if not (r / "fidelity.json").is_file()]
    if missing:
        sys.exit(f"no fidelity.json in {', '.join(missing)} (a finished `reasonsim fidelity "
                 "-o` run writes one; `benchmarks/fidelity_offline.py` judges a stopped one)")
    out = streak([json.loads((r / "fidelity.json").read_text()) for r in args.runs])
    print(json.dumps(out, indent=1) if args.json else render([str(r) for r in args.runs], out))


if __name__ == "__main__":
    main()

"""Ways of leveling a fidelity run's simulations to its speed checks, judged side by side.

    reasonsim fidelity --speed-checks -o RUN          # calibration traffic after each pass
    python benchmarks/traffic_speed_variants.py RUN [RUN...] [--json]

For every run (made with `--speed-checks`), every workload is simulated again with each live
run's step times scaled to the traffic state nearest it or interpolated between the two around
it, as a level over the calibration traffic's own (`relative`) or as the traffic's level
against the calibration (`absolute`): `validation.speed_checks.live_factor`; or, needing no
check, at the mean decode level of the live runs just before and after it (`neighbours`: other
workloads' runs, the judged one unseen; `neighbours-2`, `-3`: the two or three nearest a
side; `neighbours-deshaped`: each neighbour's level over its workload's mean, times the suite's
median level). Each variant's judged estimate (the noise draws' median, averaged over the live
runs) is judged as the run's table judges (tolerance or live-vs-live spread) beside the run's
own verdict. Prints one line
per run and variant: metrics within tolerance or spread, the median absolute e2e/program P50
error, and the traffic levels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from validation.fidelity_judging import P50_METRICS  # noqa: E402
from validation.judge import error_within  # noqa: E402
from validation.speed_checks import (at_traffic_speed, medians_at,  # noqa: E402
                                     neighbour_factors, traffic_levels)

VARIANTS = {"nearest-relative": ("nearest", True), "nearest-absolute": ("nearest", False),
            "interpolated-relative": ("interpolated", True),
            "interpolated-absolute": ("interpolated", False),
            "neighbours": ("neighbours", 1), "neighbours-2": ("neighbours", 2),
            "neighbours-3": ("neighbours", 3), "neighbours-deshaped": ("deshaped", 1)}


def deshaped_factors(rows: list[dict]) -> dict[tuple[str, int], float]:
    """`neighbour_factors` with each neighbour's level taken over its workload's mean level
    (the pass-to-pass move, free of how the calibration prices that workload's shapes), times
    the median level of every other workload's live runs (the suite's drift)."""
    shares = []
    for w in rows:
        lv = [(s or {}).get("decode") for s in w["step_speed"]]
        mean = np.mean([x for x in lv if x]) if any(lv) else None
        shares.append({**w, "step_speed": [{"decode": x / mean if x and mean else None}
                                           for x in lv]})
    moved = neighbour_factors(shares, [])
    out = {}
    for w in rows:
        others = [s["decode"] for o in rows if o["workload"] != w["workload"]
                  for s in o["step_speed"] if s and s.get("decode")]
        drift = float(np.median(others)) if others else 1.0
        for i in range(len(w["live_started_s"])):
            out[(w["workload"], i)] = drift * moved[(w["workload"], i)]
    return out


def variant_metrics(run: Path, levels: list[dict], work: Path, how: str,
                    option: bool | int) -> list[dict]:
    """Every judged metric of RUN at the variant's traffic speed (`levels`: the run's
    `traffic_levels`): (workload, metric, error, ok, error as judged, ok as judged)."""
    result = json.loads((run / "fidelity.json").read_text())
    # `option`: a neighbours variant's runs a side, a traffic variant's `relative`
    near = neighbour_factors(result["workloads"], levels, option) if how == "neighbours" else \
        deshaped_factors(result["workloads"]) if how == "deshaped" else {}
    rows = []
    for w in result["workloads"]:
        name = w["workload"]
        d = yaml.safe_load((run / name / "config.yaml").read_text())
        base = REPO / "examples" if w["kind"] == "programs" else run / name
        lives = sorted((run / name).glob("live[0-9]*"))
        if how in ("neighbours", "deshaped"):
            got = {"median": medians_at(d, [near[(name, i)] for i in range(len(lives))],
                                        work / name, base)}
        else:
            got = at_traffic_speed(d, lives, levels, work / name, base, how, option)
        for m, v in w["metrics"].items():
            if got is None or m not in got["median"] or "band" not in v:
                continue
            err, ok = error_within(v, got["median"][m])
            rows.append({"workload": name, "metric": m, "error": err, "ok": ok,
                         "judged_error": v["error"], "judged_ok": v["ok"]})
    return rows


def summary(rows: list[dict], key: str, ok: str) -> tuple[int, int, float | None]:
    """(metrics ok, metrics, median absolute P50 error) of rows under `key`/`ok`."""
    p50 = [abs(r[key]) for r in rows if r["metric"] in P50_METRICS]
    return (sum(r[ok] for r in rows), len(rows), float(np.median(p50)) if p50 else None)


def main() -> None:
    """Parse arguments, judge every run under every variant, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    chosen = [v.strip() for v in args.variants.split(",")]
    if set(chosen) - set(VARIANTS):
        ap.error(f"--variants: {sorted(set(chosen) - set(VARIANTS))} unknown")
    out = []
    for run in args.runs:
        levels = traffic_levels(run, json.loads((run / "fidelity.json").read_text())
                                ["calibration"])
        for name in chosen:
            how, option = VARIANTS[name]
            with tempfile.TemporaryDirectory() as work:
                rows = variant_metrics(run, levels, Path(work), how, option)
            out.append({"run": str(run), "variant": name, "rows": rows,
                        "levels": [round(s["decode"], 3) for s in levels],
                        "at": summary(rows, "error", "ok"),
                        "judged": summary(rows, "judged_error", "judged_ok")})
    if args.json:
        print(json.dumps(out))
        return
    for o in out:
        (ok, n, p50), (jok, _, jp50) = o["at"], o["judged"]
        print(f"{o['run']}  {o['variant']:24s} {ok}/{n} (as judged {jok}/{n})  P50 median "
              f"abs {pct(p50)} (as judged {pct(jp50)})  levels {o['levels']}")


def pct(x: float | None) -> str:
    """A share as a percent, or '-'."""
    return "-" if x is None else f"{x:.1%}"


if __name__ == "__main__":
    main()

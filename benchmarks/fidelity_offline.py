"""Judge a `reasonsim fidelity` run's live replays again against another calibration, offline.

    reasonsim fidelity -o RUN                                  # traces, calibrates, replays
    python benchmarks/fidelity_offline.py RUN OUT [--calibration CAL.json] [--json]
    python benchmarks/fidelity_offline.py RUN OUT --refit [--without FEATURE[,FEATURE]]
                                          [--traces-without NAME[,NAME]] [--json]

Every workload of RUN is simulated again (mean run, noise band, reruns at each live run's decode
speed) with CAL (default: RUN's own calibration, which reproduces RUN's table) and judged against
the same live runs, so two step-time models compare on identical live data in seconds instead
of a new twelve-minute suite on a machine whose speed has moved meanwhile. `--refit`: CAL is
RUN's calibration refitted on the same traces by this checkout's `serving` model (a candidate
term judged on old runs); `--without` (implies `--refit`): with those serving-model terms at 0
(an ablation: what a term buys, `sim.step_time.serving_features.FEATURES`); `--traces-without`
(implies `--refit`): fitted without the calibration traces of those names (e.g.
`calibration_traffic_long`: what a calibration traffic buys). Prints the report table and one
summary line (or the result as JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from validation.fidelity import BAND_SEEDS, judge_requests  # noqa: E402
from validation.fidelity_programs import judge_programs  # noqa: E402
from validation.fidelity_judging import table_summary  # noqa: E402
from validation.fidelity_report import report  # noqa: E402
from validation.speed_checks import (NEIGHBOURS, judge_at_neighbours, medians_at,  # noqa: E402
                                     traffic_levels)


def recorded(run: Path) -> dict:
    """RUN's fidelity.json, or, for a run stopped after its live runs and before its table,
    what its directory holds: each workload with its config and live runs, in suite order."""
    if (run / "fidelity.json").is_file():
        return json.loads((run / "fidelity.json").read_text())
    from sim.step_time.calibration import load_calibration

    cal = load_calibration(run / "calibration.json")
    names = [p.parent.name for p in sorted(run.glob("*/config.yaml"),
                                           key=lambda p: p.stat().st_mtime)
             if list(p.parent.glob("live[0-9]*"))]
    kinds = ["programs" if "programs" in yaml.safe_load((run / n / "config.yaml").read_text())
             ["workload"] else "requests" for n in names]
    return {"quick": False, "calibration": str(run / "calibration.json"), "engine": "vllm",
            "device": cal.provenance["device"], "skipped": {},
            "calibration_heldout": {k: v for k, v in cal.heldout.items()
                                    if k in ("mape", "p90_ape", "rows")},
            "workloads": [{"workload": n, "kind": k} for n, k in zip(names, kinds)],
            "wall_s": None}


def rejudge(run: Path, out: Path, calibration: Path) -> dict:
    """RUN's result with every simulation redone under `calibration` (written under out)."""
    old = recorded(run)
    levels = traffic_levels(run, calibration)
    rows, configs = [], {}
    for w in old["workloads"]:
        name = w["workload"]
        d = yaml.safe_load((run / name / "config.yaml").read_text())
        d["cluster"]["replicas"][0]["calibration"] = str(calibration)
        configs[name] = d, w["kind"]
        lives = sorted((run / name).glob("live[0-9]*"))
        (out / name).mkdir(parents=True, exist_ok=True)
        judge = judge_programs if w["kind"] == "programs" else judge_requests
        # what the live runs measured of the machine (when, the host's steal) stays theirs
        rows.append({**judge(name, d, out / name, lives, levels),
                     **{k: w[k] for k in ("live_started_s", "live_steal") if k in w}})
    if all("live_started_s" in r for r in rows):  # at the speed of each run's neighbours
        def medians(r: dict, factors: list[float]) -> dict:
            d, kind = configs[r["workload"]]
            base = REPO / "examples" if kind == "programs" else out / r["workload"]
            return medians_at(d, factors, out / r["workload"], base, NEIGHBOURS)

        judge_at_neighbours(rows, levels, medians)
    inside = [x for r in rows for m in r["metrics"].values() for x in m.get("in_band", [])]
    return {**old, "calibration": str(calibration), "workloads": rows,
            "band_coverage": {"inside": sum(inside), "of": len(inside), "band": "5-95%",
                              "seeds": BAND_SEEDS},
            "ok": all(m["ok"] for r in rows for m in r["metrics"].values())}


def main() -> None:
    """Parse arguments, rejudge, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("out", type=Path, help="where the new simulations go")
    ap.add_argument("--calibration", type=Path, help="default: RUN/calibration.json")
    ap.add_argument("--without", help="refit RUN's calibration without these serving-model "
                    "features (comma-separated)")
    ap.add_argument("--traces-without", help="refit RUN's calibration without the traces of "
                    "these directory names (comma-separated)")
    ap.add_argument("--refit", action="store_true",
                    help="refit RUN's calibration on its traces with this checkout's model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cal = (args.calibration or args.run / "calibration.json").resolve()
    if args.without or args.refit or args.traces_without:
        if args.calibration:
            ap.error("--refit and --without refit RUN's own calibration: leave out "
                     "--calibration")
        from sim.step_time.calibration import calibrate

        traces = json.loads(cal.read_text())["provenance"]["traces"]
        left_out = set(args.traces_without.split(",")) if args.traces_without else set()
        if left_out - {Path(t).name for t in traces}:
            ap.error(f"--traces-without: {sorted(left_out - {Path(t).name for t in traces})} "
                     f"are not traces of RUN's calibration ({[Path(t).name for t in traces]})")
        traces = [t for t in traces if Path(t).name not in left_out]
        without = tuple(args.without.split(",")) if args.without else ()
        fitted = calibrate(traces, model="serving", without=without)
        args.out.mkdir(parents=True, exist_ok=True)
        cal = (args.out / "calibration.json").resolve()
        cal.write_text(json.dumps(fitted.to_json(), indent=1) + "\n")
    result = rejudge(args.run, args.out, cal)
    result["summary"] = table_summary(result)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(report(result))
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()

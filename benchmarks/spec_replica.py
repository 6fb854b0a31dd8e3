"""Simulated vs live in-engine speculative decoding (vLLM draft_model), across K and acceptance.

For each K and prompt text (random token ids: low acceptance; the testbed's questions: high),
the workload of `examples/spec-k4.yaml` is replayed live three times on a speculative engine
(runs a, b and c), then simulated with a calibration fitted on this machine's spec steps (`--calibration-trace`,
default: traced here first) and acceptance from (1) live run a's own `spec_steps` (the step model
alone: acceptance is right by construction) and (2) the spec trace (the testbed's questions:
acceptance measured on other text). Each error is the median of the simulation against runs b
and c; beside it, run b against run c (live-vs-live).

    python benchmarks/spec_replica.py [--k 2,4] [--texts random,testbed] [-o DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
METRICS = ("ttft_s.p50", "ttft_s.p90", "tpot_s.p50", "tpot_s.p90", "e2e_s.p50", "e2e_s.p90")


def cli(*args: str) -> str:
    """Run `reasonsim`; its stdout."""
    proc = subprocess.run([sys.executable, "-m", "reasonsim.cli", *args], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reasonsim {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def errors(sim_dir: Path, live_dir: Path) -> dict:
    """Relative errors of sim_dir against live_dir (validate's)."""
    out = json.loads(cli("validate", str(sim_dir), str(live_dir), "--json",
                         "--allow-device-mismatch", "-o", str(sim_dir / "validate")))
    return {m: out["metrics"][m]["rel_err"] for m in METRICS}


def acceptance(run_dir: Path) -> float:
    """Mean tokens a verify step yielded in a run (1 + accepted)."""
    from traces.store import read_table

    s = read_table(run_dir, "spec_steps").to_pandas()
    return 1.0 + float(s.accepted_tokens.mean())


def main() -> None:
    """Replay, simulate and compare each (K, text) cell; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="2,4")
    ap.add_argument("--texts", default="random,testbed")
    ap.add_argument("--calibration-trace", help="spec trace of this machine (default: trace one)")
    ap.add_argument("-o", "--out", default="reports/spec-replica")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = Path(args.calibration_trace) if args.calibration_trace else out / "spec-trace"
    if not args.calibration_trace and not grid.exists():
        cli("trace", "spec", "-o", str(grid), "--temperatures", "0", "-q")
    base = yaml.safe_load((REPO / "examples" / "spec-k4.yaml").read_text())
    rows = []
    for k in (int(x) for x in args.k.split(",")):
        cal = out / f"k{k}.calib.json"
        cli("calibrate", str(grid), "--spec-k", str(k), "-o", str(cal), "--json")
        for text in args.texts.split(","):
            cell = out / f"k{k}-{text}"
            cell.mkdir(exist_ok=True)
            cfg = json.loads(json.dumps(base))
            cfg["workload"]["prompt_text"] = text
            group = cfg["cluster"]["replicas"][0]
            group["calibration"] = str(cal.resolve())
            live = {}
            for run in ("a", "b", "c"):
                group["speculative"] = {"acceptance_trace": str(grid.resolve())}
                (cell / "live.yaml").write_text(yaml.safe_dump(cfg))
                live[run] = cell / f"live-{run}"
                if not live[run].exists():
                    cli("replay", str(cell / "live.yaml"), "-o", str(live[run]), "--json")
            row = {"k": k, "text": text, "live_tokens_per_step": acceptance(live["a"]),
                   "live_vs_live": errors(live["b"], live["c"])}
            for name, source in (("acc_live_a", live["a"]), ("acc_trace", grid)):
                group["speculative"] = {"acceptance_trace": str(Path(source).resolve())}
                path = cell / f"sim-{name}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                sim_dir = cell / f"sim-{name}"
                if not sim_dir.exists():
                    cli("simulate", str(path), "-o", str(sim_dir), "--json")
                b, c = errors(sim_dir, live["b"]), errors(sim_dir, live["c"])
                # the median of two: their mean
                row[name] = {m: (b[m] + c[m]) / 2 for m in METRICS}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "spec_replica.json").write_text(json.dumps(rows, indent=1))
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulated vs live (runs b, c), in-engine speculative decoding")
    for col in ("K", "prompts", "live tok/step", "compared", *METRICS):
        table.add_column(col)
    for r in rows:
        for name in ("acc_live_a", "acc_trace", "live_vs_live"):
            table.add_row(str(r["k"]), r["text"], f"{r['live_tokens_per_step']:.2f}", name,
                          *(f"{r[name][m] * 100:+.1f}%" for m in METRICS))
    Console().print(table)


if __name__ == "__main__":
    main()

"""The GPU loop's table (`scripts/gpu_loop.sh`): per workload and metric, the simulated figure,
both live runs, each run's error, and the live-vs-live spread; the engine against the ceilings.

    python benchmarks/loop_table.py OUT_DIR [--json]

Reads OUT_DIR/validate-WORKLOAD-{1,2}.log (`reasonsim validate --json`),
OUT_DIR/dynasor-{1,2}.log (`reasonsim dynasor replay --json`) and ceilings.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

METRICS = ("e2e_s.p50", "e2e_s.p90", "ttft_s.p50", "tpot_s.p50", "tpot_s.p90",
           "throughput_tok_s")
WORKLOADS = ("poisson", "bursty", "long")
PROGRAM_METRICS = ("p50", "p90", "mean")
"""program latency statistics of the Dynasor workload"""


def _json(path: Path) -> dict | None:
    """The JSON object a command printed (its log's last line holding one), or None."""
    if not path.exists():
        return None
    for line in reversed(path.read_text().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def rows(out: Path) -> list[dict]:
    """One row per workload and metric where both live runs were validated."""
    table = []
    for w in WORKLOADS:
        runs = [_json(out / f"validate-{w}-{r}.log") for r in (1, 2)]
        if None in runs:
            continue
        for m in METRICS:
            a, b = runs[0]["metrics"].get(m), runs[1]["metrics"].get(m)
            if a is None or b is None:
                continue
            table.append({"workload": w, "metric": m, "sim": a["sim"], "live_1": a["live"],
                          "live_2": b["live"], "err_1": a["rel_err"], "err_2": b["rel_err"],
                          "live_spread": abs(b["live"] / a["live"] - 1),
                          "verdicts": [runs[0]["verdict"]["status"],
                                       runs[1]["verdict"]["status"]]})
    return table + program_rows(out)


def program_rows(out: Path) -> list[dict]:
    """The Dynasor workload's program latency rows, each with both runs' decision agreement."""
    runs = [_json(out / f"dynasor-{r}.log") for r in (1, 2)]
    if None in runs:
        return []
    table = []
    for m in PROGRAM_METRICS:
        a, b = (r["live"]["program_latency_s"][m] for r in runs)
        table.append({"workload": "dynasor", "metric": f"program_latency_s.{m}",
                      "sim": runs[0]["sim"]["program_latency_s"][m], "live_1": a, "live_2": b,
                      "err_1": runs[0]["error"][f"program_latency_{m}"],
                      "err_2": runs[1]["error"][f"program_latency_{m}"],
                      "live_spread": abs(b / a - 1),
                      "decision_agreement": [r["decision_agreement"] for r in runs]})
    return table


def markdown(out: Path, table: list[dict]) -> str:
    """The table and the ceilings, as markdown."""
    c = _json(out / "ceilings.json") or {}
    lines = [f"device: {c.get('device', '?')}; copy {c.get('copy_bytes_per_s', 0) / 1e12:.3f} "
             f"TB/s, matmul {c.get('matmul_flop_per_s', 0) / 1e12:.1f} TFLOP/s "
             f"({c.get('matmul_dtype', '?')}); model {c.get('model', '?')}; decode graphs "
             f"replay their eager tokens: {c.get('graphs_tokens_equal', '?')}", "",
             "| mode | decode batch | step ms | ceiling ms | x ceiling |", "|---|---|---|---|---|"]
    lines += [f"| {d['mode']} | {d['batch']} | {d['step_ms']:.2f} | {d['ceiling_ms']:.2f} | "
              f"{d['x_ceiling']:.2f} |" for d in c.get("decode", [])]
    lines += ["", "| mode | prefill tokens | step ms | tokens/s | of matmul rate |",
              "|---|---|---|---|---|"]
    lines += [f"| {p['mode']} | {p['tokens']} | {p['step_ms']:.2f} | {p['tokens_per_s']:.0f} | "
              f"{p['of_matmul_rate']:.1%} |" for p in c.get("prefill", [])]
    lines += ["", "| workload | metric | sim | live 1 | live 2 | err 1 | err 2 | live spread |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['metric']} | {r['sim']:.4g} | {r['live_1']:.4g} | "
              f"{r['live_2']:.4g} | {r['err_1']:+.1%} | {r['err_2']:+.1%} | "
              f"{r['live_spread']:.1%} |" for r in table]
    agree = next((r["decision_agreement"] for r in table if "decision_agreement" in r), None)
    if agree is not None:
        lines += ["", "dynasor decision agreement, live runs 1 and 2: "
                  + ", ".join(f"{a:.3f}" for a in agree)]
    return "\n".join(lines)


def main() -> None:
    """Read and print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = rows(args.out)
    if args.json:
        print(json.dumps({"ceilings": _json(args.out / "ceilings.json"), "rows": table}))
    else:
        print(markdown(args.out, table))


if __name__ == "__main__":
    main()

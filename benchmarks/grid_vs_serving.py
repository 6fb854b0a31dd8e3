"""A profiled grid's decode steps against a live replay's of the same shape, run in alternation.

    python benchmarks/grid_vs_serving.py OUT [--pairs 3] [--calibration CAL] [--json]

Each pair is `reasonsim trace steps` of one sequence (a 256-token prompt, 128 output tokens, 8
repeats) and then `reasonsim replay` of 16 such requests arriving 0.5 s apart (one decoding at
a time), each in its own process on the engine of CAL (default: the shipped testbed-large CPU
calibration; its engine limits and model). Per pair: the median ms of the single-sequence
decode steps that followed no idle, over contexts of 256-384 tokens, in each; their ratio; and
the same over each trace's own speed probe (the machine's level of that moment, from the probes
each ran: the grid's after its cells, the replay's before and after). Prints a row per pair and
the median ratios: what `profiled_ms` of the serving model prices.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traces.store import read_table  # noqa: E402

CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
PROMPT, OUTPUT, REQUESTS, RATE_PER_S = 256, 128, 16, 2.0


def run_pair(out: Path, k: int, cal: Path) -> tuple[Path, Path]:
    """The k-th grid and replay, one after the other, each a fresh `reasonsim` process."""
    limits = json.loads(cal.read_text())["engine_limits"]
    grid, replay = out / f"grid{k}", out / f"replay{k}"
    cli = [sys.executable, "-m", "reasonsim.cli"]
    run([*cli, "trace", "steps", "-o", str(grid), "--batch-sizes", "1", "--prompt-tokens",
         str(PROMPT), "--output-tokens", str(OUTPUT), "--repeats", "8", "--max-num-seqs",
         str(limits["max_num_seqs"]), "--max-model-len", str(limits["max_model_len"]), "-q"])
    config = out / "replay.yaml"
    config.write_text(yaml.safe_dump({
        "seed": 3, "workload": {"arrival": {"kind": "constant", "rate_per_s": RATE_PER_S},
                                "num_requests": REQUESTS, "prompt_tokens": PROMPT,
                                "output_tokens": OUTPUT},
        "cluster": {"replicas": [{"calibration": str(cal), "count": 1}]}}))
    run([*cli, "replay", str(config), "-o", str(replay), "-q"])
    return grid, replay


def run(cmd: list[str]) -> None:
    """Run a `reasonsim` command quietly; on failure, raise with the tail of its stderr."""
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[3:5])} failed: {done.stderr[-2000:]}")


def steady_ms(trace: Path) -> tuple[float, float]:
    """(median ms of the trace's single-sequence decode steps after no idle over 256-384 tokens
    of context, the median of its speed probes' decode steps)."""
    s = read_table(trace, "steps").to_pandas().sort_values("step_id")
    idle_ms = (s.start_s - (s.start_s + s.duration_ms / 1e3).shift(1)).fillna(0.0) * 1e3
    keep = (s.prefill_tokens.eq(0) & s.decode_seqs.eq(1) & (idle_ms < 1.0)
            & s.context_tokens.between(PROMPT, PROMPT + OUTPUT))
    probe = read_table(trace, "speed_probe").to_pandas()
    probe = probe[probe.prefill_tokens.eq(0)]
    return float(s.duration_ms[keep].median()), float(probe.duration_ms.median())


def main() -> None:
    """Run the pairs (or read them where OUT holds them) and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--calibration", type=Path, default=CAL)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in range(1, args.pairs + 1):
        grid, replay = args.out / f"grid{k}", args.out / f"replay{k}"
        if not (grid.is_dir() and replay.is_dir()):
            grid, replay = run_pair(args.out, k, args.calibration.resolve())
        (g, gp), (r, rp) = steady_ms(grid), steady_ms(replay)
        rows.append({"pair": k, "grid_ms": g, "replay_ms": r, "ratio": r / g,
                     "grid_probe_ms": gp, "replay_probe_ms": rp,
                     "ratio_over_probes": (r / rp) / (g / gp)})
    summary = {k: float(np.median([row[k] for row in rows]))
               for k in ("ratio", "ratio_over_probes")}
    if args.json:
        print(json.dumps({"pairs": rows, "median": summary}))
        return
    print("pair  grid ms  replay ms  replay/grid  probe: grid  replay  ratio over probes")
    for row in rows:
        print(f"{row['pair']:4d}  {row['grid_ms']:7.3f}  {row['replay_ms']:9.3f}  "
              f"{row['ratio']:11.3f}  {row['grid_probe_ms']:11.3f}  {row['replay_probe_ms']:6.3f}"
              f"  {row['ratio_over_probes']:17.3f}")
    print(f"median replay/grid {summary['ratio']:.3f}, over probes "
          f"{summary['ratio_over_probes']:.3f}")


if __name__ == "__main__":
    main()

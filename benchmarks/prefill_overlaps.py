"""Which requests of a fidelity workload decoded through other requests' prefills, simulated
and live, request by request.

    python benchmarks/prefill_overlaps.py RUN long_prompts

For each request (in arrival order) of RUN/WORKLOAD's simulation and live runs: its TTFT, its
decode time, its TPOT, and the prompt tokens of the prefill steps that started while it
decoded (from each run's requests and steps tables). A TPOT tail set by a few overlapped
requests is read here: the same overlaps simulated and live, or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def overlaps(run: Path) -> pd.DataFrame:
    """Per request of one run: arrival, TTFT and decode ms, TPOT ms, overlapped prefill
    tokens."""
    requests = pd.read_parquet(run / "requests").sort_values("arrival_s", ignore_index=True)
    steps = pd.read_parquet(run / "steps")
    prefills = steps[steps.prefill_tokens > 0]
    rows = []
    for r in requests.itertuples():
        during = prefills[(prefills.start_s >= r.first_token_s) & (prefills.start_s < r.finish_s)]
        decode_s = r.finish_s - r.first_token_s
        rows.append({"arrival_s": round(r.arrival_s - requests.arrival_s.min(), 2),
                     "prompt": r.prompt_tokens, "output": r.output_tokens,
                     "ttft_ms": round(1e3 * (r.first_token_s - r.arrival_s)),
                     "decode_ms": round(1e3 * decode_s),
                     "tpot_ms": round(1e3 * decode_s / max(r.output_tokens - 1, 1), 2),
                     "overlapped": int(during.prefill_tokens.sum())})
    return pd.DataFrame(rows)


def main() -> None:
    """Print the workload's runs side by side, and each run's median decode step."""
    root = Path(sys.argv[1]) / (sys.argv[2] if len(sys.argv) > 2 else "long_prompts")
    runs = [p for p in (root / "sim", *sorted(root.glob("live[0-9]*"))) if p.is_dir()]
    table = None
    for run in runs:
        steps = pd.read_parquet(run / "steps")
        print(f"{run.name}: median decode step "
              f"{steps[steps.prefill_tokens == 0].duration_ms.median():.3f} ms")
        t = overlaps(run)
        cols = ["ttft_ms", "decode_ms", "tpot_ms", "overlapped"]
        t = t.rename(columns={c: f"{c}_{run.name}" for c in cols})
        table = t if table is None else table.join(t[[f"{c}_{run.name}" for c in cols]])
    with pd.option_context("display.width", 250, "display.max_rows", 500):
        print(table.to_string())


if __name__ == "__main__":
    main()

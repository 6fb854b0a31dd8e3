"""What-if: TPOT of in-engine speculative decoding against the acceptance rate, K = 2 and K = 4.

Simulates `examples/spec-k4.yaml`'s workload (at `--rate` requests/s) on the shipped K = 2 and
K = 4 spec calibrations (both fitted on `traces/data/testbed-spec-cpu`: one device, one session)
with vLLM's synthetic acceptance, every position accepted with the same conditional probability
a (so position i is accepted with probability a^(i+1)). Prints the table and writes a figure.
`--calibration` names another pair's spec calibrations ({k} for K) and `--plain` the target's
own calibration, traced in the same session, for the line that speculation must beat.

    python benchmarks/spec_whatif.py [--rate 2] [-o docs/img/spec_whatif.png]
    python benchmarks/spec_whatif.py --device "H200, Llama-3.1-8B / 3.2-1B" \
        --calibration ../sim/data/llama-3.1-8b-spec-3.2-1b-k{k}-h200.calib.json \
        --plain ../sim/data/llama-3.1-8b-h200.calib.json -o docs/img/spec_whatif_h200.png
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RATES = (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def main() -> None:
    """Simulate the grid, print it, plot it."""
    from sim.config import parse_config
    from sim.simulate import simulate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second")
    ap.add_argument("-o", "--out", default="docs/img/spec_whatif.png")
    ap.add_argument("--calibration", default="../sim/data/testbed-large-spec-k{k}-cpu.calib.json",
                    help="spec calibrations, {k} for K, relative to examples/")
    ap.add_argument("--plain", help="the target's plain calibration (no speculation)")
    ap.add_argument("--device", default="testbed CPU", help="for the figure's title")
    args = ap.parse_args()
    base = yaml.safe_load((REPO / "examples" / "spec-k4.yaml").read_text())
    base["workload"]["arrival"]["rate_per_s"] = args.rate
    rows = []
    for k in (2, 4):
        for a in RATES:
            cfg = copy.deepcopy(base)
            group = cfg["cluster"]["replicas"][0]
            group["calibration"] = args.calibration.format(k=k)
            group["speculative"] = {"acceptance_rates": [a ** (i + 1) for i in range(k)]}
            s = simulate(parse_config(cfg, REPO / "examples")).summary
            rows.append({"k": k, "a": a, "tpot_p50_ms": s["tpot_s"]["p50"] * 1e3,
                         "e2e_p50_s": s["e2e_s"]["p50"], "iterations": s["iterations"]})
            print(f"K={k} a={a:.2f}: TPOT P50 {rows[-1]['tpot_p50_ms']:.2f} ms, e2e P50 "
                  f"{rows[-1]['e2e_p50_s']:.3f} s, {s['iterations']} iterations")
    plain = None
    if args.plain:
        cfg = copy.deepcopy(base)
        cfg["cluster"]["replicas"][0] = {"calibration": args.plain}
        s = simulate(parse_config(cfg, REPO / "examples")).summary
        plain = s["tpot_s"]["p50"] * 1e3
        print(f"no speculation: TPOT P50 {plain:.2f} ms, e2e P50 {s['e2e_s']['p50']:.3f} s")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for k in (2, 4):
        pts = [r for r in rows if r["k"] == k]
        ax.plot([r["a"] for r in pts], [r["tpot_p50_ms"] for r in pts], "o-", label=f"K = {k}")
    if plain is not None:
        ax.axhline(plain, color="k", ls="--", label="no speculation")
    ax.set(xlabel="per-position acceptance a (conditional)", ylabel="simulated TPOT P50 (ms)",
           title=f"Speculative decoding, {args.rate:g} req/s\n({args.device})")
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()

"""`reasonsim a1 samples` and `reasonsim a1 budget`: A1 simulated as it scales, asynchronous
against synchronous and the target-only baseline: latency and the target's peak KV against
samples (A1 Fig 1), throughput against the per-sample token budget (Fig 8b)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import RATE, UserError


def _variants(d: dict) -> dict:
    """The config's policy asynchronous and synchronous, and the target-only baseline."""
    programs = (d.get("workload") or {}).get("programs") if isinstance(d, dict) else None
    if not isinstance(programs, dict) or programs.get("method") != "a1":
        raise ValueError("not an A1 program config (workload.programs.method: a1)")
    if programs.get("policy", {}).get("type") == "target_only":  # its A1 rows would be the same
        raise ValueError("its policy is target_only: give the A1 policy (conformal, threshold, "
                         "...) whose variants to compare with the target-only baseline")
    policy = {k: v for k, v in programs["policy"].items()
              if k not in ("samples", "sync", "turns")}
    samples = d["workload"]["programs"]["policy"].get("samples", 4)
    return {"A1 async": {**policy, "samples": samples},
            "A1 sync": {**policy, "samples": samples, "sync": True},
            "target-only": {"type": "target_only", "samples": samples}}


def _sweep(args, points: list[dict], rate_per_s: float | None = None) -> tuple[Path, list]:
    from sim.config import read_yaml
    from sim.families.a1.report import simulate_variants

    path = Path(args.config)
    try:
        d = read_yaml(path)
        return path, simulate_variants(d, path.parent, _variants(d), points, rate_per_s)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{path}: {e}") from None


def _table(title: str, rows: list[dict], first: tuple[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in ("variant", first[1], "P50 s", "P90 s", "accuracy", "rejection", "r", "tok/s",
              "programs/s", "target KV peak", "target F/B"):
        t.add_column(c, justify="left" if c == "variant" else "right")
    for r in rows:
        t.add_row(r["variant"], str(r[first[0]]), f"{r['p50_s']:.3f}", f"{r['p90_s']:.3f}",
                  f"{r['accuracy']:.3f}", "-" if r["rejection_rate"] is None else
                  f"{r['rejection_rate']:.3f}", f"{r['async_arithmetic_intensity']:.1f}",
                  f"{r['throughput_tok_s']:.0f}", f"{r['programs_per_s']:.2f}",
                  str(r["target_kv_peak_blocks"]), "-" if r["target_flop_per_byte"] is None
                  else f"{r['target_flop_per_byte']:.2f}")
    Console(width=160).print(t)


def _step_tokens(path: Path) -> int:
    """The longest step a turn writes (max of Kd and Kt) in the config's conformity trace."""
    from sim.config import load_config
    from traces.store import read_run

    run = read_run(load_config(path).programs.trace)
    s = json.loads(run["params_json"])["workload"]["settings"]
    return max(int(s["draft_tokens"]), int(s["target_tokens"]))


def _emit(args, rows: list[dict], name: str, plot, title: str, first: tuple[str, str]) -> int:
    """Write name.{png,json} under --out, then print the rows (or their JSON)."""
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot(rows, out / f"{name}.png")
        (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    if args.json:
        print(json.dumps(rows))
    else:
        _table(title, rows, first)
    return 0


def cmd_a1_samples(args: argparse.Namespace) -> int:
    """`reasonsim a1 samples`: simulated latency and target KV vs samples per variant."""
    from sim.families.a1.report import plot_latency_vs_samples

    path, rows = _sweep(args, [{"samples": int(m)} for m in args.samples])
    return _emit(args, rows, "latency_vs_samples", plot_latency_vs_samples,
                 f"Simulated A1 latency vs samples: {path.name}", ("samples", "samples"))


def cmd_a1_budget(args: argparse.Namespace) -> int:
    """`reasonsim a1 budget`: simulated throughput vs the per-sample token budget."""
    from sim.families.a1.report import plot_budget

    path, rows = _sweep(args, [{"turns": int(t)} for t in args.turns], args.rate)
    per_turn = _step_tokens(path)
    for r in rows:
        r["budget_tokens"] = r["turns"] * per_turn
    return _emit(args, rows, "throughput_vs_budget", plot_budget,
                 f"Simulated A1 throughput vs per-sample budget ({per_turn} tokens a turn): "
                 f"{path.name}", ("budget_tokens", "budget tokens"))


def add_scaling_parsers(asub) -> None:
    """`a1 samples` and `a1 budget`."""
    from reasonsim.common import ints

    sa = asub.add_parser("samples", help="simulated latency and target KV vs samples: async, "
                         "sync, target-only",
                         description="Simulate an A1 config at each sample count with its "
                         "policy asynchronous, synchronous, and the target-only baseline (same "
                         "workload and seed): latency, throughput and the target pool's peak "
                         "KV blocks and F/B in a table, and latency_vs_samples.png (latency, peak "
                         "KV and F/B against samples).")
    sa.add_argument("config", help="an A1 program config")
    sa.add_argument("--samples", type=ints, default=[1, 2, 4, 8, 16])
    sa.add_argument("-o", "--out", help="write latency_vs_samples.{png,json} here")
    sa.add_argument("--json", action="store_true")
    sa.set_defaults(func=cmd_a1_samples)
    b = asub.add_parser("budget", help="simulated throughput vs the per-sample token budget",
                        description="Simulate an A1 config with each path cut at each number "
                        "of turns (the per-sample token budget: turns x the trace's step "
                        "tokens), asynchronous, synchronous and target-only; throughput in a "
                        "table and throughput_vs_budget.png.")
    b.add_argument("config", help="an A1 program config")
    b.add_argument("--turns", type=ints, default=[2, 4, 8, 16],
                   help="turns per path (at most the conformity trace's)")
    b.add_argument("--rate", type=RATE, default=None,
                   help="programs per second (default the config's; a high rate measures "
                   "what the replicas sustain)")
    b.add_argument("-o", "--out", help="write throughput_vs_budget.{png,json} here")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_a1_budget)

"""`reasonsim a1 offline` and `reasonsim a1 turns`: A1's analyses on a conformity trace, each a
table and a figure (the policy grid with the fixed-threshold baseline at equal accuracy; take-
overs and perplexities by turn)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import UserError, int_at_least, strict_json


def _f(x, fmt: str) -> str:
    return "-" if x is None or x != x else format(x, fmt)


def cmd_a1_offline(args: argparse.Namespace) -> int:
    """`reasonsim a1 offline`: rejection rate vs alpha, accuracy and tokens per policy."""
    from sim.families.a1.offline import equal_accuracy, offline_grid
    from sim.families.a1.report import plot_rates, plot_tokens_accuracy

    try:
        rows = offline_grid(args.trace, args.alphas, args.samples, args.calib_samples,
                            args.thresholds or ())
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    matched = equal_accuracy(rows) if any(r["max_score"] is not None for r in rows) else []
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_rates(rows, out / "rejection_vs_alpha.png")
        plot_tokens_accuracy(rows, out / "tokens_to_accuracy.png")
        (out / "a1_offline.json").write_text(json.dumps(strict_json(rows), indent=1))
        if matched:
            (out / "equal_accuracy.json").write_text(json.dumps(matched, indent=1))
    if args.json:
        print(json.dumps(strict_json({"rows": rows, "equal_accuracy": matched} if matched
                                     else rows)))
        return 0
    _print_grid(args.trace, rows)
    if matched:
        _print_matched(matched)
    return 0


def _print_grid(trace: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    r0 = rows[0]
    t = Table(title=f"A1 offline on {trace}: {r0['questions']} held-out questions, Kd "
              f"{r0['draft_tokens']} sampling, {r0['calib_draft_tokens']} calibration")
    cols = ("policy", "samples", "rejection", "|rate - alpha|", "per question",
            "question spread", "vote acc", "best-of-n", "path acc", "draft tok", "target tok",
            "score tok", "uncovered")
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right")
    for r in rows:
        t.add_row(r["policy"], str(r["samples"]), _f(r["rejection_rate"], ".3f"),
                  _f(r["rate_error"], ".3f"), _f(r["question_rate_error"], ".3f"),
                  _f(r["question_rate_spread"], ".3f"), _f(r["accuracy_vote"], ".3f"),
                  _f(r["accuracy_best_of_n"], ".3f"), _f(r["accuracy_path"], ".3f"),
                  str(r["draft_tokens"]), str(r["target_tokens"]),
                  str(r["score_prefill_tokens"]), str(r["uncovered_paths"]))
    Console(width=200).print(t)


def _print_matched(matched: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="A1 against the fixed-threshold baseline (SpecReason-style) at equal "
              "accuracy: the cheapest threshold at least as accurate, every path in the trace")
    for c in ("policy", "samples", "vote acc", "target-side tok", "question spread",
              "threshold", "its vote acc", "its target-side tok", "its question spread"):
        t.add_column(c, justify="left" if c in ("policy", "threshold") else "right")
    for m in matched:
        t.add_row(m["policy"], str(m["samples"]), _f(m["accuracy_vote"], ".3f"),
                  str(m["target_side_tokens"]), _f(m["question_rate_spread"], ".3f"),
                  m["threshold"] or "none reaches it", _f(m["threshold_accuracy_vote"], ".3f"),
                  _f(m["threshold_target_side_tokens"], "d"),
                  _f(m["threshold_question_rate_spread"], ".3f"))
    Console(width=200).print(t)


def cmd_a1_turns(args: argparse.Namespace) -> int:
    """`reasonsim a1 turns`: take-overs, rejection rate and step perplexities by turn."""
    from policies.a1 import COVERAGES, Conformal, Threshold
    from sim.families.a1.offline import calibrated, load_trace
    from sim.families.a1.turns import per_turn, plot_turns

    try:
        trace = load_trace(args.trace)
        samples = args.samples or trace.samples
        policies = [calibrated(trace, Conformal(a, c)) for c in COVERAGES for a in args.alphas]
        policies += [Threshold(t) for t in args.thresholds or ()]
        rows = [r for p in policies for r in per_turn(trace, p, samples)]
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "per_turn.json").write_text(json.dumps(strict_json(rows), indent=1))
        plot_turns(rows, out / "per_turn.png")
    if args.json:
        print(json.dumps(strict_json(rows)))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"A1 by turn on {args.trace}, {samples} samples per question "
              "(perplexities under the target: the draft's steps, the target's take-overs, "
              "the steps the paths carry)")
    for c in ("policy", "turn", "scored", "take-overs", "rejection", "draft step ppl",
              "target step ppl", "path step ppl"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for r in rows:
        t.add_row(r["policy"], str(r["turn"] + 1), str(r["scored"]), str(r["takeovers"]),
                  _f(r["rejection_rate"], ".3f"), _f(r["draft_step_ppl"], ".2f"),
                  _f(r["target_step_ppl"], ".3f"), _f(r["path_step_ppl"], ".2f"))
    Console(width=160).print(t)
    return 0


def add_analysis_parsers(asub) -> None:
    """`a1 offline` and `a1 turns`."""
    from reasonsim.common import floats, ints

    o = asub.add_parser("offline", help="rejection rate vs alpha, accuracy, tokens by model",
                        description="Replay every policy of a conformity trace counterfactually: "
                        "realised target rejection rate vs alpha (marginal and conditional "
                        "coverage), majority-vote / best-of-n / per-path accuracy against the "
                        "gold answer, and tokens by model, per sample count. With --thresholds, "
                        "the fixed-threshold baseline (SpecReason-style) too, and each conformal "
                        "policy beside the cheapest threshold at least as accurate.")
    o.add_argument("trace", help="conformity trace directory (reasonsim trace conformity)")
    o.add_argument("--alphas", type=floats, default=None,
                   help="alphas to replay (default: the trace's grid; others may leave it)")
    o.add_argument("--samples", type=ints, default=None,
                   help="sample counts (default: 1, 2, 4, ... up to the trace's)")
    o.add_argument("--calib-samples", type=int_at_least(1), default=None,
                   help="calibrate on each question's first N calibration samples only")
    o.add_argument("--thresholds", type=floats, default=None,
                   help="fixed score thresholds (mean NLL under the target) of the baseline; "
                   "a path off the traced tree is counted as uncovered")
    o.add_argument("-o", "--out", help="write a1_offline.json, rejection_vs_alpha.png, "
                   "tokens_to_accuracy.png (and equal_accuracy.json) here")
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_a1_offline)
    t = asub.add_parser("turns", help="take-overs and step perplexities by turn (Fig 9)",
                        description="Walk each policy's paths down a conformity trace and count, "
                        "turn by turn, the scored draft steps, the target's take-overs, the "
                        "rejection rate and three perplexities under the target: the draft's "
                        "steps, the target's own steps where it took over, and the steps the "
                        "paths carry.")
    t.add_argument("trace", help="conformity trace directory (reasonsim trace conformity)")
    t.add_argument("--alphas", type=floats, default=[0.4],
                   help="conformal alphas (both coverages; default 0.4)")
    t.add_argument("--thresholds", type=floats, default=None,
                   help="fixed-threshold baselines beside them")
    t.add_argument("--samples", type=int_at_least(1), default=None,
                   help="samples per question (default: the trace's)")
    t.add_argument("-o", "--out", help="write per_turn.json and per_turn.png here")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_a1_turns)

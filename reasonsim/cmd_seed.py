"""`reasonsim trace spec`: speculative decoding traces (the SEED family's measurements)."""

from __future__ import annotations

import argparse

from reasonsim.cmd_seed_tree import add_replay_parser, add_tot_trace_parser
from reasonsim.common import (CACHE_GB, TESTBED, UserError, counts, int_at_least, ints,
                             print_summary, seed_int, temperatures)


def cmd_trace_spec(args: argparse.Namespace) -> int:
    """`reasonsim trace spec`."""
    from tracers.spec import SpecWorkload, trace_spec

    try:
        wl = SpecWorkload(k_values=tuple(args.k), batch_sizes=tuple(args.batch_sizes),
                          questions_per_wave=args.questions, max_tokens=args.max_tokens,
                          temperatures=tuple(args.temperatures),
                          prompt_tokens=tuple(args.prompt_tokens), seed=args.seed)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.engine == "torch":
        from tracers.torch_spec_trace import trace_torch_spec

        try:
            summary = trace_torch_spec(args.target, args.draft, args.out, wl,
                                       load_format=args.load_format, progress=not args.quiet)
        except ValueError as e:
            raise UserError(str(e)) from None
    elif args.load_format != "auto":
        raise UserError("--load-format dummy: with --engine torch (vLLM's draft needs weights)")
    else:
        summary = trace_spec(args.target, args.draft, args.out, wl,
                             kv_cache_gb=args.kv_cache_gb, progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def add_trace_parser(tsub) -> None:
    """The `trace spec` subparser."""
    s = tsub.add_parser("spec", help="vLLM's draft-model speculative decoding, step by step",
                        description="Decode held-out testbed questions on an in-process vLLM "
                        "engine doing draft-model speculative decoding (speculative_config "
                        "method draft_model), for each K, sampling temperature and batch size; "
                        "per request and step: drafted and accepted tokens, accepted positions, "
                        "the step's drafting time (the drafter timed) and the rest (the "
                        "spec_steps table), with steps and requests.")
    s.add_argument("--draft", default=str(TESTBED / "draft"), help="draft model directory")
    s.add_argument("--target", default=str(TESTBED / "target-large"),
                   help="target model directory")
    s.add_argument("-o", "--out", required=True, help="trace directory to write")
    s.add_argument("--k", type=ints, default=[2, 4], help="num_speculative_tokens values")
    s.add_argument("--batch-sizes", type=ints, default=[1, 4, 8])
    s.add_argument("--questions", type=int_at_least(1), default=8,
                   help="questions per K x mode x batch")
    s.add_argument("--max-tokens", type=int_at_least(1), default=160)
    s.add_argument("--temperatures", type=temperatures,
                   default=[0.0, 0.8], help="0 = greedy acceptance")
    s.add_argument("--prompt-tokens", type=counts, default=[0],
                   help="prompt lengths, a pass of the waves each (0: the question itself; n: n "
                   "tokens cut from the testbed's questions)")
    s.add_argument("--kv-cache-gb", type=CACHE_GB, default=0.5)
    s.add_argument("--engine", default="vllm", choices=["vllm", "torch"],
                   help="torch: greedy speculative decoding on two PyTorch engines (CUDA where "
                   "torch sees a GPU; --temperatures 0 only)")
    s.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy (torch engine): random weights from config.json, a real "
                   "draft/target shape pair for draft and verify times (acceptance is ~0)")
    s.add_argument("--seed", type=seed_int, default=0)
    s.add_argument("--json", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_trace_spec)
    add_tot_trace_parser(tsub)


def cmd_seed_offline(args: argparse.Namespace) -> int:
    """`reasonsim seed offline`: acceptance distributions and step costs of a spec trace (a ToT
    trace: its program-level acceptance)."""
    import json
    from pathlib import Path

    from sim.engine.speculative import acceptance, load_spec, plot_acceptance, step_costs

    try:
        spec, steps = load_spec(args.trace)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    result = {"acceptance": acceptance(spec),
              "step_costs": step_costs(spec, steps) if steps is not None else []}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "spec_offline.json").write_text(json.dumps(result, indent=1))
        plot_acceptance(result["acceptance"], out / "acceptance.png")
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Speculative decoding on {args.trace}")
    for c in ("K", "temp", "steps", "acceptance", "tokens/step", "accepted length share",
              "per position", "by difficulty"):
        t.add_column(c, justify="right")
    for r in result["acceptance"]:
        t.add_row(str(r["k"]), f"{r['temperature']:g}", str(r["steps"]),
                  f"{r['acceptance_rate']:.3f}", f"{r['tokens_per_step']:.2f}",
                  " ".join(f"{x:.2f}" for x in r["accepted_length_share"]),
                  " ".join(f"{x:.2f}" for x in r["position_acceptance"]),
                  " ".join(f"{d}:{x:.2f}" for d, x in r["by_difficulty"].items()))
    c = Table(title="Speculative step cost (median ms)")
    for col in ("K", "seqs", "steps", "step", "drafting", "verify + rest"):
        c.add_column(col, justify="right")
    for r in result["step_costs"]:
        c.add_row(str(r["k"]), r["seqs"], str(r["steps"]), f"{r['step_ms']:.2f}",
                  f"{r['draft_ms']:.2f}", f"{r['verify_ms']:.2f}")
    console = Console(width=160)
    console.print(t)
    if result["step_costs"]:  # a ToT trace's rounds have no engine steps of their own
        console.print(c)
    return 0


def add_seed_parser(sub) -> None:
    """The `seed` command group."""
    se = sub.add_parser("seed", help="speculative decoding (SEED) experiments on spec traces")
    ssub = se.add_subparsers(dest="seed_command", required=True, metavar="EXPERIMENT")
    o = ssub.add_parser("offline", help="acceptance distributions and step costs of a spec trace",
                        description="Acceptance rate, accepted-length distribution and per-"
                        "position acceptance per K and sampling mode (and per difficulty), and "
                        "the median cost of a speculative step split into drafting and the "
                        "rest, per K and batch band. A ToT trace gives its program-level "
                        "verifications' acceptance (full chain-draft rounds; no step costs).")
    o.add_argument("trace", help="spec trace directory (reasonsim trace spec) or ToT trace "
                   "(reasonsim tot trace)")
    o.add_argument("-o", "--out", help="write spec_offline.json and acceptance.png here")
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_seed_offline)
    add_replay_parser(ssub)

"""`reasonsim trace ...` and `reasonsim traces check`: recording and checking traces."""

from __future__ import annotations

import argparse
import sys

from reasonsim.common import UserError, print_summary


def cmd_trace_steps(args: argparse.Namespace) -> int:
    """`reasonsim trace steps`."""
    from tracers.step_profile import StepGrid, profile_steps

    try:
        grid = StepGrid(batch_sizes=args.batch_sizes, prompt_tokens=args.prompt_tokens,
                        output_tokens=args.output_tokens, repeats=args.repeats,
                        warmup_steps=args.warmup_steps, idle_ms=tuple(args.idle_ms),
                        regimes=args.regimes)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.engine == "torch":
        from tracers.torch_steps import profile_torch_steps

        if args.resume:
            raise UserError("--resume: the torch engine's grid runs whole (start a new directory)")
        try:
            summary = profile_torch_steps(
                model=args.model, out_dir=args.out, grid=grid, load_format=args.load_format,
                dtype=args.dtype, seed=args.seed, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len, progress=not args.quiet)
        except ValueError as e:
            raise UserError(str(e)) from None
        print_summary(summary, args.json)
        return 0
    summary = profile_steps(model=args.model, out_dir=args.out, grid=grid,
                            load_format=args.load_format, dtype=args.dtype, seed=args.seed,
                            resume=args.resume, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            max_model_len=args.max_model_len, kv_cache_gb=args.kv_cache_gb, progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def cmd_trace_serve(args: argparse.Namespace) -> int:
    """`reasonsim trace serve`."""
    from tracers.serve import ServeWorkload, trace_serve

    wl = ServeWorkload(num_requests=args.num_requests, rate_per_s=args.rate,
                       prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                       seed=args.seed, concurrency=args.concurrency,
                       warmup_requests=args.warmup_requests)
    summary = trace_serve(url=args.url, model=args.model, out_dir=args.out, workload=wl,
                          resume=args.resume, progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def cmd_trace_probes(args: argparse.Namespace) -> int:
    """`reasonsim trace probes`."""
    from tracers.probes import ProbeWorkload, trace_probes

    wl = ProbeWorkload(questions_per_cell=args.questions, samples=args.samples,
                       stride_tokens=args.stride, budget_tokens=args.budget,
                       probe_tokens=args.probe_tokens, temperature=args.temperature,
                       probe_temperature=args.probe_temperature, seed=args.seed)
    summary = trace_probes(args.model, args.out, wl, resume=args.resume,
                           progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def cmd_trace_branches(args: argparse.Namespace) -> int:
    """`reasonsim trace branches`."""
    from programs.search import SearchSettings
    from live.branches import BranchWorkload, trace_branches

    try:
        wl = BranchWorkload(questions_per_cell=args.questions, sc_samples=args.samples,
                            mcts_iterations=args.iterations, rebase_widths=tuple(args.widths),
                            methods=tuple(args.methods), seed=args.seed,
                            settings=SearchSettings(budget_tokens=args.budget,
                                                    temperature=args.temperature))
    except ValueError as e:
        raise UserError(str(e)) from None
    summary = trace_branches(args.model, args.out, wl, resume=args.resume,
                             progress=not args.quiet)
    print_summary(summary, args.json)
    return 0


def cmd_trace_exits(args: argparse.Namespace) -> int:
    """`reasonsim trace exits`."""
    from testbed.streams import ExitsWorkload
    from tracers.exits import trace_exits
    from testbed.tasks import FAMILIES

    bad = [p for p in args.phases if p not in FAMILIES]
    if bad:
        raise UserError(f"--phases: unknown family {bad[0]!r}; known: {', '.join(FAMILIES)}")
    if min(args.prompts_per_phase, args.max_tokens, args.max_num_seqs) < 1:
        raise UserError("--prompts-per-phase, --max-tokens and --max-num-seqs must be >= 1")
    if any(not 0 < t <= 1 for t in args.ee_thresholds):
        raise UserError("--ee-thresholds: each must be in (0, 1]")
    wl = ExitsWorkload(phases=args.phases, prompts_per_phase=args.prompts_per_phase,
                       max_tokens=args.max_tokens, max_num_seqs=args.max_num_seqs, seed=args.seed)
    summary = trace_exits(args.model, args.out, wl, load_format=args.load_format,
                          progress=not args.quiet, ee_thresholds=args.ee_thresholds)
    print_summary(summary, args.json)
    return 0


def cmd_traces_check(args: argparse.Namespace) -> int:
    """`reasonsim traces check`."""
    from traces.store import check_trace

    bad = 0
    for path in args.paths:
        violations = check_trace(path)
        if violations:
            bad += 1
            for v in violations[: args.max_errors]:
                print(f"FAIL {v}", file=sys.stderr)
            if len(violations) > args.max_errors:
                print(f"FAIL {path}: {len(violations) - args.max_errors} more violations",
                      file=sys.stderr)
        else:
            print(f"ok   {path}")
    if bad:
        raise UserError(f"{bad} of {len(args.paths)} trace paths violate the contract")
    return 0

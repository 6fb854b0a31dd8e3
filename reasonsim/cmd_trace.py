"""`reasonsim trace ...` and `reasonsim traces check`: recording and checking traces."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inputs.repeats import repeated
from reasonsim.common import (CACHE_GB, RATE, TEMPERATURE, UserError, int_at_least, names,
                             print_summary, seed_int, server_url)


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
                max_model_len=args.max_model_len, serving=args.serving, graphs=args.graphs,
                progress=not args.quiet)
        except ValueError as e:
            raise UserError(str(e)) from None
        print_summary(summary, args.json)
        return 0
    if args.serving or args.graphs:
        raise UserError("--serving, --graphs: modes of the PyTorch engine (--engine torch); "
                        "vLLM serves so already")
    summary = profile_steps(model=args.model, out_dir=args.out, grid=grid,
                            load_format=args.load_format, dtype=args.dtype, seed=args.seed,
                            resume=args.resume, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            max_model_len=args.max_model_len, kv_cache_gb=args.kv_cache_gb,
                            progress=not args.quiet)
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
                           progress=not args.quiet, engine=args.engine, device=args.device)
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
                             progress=not args.quiet, engine=args.engine, device=args.device)
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
    if any(not 0 < t <= 1 for t in args.ee_thresholds):  # NaN fails too
        raise UserError("--ee-thresholds: each must be in (0, 1]")
    if repeated(args.ee_thresholds):  # the same runs twice, one row kept
        raise UserError(f"--ee-thresholds: {repeated(args.ee_thresholds)[0]:g} repeats")
    wl = ExitsWorkload(phases=args.phases, prompts_per_phase=args.prompts_per_phase,
                       max_tokens=args.max_tokens, max_num_seqs=args.max_num_seqs, seed=args.seed,
                       waves=tuple(args.waves))
    summary = trace_exits(args.model, args.out, wl, load_format=args.load_format,
                          progress=not args.quiet, ee_thresholds=args.ee_thresholds)
    print_summary(summary, args.json)
    return 0


def cmd_traces_check(args: argparse.Namespace) -> int:
    """`reasonsim traces check`."""
    from traces.checks import check_trace

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


WHOLE_TABLES = {kind: ("requests", "steps") for kind in (
    "steps", "replay", "spec", "probes", "branches", "exits", "program_replay")}
"""the tables every trace of these kinds holds (a directory without one lost it)"""


def _incomplete(d: Path, kind: str) -> list[str]:
    """What a trace of `kind` lacks to be whole: a table its kind always writes, or any done
    marker (`_units/*.done`, written after a unit's parts)."""
    if kind not in WHOLE_TABLES:
        return []
    missing = [f"{d / t}: a {kind} trace's table is missing" for t in WHOLE_TABLES[kind]
               if not any((d / t).glob("part-*.parquet"))]
    if not any((d / "_units").glob("*.done")):
        missing.append(f"{d / '_units'}: no done marker (no unit of the run finished)")
    return missing


def cmd_traces_seal(args: argparse.Namespace) -> int:
    """`reasonsim traces seal`: manifests for whole directories written before manifests."""
    from traces.manifest import MANIFEST, seal
    from traces.checks import check_trace
    from traces.store import read_run

    for path in args.paths:
        dirs = sorted({p.parent.parent for p in Path(path).rglob("runs/part-*.parquet")},
                      key=lambda d: -len(d.parts))  # nested runs before the one holding them
        if not dirs:  # nothing sealed, nothing to seal: not a trace
            raise UserError(f"{path}: not a trace directory (no runs table under it)")
        for d in dirs:
            if (d / MANIFEST).exists():
                if bad := check_trace(d):  # sealed, then changed: its manifest no longer holds
                    raise UserError(f"{bad[0]} (sealed, but it no longer matches its manifest)")
                print(f"ok   {d} (already sealed)")
                continue
            bad = [str(v) for v in check_trace(d) if not v.path.endswith(MANIFEST)] or \
                _incomplete(d, read_run(d)["kind"])
            if bad:
                raise UserError(f"{bad[0]} (not sealed: only a whole, valid directory is)")
            seal(d, read_run(d)["run_id"])
            print(f"seal {d}")
    return 0


def add_steps_parser(tsub) -> None:
    """`reasonsim trace steps`."""
    from reasonsim.common import DEFAULT_MODEL, counts, ints

    s = tsub.add_parser("steps", help="profile an engine step by step over a grid",
                        description="Drive vLLM's LLMEngine step by step over a grid of batch "
                        "sizes x prompt lengths x output lengths; record every iteration "
                        "(steps table) and every request (requests table).")
    s.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="model directory (config.json; weights optional with --load-format "
                   "dummy); default: the testbed's target-large")
    s.add_argument("-o", "--out", required=True, help="trace directory to write")
    s.add_argument("--batch-sizes", type=ints, default=[1, 4, 16, 64], help="e.g. 1,4,16,64")
    s.add_argument("--prompt-tokens", type=ints, default=[32, 128, 512, 1024])
    s.add_argument("--output-tokens", type=ints, default=[16, 64, 128, 256])
    s.add_argument("--repeats", type=int_at_least(1), default=2,
                   help="repeats of each grid cell (>= 2 gives every shape warm samples)")
    s.add_argument("--warmup-steps", type=int_at_least(0), default=3,
                   help="first N iterations of the run flagged is_warmup; the first iteration "
                   "of each new shape is flagged too")
    s.add_argument("--idle-ms", type=counts, default=[0], help="idle time before each cell, "
                   "cycling (e.g. 0,20,100: steps after idle, as live traffic has them)")
    s.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy = random weights from config.json alone")
    s.add_argument("--dtype", default="auto",
                   choices=["auto", "float32", "float", "bfloat16", "float16", "half"],
                   help="auto = float32 on CPU, bfloat16 on GPU")
    s.add_argument("--seed", type=seed_int, default=0)
    s.add_argument("--max-num-seqs", type=int_at_least(1), default=None)
    s.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=None)
    s.add_argument("--max-model-len", type=int_at_least(1), default=None,
                   help="the engine's longest request (prompt + output); the calibration "
                   "carries it, so set it to the deployment's (default: the grid's longest)")
    s.add_argument("--kv-cache-gb", type=CACHE_GB, default=1.0, help="CPU KV cache space (GiB)")
    s.add_argument("--regimes", type=lambda t: tuple(x for x in t.split(",") if x),
                   default=("greedy",), help="sampling regimes, each cell run in each: greedy, "
                   "seeded (temperature 0.7, top-p 0.95, a seed per request), logprobs (seeded "
                   "with the sampled tokens' log-probabilities); e.g. greedy,seeded,logprobs")
    s.add_argument("--engine", default="vllm", choices=["vllm", "torch"],
                   help="torch: the PyTorch engine, on CUDA where torch sees a GPU (no vLLM "
                   "there); a KV slot per sequence, so --kv-cache-gb does not apply")
    s.add_argument("--serving", action="store_true",
                   help="with --engine torch: its serving mode (steps composed as vLLM's "
                   "scheduler composes them, one packed forward each), the mode `replay` "
                   "serves on")
    s.add_argument("--graphs", action="store_true",
                   help="with --serving: decode-only steps replayed as CUDA graphs (on the CPU "
                   "the same static-shape code runs eagerly)")
    s.add_argument("--resume", action="store_true", help="continue an interrupted trace")
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_trace_steps)


def add_serve_parser(tsub) -> None:
    """`reasonsim trace serve`."""
    from reasonsim.common import ints

    v = tsub.add_parser("serve", help="stream a workload against an OpenAI-compatible server",
                        description="Send a seeded Poisson workload to /v1/completions with "
                        "streaming and record per-token arrival times (token_times) and "
                        "per-request timings (requests).")
    v.add_argument("--url", required=True, type=server_url, help="server base URL, e.g. http://127.0.0.1:8000")
    v.add_argument("--model", default=None, help="model name on the server (default: first "
                   "model listed by /v1/models)")
    v.add_argument("-o", "--out", required=True, help="trace directory to write")
    v.add_argument("--num-requests", type=int_at_least(1), default=32)
    v.add_argument("--rate", type=RATE, default=4.0, help="Poisson arrivals per second "
                   "(0 = all at once)")
    v.add_argument("--prompt-tokens", type=ints, default=[64, 256], help="choices, sampled")
    v.add_argument("--output-tokens", type=ints, default=[32, 128], help="choices, sampled")
    v.add_argument("--concurrency", type=int_at_least(1), default=64,
                   help="max requests in flight")
    v.add_argument("--warmup-requests", type=int_at_least(0), default=2,
                   help="unrecorded requests sent before the clock starts (server warm-up)")
    v.add_argument("--seed", type=seed_int, default=0)
    v.add_argument("--resume", action="store_true")
    v.add_argument("--json", action="store_true")
    v.add_argument("-q", "--quiet", action="store_true")
    v.set_defaults(func=cmd_trace_serve)


def _engine_arguments(parser) -> None:
    parser.add_argument("--engine", default="vllm", choices=["vllm", "torch"],
                        help="vLLM, or the PyTorch engine's serving mode (no prefix cache)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="with --engine torch: where it runs")


def add_probes_parser(tsub) -> None:
    """`reasonsim trace probes`."""
    from reasonsim.common import DEFAULT_MODEL

    pr = tsub.add_parser("probes", help="probe chain-of-thought mid-reasoning (Dynasor)",
                         description="Decode each question x sample in chunks and probe the "
                         "answer after every chunk; never stop early (counterfactual replay).")
    pr.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    pr.add_argument("-o", "--out", required=True, help="trace directory to write")
    pr.add_argument("--questions", type=int_at_least(1), default=4,
                    help="questions per family x level")
    pr.add_argument("--samples", type=int_at_least(1), default=4,
                    help="reasoning samples per question")
    pr.add_argument("--stride", type=int_at_least(1), default=16,
                    help="reasoning tokens between probes")
    pr.add_argument("--budget", type=int_at_least(1), default=256, help="reasoning token budget")
    pr.add_argument("--probe-tokens", type=int_at_least(1), default=20, help="tokens per probe")
    pr.add_argument("--temperature", type=TEMPERATURE, default=0.7, help="reasoning temperature")
    pr.add_argument("--probe-temperature", type=TEMPERATURE, default=0.6,
                    help="probe temperature (0.6 is the public reference's; 0 is greedy)")
    pr.add_argument("--seed", type=seed_int, default=0)
    _engine_arguments(pr)
    pr.add_argument("--resume", action="store_true", help="continue a killed trace")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("-q", "--quiet", action="store_true")
    pr.set_defaults(func=cmd_trace_probes)


def add_branches_parser(tsub) -> None:
    """`reasonsim trace branches`."""
    from reasonsim.common import DEFAULT_MODEL, ints

    br = tsub.add_parser("branches", help="SC, MCTS and Rebase programs to their caps (Dynasor)",
                         description="Run each question's self-consistency, MCTS and Rebase "
                         "programs to their caps and record every request (the branches table) "
                         "with its path reward: the model's own path likelihood.")
    br.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="trained model directory; default: the testbed's target-large")
    br.add_argument("-o", "--out", required=True, help="trace directory to write")
    br.add_argument("--questions", type=int_at_least(1), default=6,
                    help="questions per family x level")
    br.add_argument("--methods", type=names, default=["sc", "mcts", "rebase"])
    br.add_argument("--samples", type=int_at_least(1), default=16, help="self-consistency samples")
    br.add_argument("--iterations", type=int_at_least(1), default=16, help="MCTS iterations")
    br.add_argument("--widths", type=ints, default=[4, 8, 16], help="Rebase widths")
    br.add_argument("--budget", type=int_at_least(1), default=256,
                    help="reasoning tokens per path")
    br.add_argument("--temperature", type=TEMPERATURE, default=0.7)
    br.add_argument("--seed", type=seed_int, default=0)
    _engine_arguments(br)
    br.add_argument("--resume", action="store_true", help="continue a killed trace")
    br.add_argument("--json", action="store_true")
    br.add_argument("-q", "--quiet", action="store_true")
    br.set_defaults(func=cmd_trace_branches)


def add_exits_parser(tsub) -> None:
    """`reasonsim trace exits`."""
    from reasonsim.common import DEFAULT_MODEL, ints_in_order
    from testbed.streams import ExitsWorkload

    ex = tsub.add_parser("exits", help="every exit's view of every token on the PyTorch engine "
                         "(HELIOS)", description="Run a stream of held-out testbed prompts in "
                         "phases of one task family each on the PyTorch engine at full depth "
                         "(greedy) and record, per output token, the max probability and argmax "
                         "at every exit; per step, each layer's time; per layer, weight and KV "
                         "bytes and the measured load time. The stream is also served with layer "
                         "skipping (EE-LLM style, one sequence) at each --ee-thresholds value, "
                         "to time the EE-full baseline's steps.")
    ex.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="Llama model directory; default: the testbed's target-large")
    ex.add_argument("-o", "--out", required=True, help="trace directory to write")
    ex.add_argument("--phases", type=lambda t: tuple(t.split(",")),
                    default=("mod", "count", "mod", "count"), help="task family per phase")
    ex.add_argument("--prompts-per-phase", type=int_at_least(1), default=30)
    ex.add_argument("--max-tokens", type=int_at_least(1), default=96)
    ex.add_argument("--max-num-seqs", type=int_at_least(1), default=32)
    ex.add_argument("--waves", type=ints_in_order, default=list(ExitsWorkload.waves),
                    help="prompts per arrival wave, cycled within each phase (e.g. 1,4,2,8); a "
                    "wave waits for a free slot per prompt, so it is prefilled in one step. "
                    "Default: 24,1,32,4,16,2,8,3,12 (as large as a HELIOS round)")
    ex.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ex.add_argument("--ee-thresholds", type=lambda t: tuple(float(x) for x in t.split(",") if x),
                    default=(0.9,), help="thresholds of the layer-skipping passes (EE-full "
                    "baseline); '' for none. Default: 0.9")
    ex.add_argument("--seed", type=seed_int, default=0)
    ex.add_argument("--json", action="store_true")
    ex.add_argument("-q", "--quiet", action="store_true")
    ex.set_defaults(func=cmd_trace_exits)


def add_traces_parser(sub) -> None:
    """The `traces` command group."""
    tr = sub.add_parser("traces", help="inspect and validate trace directories")
    trsub = tr.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    c = trsub.add_parser("check", help="validate trace directories or part files",
                         description="Validate schema, version, columns, times; name file, "
                         "column and row of every violation. Exit 2 if any path fails.")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--max-errors", type=int_at_least(0), default=20)
    c.set_defaults(func=cmd_traces_check)
    s = trsub.add_parser("seal", help="write the manifest of whole trace directories written "
                         "before manifests",
                         description="Check each directory (and the runs nested in it) and, "
                         "where it is whole and valid, write its manifest (`_manifest.json`: "
                         "every part's rows and sha256), which `traces check` verifies. Writers "
                         "seal their own output; this is for directories from before that.")
    s.add_argument("paths", nargs="+", metavar="DIR")
    s.set_defaults(func=cmd_traces_seal)

"""The `reasonsim` command: one entry point; each subcommand's parser and handler live in a `cmd_*`
module, which imports its engine or simulator only when it runs, so `--help` stays fast."""

from __future__ import annotations

import argparse
import os
import re
import sys

from reasonsim.cmd_a1 import add_a1_parser
from reasonsim.cmd_a1 import add_trace_parser as add_trace_conformity
from reasonsim.cmd_dynasor import add_dynasor_parser
from reasonsim.cmd_fidelity import add_fidelity_parser
from reasonsim.cmd_helios import add_helios_parser
from reasonsim.cmd_seed import add_seed_parser
from reasonsim.cmd_seed import add_trace_parser as add_trace_spec
from reasonsim.cmd_sim import (add_calibrate_parser, add_demo_parser, add_replay_parser,
                               add_simulate_parser, add_validate_parser)
from reasonsim.cmd_sweep import add_sweep_parser
from reasonsim.cmd_testbed import add_testbed_parser
from reasonsim.cmd_trace import (add_branches_parser, add_exits_parser, add_probes_parser,
                                 add_serve_parser, add_steps_parser, add_traces_parser)
from reasonsim.common import UserError


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used by the docs test): each command module adds its own."""
    p = argparse.ArgumentParser(prog="reasonsim", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    trace = sub.add_parser("trace", help="record traces from a real engine")
    tsub = trace.add_subparsers(dest="trace_command", required=True, metavar="TRACER")
    for add in (add_steps_parser, add_serve_parser, add_probes_parser, add_branches_parser,
                add_trace_conformity, add_trace_spec, add_exits_parser):
        add(tsub)
    for add in (add_traces_parser, add_calibrate_parser, add_simulate_parser, add_sweep_parser,
                add_demo_parser, add_replay_parser, add_validate_parser, add_fidelity_parser,
                add_a1_parser, add_seed_parser, add_helios_parser, add_dynasor_parser,
                add_testbed_parser):
        add(sub)
    return p


def _one_line(e: Exception) -> str:
    """An error in one line: its first, and for a validation error from an engine's own config
    ("2 validation errors for ModelConfig") the first field and what is wrong with it."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if re.match(r"\d+ validation errors? for ", lines[0]) and len(lines) >= 3:
        return f"{lines[0]}: {lines[1]}: {lines[2].split(' [type=')[0]}"
    return lines[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `reasonsim` console script."""
    args = build_parser().parse_args(argv)
    # vLLM's log lines on stderr, from its first import on (a job's fork server imports it
    # before any engine starts): stdout is the command's output, a `--json` summary.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        if getattr(args, "device", None) not in (None, "auto"):
            from reasonsim.common import check_device

            check_device(args)
        return args.func(args)
    except (UserError, ValueError, OSError, RuntimeError) as e:
        # Bad input, unreachable servers, dead engines: one line. REASONSIM_DEBUG=1 shows where.
        if os.environ.get("REASONSIM_DEBUG"):
            raise
        print(f"reasonsim: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

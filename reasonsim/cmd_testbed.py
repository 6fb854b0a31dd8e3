"""`reasonsim testbed build | eval`: the synthetic reasoning testbed's models."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cmd_testbed_build(args: argparse.Namespace) -> int:
    """`reasonsim testbed build`."""
    import torch

    from testbed.train import build

    if args.threads:
        torch.set_num_threads(args.threads)
    build(args.out, names=args.models, steps_scale=args.steps_scale, init_dir=args.init_from,
          log=(lambda *a: None) if args.quiet else (lambda msg: print(msg, flush=True)))
    return 0


def cmd_testbed_eval(args: argparse.Namespace) -> int:
    """`reasonsim testbed eval`."""
    from testbed.evaluate import evaluate

    result = evaluate(args.models, items_per_cell=args.items, samples=args.samples,
                      seed=args.seed, progress=not (args.quiet or args.json))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0

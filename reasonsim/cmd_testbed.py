"""`reasonsim testbed build | eval`: the synthetic reasoning testbed's models."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inputs.repeats import repeated
from reasonsim.common import UserError


def cmd_testbed_build(args: argparse.Namespace) -> int:
    """`reasonsim testbed build`."""
    import torch

    from testbed.train import SPECS, build

    if args.models and repeated(args.models):  # one model trained twice, over itself
        raise UserError(f"--models: {repeated(args.models)[0]} given twice")
    if args.init_from is not None:  # every model's, before the first trains for minutes
        from engines.model_dir import check_model

        for name in [n for n in args.models or SPECS if n in SPECS]:  # build names others
            try:
                check_model(Path(args.init_from) / name, "auto")
            except FileNotFoundError as e:
                raise UserError(f"--init-from: {e}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    build(args.out, names=args.models, steps_scale=args.steps_scale, init_dir=args.init_from,
          log=(lambda *a: None) if args.quiet else (lambda msg: print(msg, flush=True)))
    return 0


def cmd_testbed_eval(args: argparse.Namespace) -> int:
    """`reasonsim testbed eval`."""
    from testbed.evaluate import evaluate

    if args.save and not Path(args.save).parent.is_dir():  # known before the evaluation's minutes
        raise UserError(f"--save {args.save}: no directory {Path(args.save).parent}")
    result = evaluate(args.models, items_per_cell=args.items, samples=args.samples,
                      seed=args.seed, progress=not (args.quiet or args.json))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def add_testbed_parser(sub) -> None:
    """The `testbed` command group."""
    from reasonsim.common import POSITIVE, TESTBED, int_at_least, seed_int

    tb = sub.add_parser("testbed", help="build and measure the small trained testbed models")
    tbsub = tb.add_subparsers(dest="testbed_command", required=True, metavar="ACTION")
    b = tbsub.add_parser("build", help="train target-large, target-small and draft (CPU, ~1 h)",
                         description="Train the testbed models on the synthetic reasoning task, "
                         "deterministically (seeded data and initialisation).")
    b.add_argument("-o", "--out", default=str(TESTBED), help="directory for the model folders")
    b.add_argument("--models", nargs="+", default=None, help="subset of models to train")
    b.add_argument("--steps-scale", type=POSITIVE, default=1.0,
                   help="multiply every model's step budget (e.g. 0.01 for a smoke run)")
    b.add_argument("--threads", type=int_at_least(0), default=0,
                   help="torch threads (default: torch's)")
    b.add_argument("--init-from", default=None,
                   help="directory of models that finished stage 1: run only the later stages")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=cmd_testbed_build)
    e = tbsub.add_parser("eval", help="measure accuracy, probes, entropy, exits and acceptance",
                         description="Evaluate the testbed models on held-out items and print "
                         "one JSON object.")
    e.add_argument("--models", default=str(TESTBED), help="directory holding the model folders")
    e.add_argument("--items", type=int_at_least(1), default=24,
                   help="held-out items per family x level")
    e.add_argument("--samples", type=int_at_least(1), default=8,
                   help="samples per item at temperature 0.7")
    e.add_argument("--seed", type=seed_int, default=0)
    e.add_argument("--save", default=None, help="also write the JSON object to this file")
    e.add_argument("--json", action="store_true", help="print compact JSON, no progress")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=cmd_testbed_eval)

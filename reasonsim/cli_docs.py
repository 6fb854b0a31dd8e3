"""Reference pages generated from the code: `docs/cli.md` and `docs/config.md`.

    python -m reasonsim.cli_docs cli > docs/cli.md
    python -m reasonsim.cli_docs config > docs/config.md

`cli.md` is the parsers' own `--help` text, command by command; `config.md` is every key of
the strict schemas inputs are checked by (type, default, bounds). Neither can drift from the
code: `tests/test_readme.py` regenerates both and fails when a committed page differs.
"""

from __future__ import annotations

import argparse
import os

WIDTH = 100
"""the help text's line width (argparse reads it from COLUMNS), fixed so the page is stable"""

HEADER = """# Command reference

Generated from the argument parsers by `python -m reasonsim.cli_docs cli > docs/cli.md` (a test
fails when this page is stale). Each section is the command's `--help`.
"""

CONFIG_HEADER = """# Configuration reference

Generated from the strict schemas every input is checked by, with
`python -m reasonsim.cli_docs config > docs/config.md` (a test fails when this page is stale).
One line per key: its type, its default (or `required`) and its bounds. A key not listed is
refused, as is a value of another type or out of bounds, with one line naming the file and key.
"""


def _walk(parser: argparse.ArgumentParser, path: list[str]) -> list[str]:
    """The parser's section, then each subcommand's, depth first in declaration order."""
    out = [f"\n## `{' '.join(path)}`\n", "```text", parser.format_help().rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _walk(sub, path + [name])
    return out


def render() -> str:
    """The whole page."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        from reasonsim.cli import build_parser

        parser = build_parser()
        parser.prog = "reasonsim"
        return HEADER + "\n".join(_walk(parser, ["reasonsim"])) + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def render_config() -> str:
    """The configuration page: each input's keys from its schema."""
    from programs.workload import ProgramsSpec
    from sim.config_schema import CalibrationSpec, ConfigSpec, describe
    from sim.families.helios.config import HeliosConfig
    from sim.sweep.file import SweepFile
    from sim.workloads import schema

    sections = [
        ("simulate, sweep and capacity configs (`CONFIG.yaml`)", ConfigSpec,
         "`workload` is a synthetic workload (arrival, num_requests or duration_s, "
         "prompt_tokens, output_tokens, prefix), a trace (`format`, `path`) or `programs`, "
         "below; `reasonsim simulate --help-config` prints the same lines."),
        ("synthetic workloads (`workload`)", schema.Synthetic,
         "A length is a whole number of tokens or a mapping whose `kind` is uniform, lognormal "
         "or choice; an arrival's `kind` is poisson, gamma (with `cv`) or constant."),
        *((f"`{m.__name__.lower()}` ({m.__doc__.strip()})", m, "")
          for m in (schema.Uniform, schema.Lognormal, schema.Choice, schema.Poisson,
                    schema.Gamma, schema.Constant)),
        ("trace replays (`workload.trace`)", schema.Replayed, ""),
        ("program workloads (`workload.programs`)", ProgramsSpec,
         "The policy's parameters are its type's model, below."),
        ("sweep files (`base:` and its axes)", SweepFile, ""),
        ("HELIOS configs (a `helios:` section)", HeliosConfig, ""),
        ("calibrations (`calibrate -o CAL.json`)", CalibrationSpec, ""),
    ]
    out = [CONFIG_HEADER]
    for title, model, note in sections:
        out += [f"\n## {title}\n", *([note, ""] if note else []), "```text",
                *describe(model), "```"]
        if model is ProgramsSpec:
            out += _policy_sections()
        if model is CalibrationSpec:
            out += _step_time_sections()
    return "\n".join(out) + "\n"


def _step_time_sections() -> list[str]:
    """Each step-time kind's parameters (its registered schema)."""
    from sim.config_schema import describe
    import sim.step_time.calibration  # noqa: F401  (registers every kind)
    from sim.step_time.registry import STEP_TIME_MODELS

    out = []
    for kind, cls in sorted(STEP_TIME_MODELS.items()):
        out += [f"\n### `step_time_model` of kind `{kind}` (version {cls.version})\n",
                cls.schema.__doc__.strip(), "", "```text", *describe(cls.schema), "```"]
    return out


def _policy_sections() -> list[str]:
    """Each policy type's parameters (`policies.params`), under the methods that register it."""
    from policies.registry import PARAMS
    from sim.config_schema import describe

    kinds: dict[type, list[str]] = {}
    for method, by_kind in PARAMS.items():
        for kind, model in by_kind.items():
            kinds.setdefault(model, []).append(f"{method}/{kind}")
    out = []
    for model, names in kinds.items():
        out += [f"\n### `policy` of {', '.join(names)}\n", model.__doc__.strip(), "", "```text",
                *(describe(model) or ["(no parameters)"]), "```"]
    return out


if __name__ == "__main__":
    import sys

    print(render_config() if sys.argv[1:] == ["config"] else render(), end="")

"""`docs/cli.md`: every command's help, generated from the argument parsers.

    python -m reasonsim.cli_docs > docs/cli.md

The page is the parsers' own `--help` text, command by command, so it cannot drift from the
code: `tests/test_readme.py` regenerates it and fails when the committed page differs.
"""

from __future__ import annotations

import argparse
import os

WIDTH = 100
"""the help text's line width (argparse reads it from COLUMNS), fixed so the page is stable"""

HEADER = """# Command reference

Generated from the argument parsers by `python -m reasonsim.cli_docs > docs/cli.md` (a test
fails when this page is stale). Each section is the command's `--help`.
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


if __name__ == "__main__":
    print(render(), end="")

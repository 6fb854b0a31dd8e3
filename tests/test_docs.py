"""The README and the docs pages: every relative link resolves (its file, and its heading where
it names one), every image exists, the README stays one screen per job, the commands it asks a
user to paste run `--help`, and every command any page names is one the CLI has."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_resolves(page):
    bad = []
    for target in _LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"{page.relative_to(REPO)}: links that resolve to nothing: {bad}"


def test_the_readme_is_short_and_names_the_three_jobs_and_the_families():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    head = text[:text.index("## Where it stands")]
    for words in ("Capacity planning", "Policy research", "Simulated against live",
                  "reasonsim capacity", "reasonsim sweep", "reasonsim fidelity --quick",
                  "Dynasor", "A1", "SEED", "HELIOS"):
        assert words in head, words


def test_the_readme_commands_exist():
    text = (REPO / "README.md").read_text()
    commands = set(re.findall(r"`?reasonsim ([a-z0-9]+(?: [a-z]+)?)", text))
    for command in sorted(commands):
        words = command.split()
        proc = run_cli(*words, "--help", check=False)
        if proc.returncode != 0:  # a subcommand's first word only (`reasonsim demo` in prose)
            proc = run_cli(words[0], "--help")
        assert "usage: reasonsim" in proc.stdout, command


def _subcommands(parser) -> dict:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_a_page_names_exists(page):
    """Each `reasonsim COMMAND [SUBCOMMAND]` a page asks a user to run (in backticks or at the
    start of a line) is one the parser has."""
    from reasonsim.cli import build_parser

    top = _subcommands(build_parser())
    stale = []
    for command in re.findall(r"(?:`|^\s*)reasonsim ([a-z0-9_]+)(?: ([a-z0-9_]+))?",
                              page.read_text(), flags=re.M):
        name, sub = command
        group = top.get(name)
        if group is None or (sub and _subcommands(group) and sub not in _subcommands(group)):
            stale.append(" ".join(command).strip())
    assert not stale, f"{page.relative_to(REPO)}: commands the CLI does not have: {stale}"


def _pasted_commands() -> list[list[str]]:
    """The README's simulator-only commands as a user pastes them: its code blocks' `reasonsim`
    lines (continuations joined) and the family table's commands; none needs an engine."""
    import shlex

    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    lines = [ln for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    table = re.findall(r"\| `(reasonsim [^`]+)` \|", text)
    return [shlex.split(c)[1:] for c in [*lines, *table] if c.startswith("reasonsim ")
            and "fidelity" not in c]  # the fidelity loop drives vLLM: tests/test_fidelity.py


def test_the_readme_commands_run_as_pasted(tmp_path):
    """Each simulator-only command the README asks a user to paste runs on this checkout (its
    output directory moved under tmp_path)."""
    commands = _pasted_commands()
    assert {c[0] for c in commands} >= {"capacity", "sweep", "dynasor", "a1", "seed", "helios"}
    for i, args in enumerate(commands):
        if "-o" in args:
            args = args[:args.index("-o")] + args[args.index("-o") + 2:]
        proc = run_cli(*args, "-o", str(tmp_path / str(i)), check=False)
        assert proc.returncode == 0, f"reasonsim {' '.join(args)}: {proc.stderr[-600:]}"

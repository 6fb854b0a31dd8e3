"""The README's two commands are what CI and users run: keep them true."""

import re

from conftest import REPO, run_cli


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for b in blocks for line in b.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readme_test_command_verbatim():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    test_cmd = commands[1]
    assert "pytest" in test_cmd
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci


def test_every_subcommand_has_help():
    for args in (["--help"], ["trace", "steps", "--help"], ["trace", "serve", "--help"],
                 ["trace", "probes", "--help"], ["traces", "check", "--help"],
                 ["dynasor", "offline", "--help"], ["testbed", "build", "--help"],
                 ["testbed", "eval", "--help"], ["trace", "conformity", "--help"],
                 ["a1", "offline", "--help"], ["a1", "replay", "--help"],
                 ["a1", "samples", "--help"], ["sweep", "--help"], ["capacity", "--help"]):
        proc = run_cli(*args)
        assert "usage: reasonsim" in proc.stdout


def test_traces_check_rejects_a_non_trace(tmp_path):
    proc = run_cli("traces", "check", str(tmp_path), check=False)
    assert proc.returncode == 2 and "no runs table" in proc.stderr


def test_testbed_eval_without_models_is_a_one_line_error(tmp_path):
    proc = run_cli("testbed", "eval", "--models", str(tmp_path), check=False)
    assert proc.returncode == 2 and "missing testbed model" in proc.stderr


def _generated(page: str) -> str:
    """`python -m reasonsim.cli_docs PAGE` in a fresh process, as the pages are made: this
    worker's registries may hold kinds other tests registered."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "reasonsim.cli_docs", page], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def test_the_reference_pages_are_generated_from_the_code():
    page = (REPO / "docs" / "cli.md").read_text()
    assert page == _generated("cli"), \
        "docs/cli.md is stale: python -m reasonsim.cli_docs cli > docs/cli.md"
    config = (REPO / "docs" / "config.md").read_text()
    assert config == _generated("config"), \
        "docs/config.md is stale: python -m reasonsim.cli_docs config > docs/config.md"
    assert "cluster.replicas[].kv_blocks: integer or null" in config and "deadline.base_s" in config
    for command in ("simulate", "sweep", "capacity", "validate", "fidelity", "traces seal",
                    "a1 replay", "seed replay", "helios replay", "dynasor replay"):
        assert f"## `reasonsim {command}`" in page, command


def test_every_example_says_which_machine_its_step_times_come_from():
    """An example's `# Machine:` line names the device of every calibration (or exits trace) it
    simulates with, as their provenance records it: a replay elsewhere is warned of in advance."""
    import json

    import yaml

    from traces.store import read_run

    for path in sorted((REPO / "examples").glob("*.yaml")):
        d = yaml.safe_load(path.read_text())
        seen = set()
        for g in (d.get("cluster") or {}).get("replicas") or []:
            p = json.loads((path.parent / g["calibration"]).read_text())["provenance"]
            seen.add(f"{p['device']} x{p['device_count']} ({p['engine']})")
        for m in (d.get("helios") or {}).get("models") or []:
            if "exits" in m:
                r = read_run(path.parent / m["exits"])
                seen.add(f"{r['device']} x{r['device_count']} ({r['engine']})")
        header = " ".join(line.lstrip("#").strip() for line in path.read_text().splitlines()
                          if line.startswith("#"))
        said = re.search(r"Machine: its step times were traced on (.*?); to replay", header)
        if not seen:
            assert said is None, path.name
            continue
        assert said and said.group(1) == " and ".join(sorted(seen)), path.name

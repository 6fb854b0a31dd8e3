"""Executed notebooks a user can open: each jupytext source in `notebooks/` (the reviewed form)
run top to bottom in a real Jupyter kernel and written as `NAME.ipynb` with its outputs and
plots.

    .venv/bin/python scripts/build_notebooks.py [--quick] [-o notebooks] [NAME ...]

`--quick` runs the small sweeps the test suite runs (`REASONSIM_NB_QUICK=1`); the sweeps' results
go under `reports/notebooks/` (resumable) unless `REASONSIM_NB_OUT` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO / "notebooks"


def build(source: Path, out_dir: Path, quick: bool = False, timeout_s: int = 1800) -> Path:
    """Execute one jupytext source in a fresh kernel (cwd: the checkout) and write it, with its
    outputs, as out_dir/NAME.ipynb; that path. An error in a cell raises (nbclient's)."""
    import jupytext
    from nbclient import NotebookClient

    # the inline backend puts each figure in the notebook as a PNG
    env = {"REASONSIM_REPO": str(REPO),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           **({"REASONSIM_NB_QUICK": "1"} if quick else {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nb = jupytext.read(source)
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{source.stem}.ipynb"
    jupytext.write(nb, path, fmt="ipynb")
    return path


def main() -> int:
    """Build the named notebooks (default: all) and say where each went."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook names (default: every source)")
    ap.add_argument("-o", "--out", type=Path, default=SOURCES, help="where the .ipynb files go")
    ap.add_argument("--quick", action="store_true", help="the test suite's small sweeps")
    args = ap.parse_args()
    sources = sorted(SOURCES.glob("*.py"))
    unknown = set(args.names) - {s.stem for s in sources}
    if unknown:
        print(f"build_notebooks: no notebook {sorted(unknown)}; have "
              f"{[s.stem for s in sources]}", file=sys.stderr)
        return 2
    for source in sources:
        if args.names and source.stem not in args.names:
            continue
        t0 = time.perf_counter()
        path = build(source, args.out, args.quick)
        print(f"{path} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

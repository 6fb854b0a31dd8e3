"""What compiling the programs' Python side buys: a checkout with its driver and programs built by
mypyc (or Cython) beside the same checkout as Python, every family timed side by side.

    python benchmarks/compiled_python.py --compiler mypyc --rounds 5

Makes two detached worktrees of HEAD under `--dir` (default /tmp/compiled-python, removed after
the timing): `python` as it is, and `compiled` with `--modules` built in place (their extension
modules shadow the sources there). mypy (for mypyc) or Cython is installed into `--dir`/tools
from the package registry unless it imports already. It then checks that each family's run gives
the same summary at both (every figure but the run's own timings), and runs `families_ab.py
python compiled` twice: the programs' decisions alone (`--decisions`, what the compiled modules
run) and the whole compiled runs. The modules are the Python a request of the reasoning programs
passes through besides the kernel: the driver, the Dynasor programs and the scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = ["sim/workloads/program_driver.py", "programs/reasoning.py", "programs/base.py",
           "policies/scheduling.py"]
"""the programs' side of a Dynasor request: driver, programs, their protocol, the scheduler"""

BUILD = """
import sys
from setuptools import setup
mods = {modules!r}
if {compiler!r} == "mypyc":
    from mypyc.build import mypycify
    ext = mypycify(["--ignore-missing-imports", "--follow-imports=silent",
                    "--check-untyped-defs"] + mods, opt_level="3")
else:
    from Cython.Build import cythonize
    ext = cythonize(mods, language_level=3, quiet=True)
setup(name="compiled-python", ext_modules=ext, script_args=["build_ext", "--inplace", "-q"])
"""

SUMMARY = """
import json, sys
sys.path[:0] = [{root!r} + "/benchmarks", {root!r}]
from family_speed import FAMILIES, program_config
from sim.simulate import simulate
import sim.workloads.program_driver as driver
TIMED = {{"wall_s", "event_loop_s", "sim_speedup"}}
out = {{"driver": driver.__file__}}
for fam in {families!r}:
    ex, n, replicas = FAMILIES[fam]
    s = simulate(program_config(ex, n, replicas)).summary
    out[fam] = {{k: v for k, v in s.items() if k not in TIMED}}
print(json.dumps(out, default=str))
"""


def tools(where: Path, compiler: str) -> str:
    """A PYTHONPATH where the compiler imports (installed under `where` if it does not)."""
    name = "mypyc" if compiler == "mypyc" else "Cython"
    if subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode:
        package = "mypy" if compiler == "mypyc" else "cython"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(where),
                        package], check=True, capture_output=True)
        return str(where)
    return ""


def worktree(path: Path) -> Path:
    """A detached worktree of HEAD at `path` (made again if it is there)."""
    if path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                       check=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(path),
                    "HEAD"], check=True)
    return path


def build(root: Path, modules: list[str], compiler: str, env: dict) -> None:
    """Build `modules` in place at checkout `root`."""
    done = subprocess.run([sys.executable, "-c", BUILD.format(modules=modules,
                                                             compiler=compiler)],
                          cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{compiler} failed at {root}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def summaries(root: Path, families: list[str], env: dict) -> dict:
    """Each family's run summary at checkout `root` (its timings dropped)."""
    code = SUMMARY.format(root=str(root), families=families)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Build, check the runs equal, time both checkouts side by side."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compiler", choices=("mypyc", "cython"), default="mypyc")
    ap.add_argument("--modules", default=",".join(MODULES))
    ap.add_argument("--families", default="cot,sc,mcts,rebase,a1,seed")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/compiled-python"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    path = tools(args.dir / "tools", args.compiler)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    python, compiled = worktree(args.dir / "python"), worktree(args.dir / "compiled")
    build(compiled, args.modules.split(","), args.compiler, env)
    families = args.families.split(",")
    a, b = summaries(python, families, env), summaries(compiled, families, env)
    print(f"driver: {a.pop('driver')} | {b.pop('driver')}")
    for fam in families:
        differ = sorted(k for k in a[fam].keys() | b[fam].keys() if a[fam].get(k) != b[fam].get(k))
        print(f"{fam}: " + (f"the summaries differ in {differ}" if differ else
                            "the same summary at both"))
    for flag in ("--decisions", None):
        print("decisions alone" if flag else "whole runs, compiled kernel", flush=True)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "families_ab.py"),
                        str(python), str(compiled), "--families", args.families,
                        "--rounds", str(args.rounds)] + ([flag] if flag else []),
                       env=env, check=True)
    for root in (python, compiled):  # the repository keeps no worktree of a benchmark's
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(root)],
                       check=True)


if __name__ == "__main__":
    main()

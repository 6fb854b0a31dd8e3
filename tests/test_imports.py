import subprocess
import sys

from conftest import REPO


def test_simulator_packages_load_no_engine():
    code = ("import sys, sim, policies, traces, programs; "
            "import sim.simulate, sim.workloads.programs, programs.reasoning, programs.search; "
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"engine modules loaded by import sim, policies, traces, programs: {proc.stdout}"


def test_cli_help_loads_no_engine():
    code = ("import sys; from reasonsim.cli import build_parser; build_parser(); "
            "sys.exit(1 if 'vllm' in sys.modules or 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ------------------------------------------------------------------ import rules, parsed
OURS = ("inputs", "policies", "programs", "traces", "sim", "engines", "testbed", "live", "tracers",
        "validation", "reasonsim")
ENGINES = ("torch", "vllm", "transformers", "safetensors")
# package -> packages (ours or third-party) it must never import, at top level or in a function
FORBIDDEN = {
    # the input layer (strict models, caps) lies beneath every package
    "inputs": set(OURS) - {"inputs"} | set(ENGINES) | {"simpy", "numpy"},
    "policies": set(OURS) - {"inputs"} | set(ENGINES) | {"simpy", "time"},
    "programs": set(OURS) - {"inputs", "policies", "traces", "programs"} | set(ENGINES) | {"simpy"},
    "traces": set(OURS) - {"inputs", "traces"} | set(ENGINES),
    "sim": {"engines", "testbed", "live", "tracers", "validation", "reasonsim"} | set(ENGINES),
    # engines lie beneath both the tracers and the live runner, which never import each other
    "engines": {"sim", "testbed", "live", "tracers", "validation", "reasonsim"},
    "testbed": {"sim", "engines", "live", "tracers", "validation", "reasonsim"},
    "live": {"sim", "tracers", "validation", "reasonsim"},
    "tracers": {"sim", "live", "validation", "reasonsim"},
    # validation (sim against live) lies above the simulator, the tracers and the live runner,
    # beneath the command line
    "validation": {"reasonsim"},
}
# Layers inside sim: a module under a prefix never imports the modules under the listed ones.
# Step time is priced beneath the engine, the engine beneath its compiled mirrors, the core
# beneath the method families and the entry points (simulate, validate, sweeps, reports).
_ENTRY = ("sim.simulate", "sim.output", "sim.demo", "sim.bands", "sim.sweep", "sim.report")
SIM_LAYERS = {
    "sim.step_time": ("sim.engine", "sim.kernels", "sim.workloads", "sim.families") + _ENTRY,
    "sim.engine": ("sim.kernels", "sim.workloads", "sim.families") + _ENTRY,
    "sim.kernels": ("sim.families",) + _ENTRY,
}


def _layer_violation(mod: str, imp: str) -> bool:
    """`mod` reaches above its layer in sim, or into a family other than its own: the families
    are found through `sim.families.registry` only."""
    for low, high in SIM_LAYERS.items():
        if _under(mod, low) and any(_under(imp, h) for h in high):
            return True
    if not _under(imp, "sim.families") or _under(imp, "sim.families.registry"):
        return False
    family = imp.split(".")[:3]
    return len(family) == 3 and mod.split(".")[:3] != family


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _module_name(root, path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root, path) -> list[str]:
    """Every module a file imports, anywhere in it (function bodies included)."""
    import ast

    name = _module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod where one exists.
            found += [base] + [f"{base}.{a.name}" for a in node.names]
    return found


def import_violations(root) -> list[str]:
    """Forbidden directions and import circles among our modules under `root`."""
    from pathlib import Path

    root = Path(root)
    files = [p for pkg in OURS if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    modules = {_module_name(root, p): p for p in files}
    problems, graph = [], {}
    for mod, path in modules.items():
        top = mod.split(".")[0]
        graph[mod] = set()
        for imp in _imports(root, path):
            if imp.split(".")[0] in FORBIDDEN.get(top, ()) and imp.split(".")[0] != top:
                problems.append(f"{mod} imports {imp}")
            elif top == "sim" and imp in modules and _layer_violation(mod, imp):
                problems.append(f"{mod} imports {imp}")
            if imp in modules and imp != mod:
                graph[mod].add(imp)
    # Circles: a module reachable from itself (packages' __init__ count as modules).
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                problems.append("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return sorted(set(problems))


def test_import_rules_hold():
    assert import_violations(REPO) == []


def test_import_rules_catch_planted_violations(tmp_path):
    import shutil

    for pkg in OURS:
        if (REPO / pkg).is_dir():
            shutil.copytree(REPO / pkg, tmp_path / pkg)
    assert import_violations(tmp_path) == []
    (tmp_path / "policies" / "planted.py").write_text("def f():\n    import torch\n")
    (tmp_path / "sim" / "planted.py").write_text("from tracers import exits\n")
    (tmp_path / "tracers" / "planted_live.py").write_text("def f():\n    from live import runner\n")
    (tmp_path / "live" / "planted.py").write_text("from tracers.exits import trace_exits\n")
    (tmp_path / "engines" / "planted.py").write_text("import live.runner\n")
    (tmp_path / "tracers" / "planted.py").write_text("import sim.engine.cluster\n")
    (tmp_path / "sim" / "engine" / "planted.py").write_text("from sim.families.a1 import driver\n")
    (tmp_path / "sim" / "step_time" / "planted.py").write_text("import sim.engine.replica\n")
    (tmp_path / "sim" / "workloads" / "planted.py").write_text("import sim.families.seed.driver\n")
    (tmp_path / "sim" / "families" / "a1" / "planted.py").write_text(
        "def f():\n    from sim.families.seed.driver import tot_results\n")
    (tmp_path / "sim" / "families" / "seed" / "planted.py").write_text(
        "from validation.judge import judge\n")
    (tmp_path / "validation" / "planted.py").write_text("from reasonsim.common import REPO\n")
    (tmp_path / "traces" / "a.py").write_text("from . import b\n")
    (tmp_path / "traces" / "b.py").write_text("def f():\n    from traces import a\n")
    found = import_violations(tmp_path)
    assert "policies.planted imports torch" in found
    assert "sim.planted imports tracers" in found
    assert "tracers.planted_live imports live" in found
    assert "live.planted imports tracers.exits" in found
    assert "engines.planted imports live.runner" in found
    assert "tracers.planted imports sim.engine.cluster" in found
    assert "import circle: traces.a -> traces.b -> traces.a" in found
    assert "sim.engine.planted imports sim.families.a1.driver" in found
    assert "sim.step_time.planted imports sim.engine.replica" in found
    assert "sim.families.a1.planted imports sim.families.seed.driver" in found
    assert "sim.workloads.planted imports sim.families.seed.driver" in found
    assert "sim.families.seed.planted imports validation.judge" in found
    assert "validation.planted imports reasonsim.common" in found


# ------------------------------------------------------------------ timed loops
TIMED_LOOPS = {"tracers/replay.py": "_serve", "tracers/torch_replay.py": "_serve"}
"""the live request replays' loops that run on the run's clock (after its t0)"""


def test_the_live_replays_timed_loops_import_nothing():
    """A module's first import inside a timed loop is time the run charges to its first
    requests: `rich.progress` there (15-35 ms) held every replay's first step 18 ms past a
    burst at t=0 (docs/measurements/2026-12-06-replay-start.md)."""
    import ast

    for path, name in TIMED_LOOPS.items():
        tree = ast.parse((REPO / path).read_text())
        loop = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        imports = [ast.unparse(n) for n in ast.walk(loop)
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not imports, (path, name, imports)

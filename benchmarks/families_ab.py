"""Every program family's example, compiled, at two checkouts side by side.

    git worktree add /tmp/base HEAD~1
    python benchmarks/families_ab.py /tmp/base . --rounds 3

Each round runs one process per checkout, alternately (base first), each timing every family of
`family_speed.FAMILIES` compiled (`simulate`, CPU seconds, median of `--repeats` after a warm-up
run; `--decisions`: the programs' decisions alone, `program_decisions.decisions_alone`); the
table gives each checkout's simulated requests per CPU-second (median of the rounds, min-max)
and their ratio. A shared machine's drift lands on both checkouts alike. `--parts`: each
family's CPU seconds per run beside two parts of it, the bank's load (`load_bank`) and the
family's results tables (`SimFamily.results`), whose work does not depend on the interleaving:
where a whole run's ratio drowns in the machine's noise, its parts' ratios show what changed.
`--scheduler fcfs`: every example under that inter-program scheduler instead of its own.
`--other-kind`: every example with its calibrations' step-time model of the other kind
(`family_speed._other_kind`: linear <-> serving, fitted on the shipped steps). `--scale 2`: twice
each example's programs (its fixed costs, the trace's load and per-question records, weigh
less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import gc, json, statistics, sys, time
from dataclasses import replace
sys.path[:0] = [{root!r} + "/benchmarks", {root!r}]
from family_speed import FAMILIES, program_config
from program_decisions import decisions_alone
import programs.workload as workload
from programs.workload import load_bank
from sim.simulate import simulate
import sim.workloads.programs as harness
# a whole run loads its trace, as a process's first does (a checkout that keeps banks forgets)
forget = getattr(workload, "forget_banks", lambda: None)
out, spent = {{}}, []
if {parts!r}:  # each family's results tables timed inside the run
    found = harness.sim_family
    def timed(name):
        family = found(name)
        def results(*a):
            t0 = time.process_time()
            done = family.results(*a)
            spent.append(time.process_time() - t0)
            return done
        return family if family.results is None else replace(family, results=results)
    harness.sim_family = timed
for fam in {families!r}:
    ex, n, replicas = FAMILIES[fam]
    cfg = program_config(ex, n * {scale}, replicas, other_kind={other!r})
    if {scheduler!r}:  # another inter-program scheduler than the example's
        cfg = replace(cfg, scheduler={scheduler!r})
    if {decisions!r}:
        out[fam] = statistics.median(decisions_alone(cfg)["requests_per_cpu_s"]
                                     for _ in range({repeats}))
        continue
    res = simulate(cfg)  # the kernel's and the trace's first load, not timed
    cpu = []
    for _ in range({repeats}):
        gc.collect()
        forget()
        t0 = time.process_time()
        res = simulate(cfg)
        cpu.append(time.process_time() - t0)
    out[fam] = res.summary["requests"] / statistics.median(cpu)
    if {parts!r}:
        load = []
        for _ in range({repeats}):
            forget()
            t0 = time.process_time()
            load_bank(cfg.programs)
            load.append(time.process_time() - t0)
        out[fam] = [statistics.median(cpu), statistics.median(load),
                    statistics.median(spent[-{repeats}:]) if spent else 0.0]
        spent.clear()
print(json.dumps(out))
"""


def measure(root: Path, families: list[str], repeats: int, decisions: bool = False,
            parts: bool = False, scheduler: str | None = None, other: bool = False,
            scale: int = 1) -> dict:
    """Simulated requests per CPU-second of each family at checkout `root`, in a fresh process
    (`decisions`: of its decisions alone; `parts`: CPU seconds of a run, of the bank's load
    and of the results tables; `scheduler`: under that inter-program scheduler; `other`: at
    the other step-time model kind; `scale`: times the example's programs)."""
    code = CHILD.format(root=str(root.resolve()), families=families, repeats=repeats,
                        decisions=decisions, parts=parts, scheduler=scheduler, other=other,
                        scale=scale)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Alternate the two checkouts `--rounds` times; print each family's rates and ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=Path("."))
    ap.add_argument("--families", default="cot,sc,mcts,rebase,a1,seed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decisions", action="store_true",
                    help="time the programs' decisions alone (instant replicas), not the run")
    ap.add_argument("--parts", action="store_true",
                    help="CPU seconds of a run beside its bank's load and its results tables")
    ap.add_argument("--scheduler", help="every example under this inter-program scheduler "
                    "(fcfs, lpm, app_fifo, dynasor, ...) instead of its own")
    ap.add_argument("--other-kind", action="store_true",
                    help="every example's calibrations at the other step-time model kind")
    ap.add_argument("--scale", type=int, default=1, help="times each example's programs")
    args = ap.parse_args()
    families = args.families.split(",")
    rates: dict = {(f, who): [] for f in families for who in ("base", "new")}
    for _ in range(args.rounds):
        for who, root in (("base", args.base), ("new", args.new)):
            for fam, rate in measure(root, families, args.repeats, args.decisions,
                                     args.parts, args.scheduler, args.other_kind,
                                     args.scale).items():
                rates[(fam, who)].append(rate)
    if args.parts:
        print_parts(families, rates)
        return
    print(f"{'family':8} {'base req/CPU-s (min-max)':>28} {'new req/CPU-s (min-max)':>28} ratio")
    for fam in families:
        b, n = rates[(fam, "base")], rates[(fam, "new")]
        print(f"{fam:8} {statistics.median(b):>10,.0f} ({min(b):,.0f}-{max(b):,.0f})"
              f"{'':>4} {statistics.median(n):>10,.0f} ({min(n):,.0f}-{max(n):,.0f})"
              f"{'':>4} {statistics.median(n) / statistics.median(b):.2f}x")


def print_parts(families: list[str], rates: dict) -> None:
    """Per family and part, each checkout's CPU seconds (median of the rounds) and new/base."""
    print(f"{'family':8} {'part':8} {'base CPU-s (min-max)':>24} {'new CPU-s (min-max)':>24} "
          "new/base")
    for fam in families:
        for i, part in enumerate(("run", "load", "results")):
            b = [r[i] for r in rates[(fam, "base")]]
            n = [r[i] for r in rates[(fam, "new")]]
            ratio = statistics.median(n) / statistics.median(b) if statistics.median(b) else 0.0
            print(f"{fam:8} {part:8} {statistics.median(b):>9.3f} ({min(b):.3f}-{max(b):.3f})"
                  f"{'':>2} {statistics.median(n):>9.3f} ({min(n):.3f}-{max(n):.3f})"
                  f"{'':>2} {ratio:.2f}")


if __name__ == "__main__":
    main()

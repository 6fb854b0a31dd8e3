"""The floor under any program kernel: a program workload's Python side alone.

    python benchmarks/program_decisions.py examples/a1-async-separate.yaml --count 300

Runs the config's programs through the simulator's own driver (`ProgramDriver`, or
`TemplateDriver` where the family's programs send from templates, as the simulator does), oracle
and arrival process on replicas that finish every request the moment it is sent, in send order
(`InstantCluster`): no steps, no queues, no kernel. What it costs per request is what the
programs' decisions, the trace's outcomes and the driver's bookkeeping cost, so no faster
replica (compiled or not) can make a run of the same programs go faster than this. The
instant replicas change the programs' interleaving (each runs nearly alone), so a run sends
about, not exactly, the requests the simulated run does; the rate is per request it sent.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from policies.scheduling import make_scheduler  # noqa: E402
from programs.families import family_of  # noqa: E402
from programs.workload import draw_seed, load_bank, plan_programs  # noqa: E402
from sim.engine.cluster import Cluster, build_replicas, gc_paused  # noqa: E402
from sim.families.registry import sim_family  # noqa: E402
from sim.kernels.programs import KernelEnv  # noqa: E402
from sim.workloads.program_driver import ProgramDriver  # noqa: E402
from sim.workloads.program_templates import TemplateDriver  # noqa: E402
from sim.workloads.programs import arrivals, unbooker  # noqa: E402


class InstantCluster(Cluster):
    """Replicas that finish each request, with its traced output, the moment every request
    sent before it has finished; the routers and pools are `Cluster`'s."""

    def __init__(self, cfg, specs: list):
        # not Cluster.__init__: no SimPy environment or replicas, only its routing
        self.specs, self.env, self.kv_eviction = specs, KernelEnv(), cfg.kv_eviction
        self._routing(cfg, specs)
        self.on_done = None           # the driver's on_request_done
        self._queue: deque = deque()  # request idx in send order
        self._output: dict = {}       # idx -> its tokens, while not finished nor aborted

    def send(self, rid: int, sent, chain=None) -> int:
        """Queue the request; its idx is the handle."""
        self._queue.append(sent[0])
        self._output[sent[0]] = sent[2]
        return sent[0]

    def cancel(self, rid: int, idx: int) -> None:
        """Abort a queued request at once (nothing generated); a no-op once it finished."""
        if self._output.pop(idx, None) is not None:
            self.on_done(idx, 0, True)

    def demote(self, rid: int, owned) -> None:
        """No cache to reorder."""

    def run(self, process) -> None:
        """Each arrival, then every request it leads to, then the clock moves to the next."""
        queue, output, env = self._queue, self._output, self.env
        with gc_paused():
            for gap in process:
                self._drain(queue, output)
                env.now += gap
            self._drain(queue, output)

    def _drain(self, queue: deque, output: dict) -> None:
        while queue:
            idx = queue.popleft()
            tokens = output.pop(idx, None)
            if tokens is not None:
                self.on_done(idx, tokens, False)


def decisions_alone(cfg) -> dict:
    """The config's programs on instant replicas: requests sent, the run's CPU seconds (the
    bank's load and the programs' set-up apart) and each program's answer."""
    wl = cfg.programs
    family = sim_family(family_of(wl.method, wl.policy).name)
    bank = load_bank(wl)
    plans = plan_programs(wl, bank, draw_seed(cfg.seed, sum(g.count for g in cfg.replicas)))
    runs, _capacity, oracle = family.build_runs(wl, bank, plans)
    cluster = InstantCluster(cfg, build_replicas(cfg))

    driver = (TemplateDriver if family.templated else ProgramDriver)(
        cluster, oracle, make_scheduler(cfg.scheduler), unbooker(cluster))
    cluster.on_done = driver.on_request_done
    gc.collect()
    t0 = time.process_time()
    cluster.run(arrivals(runs, driver, cluster.env))
    cpu_s = time.process_time() - t0
    unfinished = sum(run.finish_s != run.finish_s or run.open > 0 for run in runs)
    if unfinished:
        raise RuntimeError(f"{unfinished} programs did not finish on instant replicas")
    return {"requests": len(driver.owner), "cpu_s": cpu_s,
            "requests_per_cpu_s": len(driver.owner) / cpu_s,
            "answers": [run.program.answer for run in runs]}


def main() -> None:
    """Time one config's programs on instant replicas, `--repeats` times (median)."""
    from sim.config import parse_config, read_yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--count", type=int, help="override the number of programs")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = read_yaml(Path(args.config))
    if args.count:
        d["workload"]["programs"]["count"] = args.count
    cfg = parse_config(d, Path(args.config).resolve().parent)
    runs = [decisions_alone(cfg) for _ in range(args.repeats)]
    rates = [r["requests_per_cpu_s"] for r in runs]
    print(json.dumps({"requests": runs[0]["requests"],
                      "requests_per_cpu_s": statistics.median(rates),
                      "min": min(rates), "max": max(rates)}))


if __name__ == "__main__":
    main()

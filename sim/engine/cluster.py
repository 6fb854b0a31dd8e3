"""The SimPy cluster: replicas built from a config, a router over them, their load view.

`Cluster` is the harness every simulation shares (plain request workloads in `sim.simulate`,
program workloads in `sim.workloads.programs`): one environment, one replica per configured slot
with its own seeded latency noise, a router, and the per-replica load arrays the router reads.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from functools import partial
from pathlib import Path

import numpy as np
import simpy

from policies.routing import ClusterView, RequestView, make_router
from sim.step_time.calibration import Calibration, load_calibration
from sim.config import SimConfig, kv_blocks_from_memory, serving_pool
from sim.engine.lazy_replica import LazyReplica
from sim.engine.replica import Replica, ReplicaConfig
from sim.engine.replica_kinds import OWN, replica_factory
from sim.engine.request_state import Req, Results, Sent


def build_replicas(cfg: SimConfig) -> list[tuple[Calibration, ReplicaConfig]]:
    """(calibration, replica config) for every replica, in replica-id order (groups in order)."""
    out = []
    cache: dict[Path, Calibration] = {}
    for gi, g in enumerate(cfg.replicas):
        cal = cache.get(g.calibration) or load_calibration(g.calibration)
        cache[g.calibration] = cal
        block = g.block_size or cal.block_size
        kv = g.kv_blocks or cal.kv_blocks_total * cal.block_size // block
        if g.memory_gb is not None:
            kv = kv_blocks_from_memory(g.model_config, g.memory_gb, block,
                                       g.gpu_memory_utilization)
        try:  # limits derived from the calibration (KV blocks at another block size) too
            rc = ReplicaConfig(max_num_seqs=g.max_num_seqs or cal.max_num_seqs,
                               spec=speculative(g, cal, cfg.base_dir),
                               max_num_batched_tokens=g.max_num_batched_tokens
                               or cal.max_num_batched_tokens,
                               block_size=block, kv_blocks=kv,
                               enable_prefix_caching=g.enable_prefix_caching,
                               priority_scheduling=cfg.scheduler != "fcfs",
                               scheduler=g.scheduler)
        except ValueError as e:
            raise ValueError(f"cluster.replicas[{gi}] (block_size {block}, kv_blocks {kv}): "
                             f"{e}") from None
        if g.scheduler != OWN and rc.spec is not None:
            raise ValueError(f"cluster.replicas[{gi}]: scheduler {g.scheduler!r} does not run "
                             f"speculative decoding")
        out.extend([(cal, rc)] * g.count)
    return out


def noise_seeds(cfg: SimConfig, replicas: int) -> list[np.random.SeedSequence]:
    """The seed of each replica's latency noise (then one more): one generator for the run, split
    per purpose so adding noise never shifts routing; `noise_seed` redraws the noise alone."""
    seeds = np.random.SeedSequence(cfg.seed).spawn(replicas + 1)
    if cfg.noise_seed is not None:  # other latency noise, same routing
        seeds[:replicas] = np.random.SeedSequence([cfg.seed, cfg.noise_seed]).spawn(replicas)
    return seeds


def speculative(g, cal: Calibration, base_dir: Path):
    """A group's speculative decoding, checked against what its calibration was fitted on."""
    from sim.engine.spec_decode import parse

    k = (cal.provenance.get("speculative") or {}).get("k")
    if g.speculative is not None and k is None:
        raise ValueError(f"{g.calibration}: fitted on plain decode steps; a speculative group "
                         "needs a calibration of spec-decoding steps (reasonsim calibrate "
                         "SPEC_TRACE --spec-k K)")
    if g.speculative is None and k is not None:
        raise ValueError(f"{g.calibration}: fitted on speculative steps (K = {k}); its group "
                         "needs speculative: {acceptance_rates: [...]} or {acceptance_trace: "
                         "DIR}")
    return None if k is None else parse(g.speculative, int(k), base_dir)


class Device:
    """A device several replicas share: one iteration at a time, the replicas taking turns in
    the order they asked, as the live runner steps in-process engines from one loop. A replica
    holds the device from composing an iteration until that iteration's callbacks are done, so
    what they submit to another replica of the device joins that replica's next iteration
    whole (composed when its turn comes, not when it first asked)."""

    __slots__ = ("busy_until", "holder", "waiting", "added")

    def __init__(self):
        self.busy_until = 0.0
        self.added = False  # a request added since the last step (the next costs less)
        self.holder = None
        self.waiting: deque = deque()

    def take(self, replica) -> bool:
        """True: the device is `replica`'s now; False: it is queued for its turn."""
        if (self.holder is not None and self.holder is not replica) or \
                (self.waiting and self.waiting[0] is not replica):
            if replica not in self.waiting:
                self.waiting.append(replica)
            return False
        if self.waiting:
            self.waiting.popleft()
        self.holder = replica
        return True

    def add(self, now_s: float, first_s: float, more_s: float) -> None:
        """A request added to a replica of the device: the loop's next step waits for it (a
        second one since the last step for less)."""
        self.busy_until = max(self.busy_until, now_s) + (more_s if self.added else first_s)
        self.added = True

    def release(self):
        """Free the device; the replica whose turn is next, if any."""
        self.holder = None
        return self.waiting[0] if self.waiting else None


class Cluster:
    """The replicas of a config in one SimPy environment, with a router and the load it reads.

    Replica groups serve model pools (`ReplicaGroup.pool`); a request goes to the pool its role
    names, then to a replica of that pool by the pool's own router. With a single pool every
    request goes to it. `on_finish(replica_id, req)` is called for every finished or aborted
    request; callers keep `outstanding` and `in_flight` (per replica) up to date as their unit of
    work (a request, a program) is routed and finishes.
    """

    def __init__(self, cfg: SimConfig, capacity: int, on_finish, fast_forward: bool = True,
                 lazy: bool = True, specs: list | None = None):
        self.wall0 = time.perf_counter()
        specs = specs if specs is not None else build_replicas(cfg)  # given: loaded already
        self.specs = specs
        self.env = simpy.Environment()
        self.res = Results(capacity)  # `send` grows it past `capacity`
        self.seeds = noise_seeds(cfg, len(specs))
        devices: dict[tuple, Device] = {}
        device_of = [None if g.device is None else devices.setdefault((g.device, j), Device())
                     for g in cfg.replicas for j in range(g.count)]
        # the fast path where it applies (`sim.engine.lazy_replica`), else the reference
        own = LazyReplica if fast_forward and lazy else Replica
        self.replicas = [
            (own if rc.scheduler == OWN else replica_factory(rc.scheduler))(
                self.env, i, cal, rc, self.res,
                np.random.default_rng(self.seeds[i]) if cfg.latency == "sampled" else None,
                on_finish=partial(self._finished, on_finish, i), fast_forward=fast_forward,
                device=device_of[i], spec_rng=np.random.default_rng(
                    np.random.SeedSequence([cfg.seed, 1, i])) if rc.spec else None)
            for i, (cal, rc) in enumerate(specs)]
        self._routing(cfg, specs)
        self.kv_eviction = cfg.kv_eviction
        self.loop_s = 0.0

    def _finished(self, on_finish, rid: int, r: Req) -> None:
        """A replica's request ended. One that read cached positions it needed log-probabilities
        of runs again, reading no cache, as the live engine re-runs it (`engines.live_engine`), and
        only its second run ends it for the caller."""
        if r.rescore and not r.aborted:
            r.rerun_uncached()
            self.res.rescored[r.idx] = True
            self.replicas[rid].submit(r)
            return
        on_finish(rid, r)

    def _routing(self, cfg: SimConfig, specs: list) -> None:
        """The pools, their routers and the load arrays they read."""
        self.outstanding = np.zeros(len(specs), dtype=np.int64)
        self.in_flight = np.zeros(len(specs), dtype=np.int64)
        pool_of = [g.pool for g in cfg.replicas for _ in range(g.count)]
        self.pools = {name: np.array([i for i, p in enumerate(pool_of) if p == name])
                      for name in dict.fromkeys(pool_of)}
        self.routers = {name: make_router(cfg.router) for name in self.pools}
        self.view = ClusterView(outstanding_tokens=self.outstanding, num_requests=self.in_flight)

    def pool_for(self, role: str) -> str:
        """The pool serving requests of a model role (the only pool serves the target role,
        whatever its name but another role's; another role needs a pool of its own name)."""
        return serving_pool(self.pools, role)

    def route(self, request: RequestView, tokens: int, role: str = "target") -> int:
        """The replica the pool's router picks for a unit of `tokens` outstanding tokens; books
        it."""
        pool = self.pool_for(role)
        members = self.pools[pool]
        if len(self.pools) == 1:  # the whole cluster: no per-request copies on the hot path
            view = self.view
        else:
            view = ClusterView(self.outstanding[members], self.in_flight[members])
        local = self.routers[pool].route(request, view)
        if not 0 <= local < len(members):
            raise ValueError(f"router returned replica {local}; pool {pool!r} has "
                             f"{len(members)}")
        rid = int(members[local])
        self.outstanding[rid] += tokens
        self.in_flight[rid] += 1
        return rid

    def send(self, rid: int, sent: Sent, chain: tuple | None = None) -> Req:
        """A driver's request arrives at replica `rid`; the handle `cancel` takes."""
        res, i = self.res, sent.idx
        if i >= len(res.arrival_s):
            res.grow(i)
        res.arrival_s[i], res.prompt_tokens[i], res.replica_id[i] = self.env.now, sent.prompt, rid
        res.priority[i] = min(max(sent.priority, -2**31), 2**31 - 1)
        r = sent.req(chain)
        self.replicas[rid].submit(r)
        return r

    def cancel(self, rid: int, handle: Req) -> None:
        """Abort a request `send` returned (at the replica's next iteration boundary)."""
        self.replicas[rid].abort(handle)

    def demote(self, rid: int, owned) -> None:
        """Replica `rid` evicts the cached blocks `owned(key)` picks before the others."""
        self.replicas[rid].prefix_cache.demote(owned)

    def run(self, process) -> None:
        """Run the environment with the arrival process until no event is left."""
        self.env.process(process)
        loop0 = time.perf_counter()
        with gc_paused():
            self.env.run()
        self.loop_s = time.perf_counter() - loop0

    def close(self) -> None:
        """Break the cycle a run leaves (replica -> on_finish -> the caller's state -> this
        cluster), so reference counting frees the run at once: left to the cyclic collector,
        its first pass after `gc_paused` scans every object the run allocated (1.2 s of a 9 s
        run of 20,000 programs)."""
        for r in self.replicas:
            r.on_finish = None

    def summary(self, events: int, makespan_s: float) -> dict:
        """Run-level figures every simulation reports."""
        return run_summary(self.res, np.array([r.busy_s for r in self.replicas]), self.wall0,
                           self.loop_s, events, makespan_s)


def run_summary(res: Results, busy_s: np.ndarray, wall0: float, loop_s: float, events: int,
                makespan_s: float) -> dict:
    """Run-level figures every simulation reports (SimPy or compiled)."""
    return {"wall_s": round(time.perf_counter() - wall0, 4),
            "event_loop_s": round(loop_s, 4), "events": int(events),
            "iterations": res.run_totals()[0], "replicas": len(busy_s),
            "utilization": float(busy_s.mean() / (makespan_s or 1.0)),
            "preemptions": int(res.preemptions.sum()) if res.folded is None
            else res.folded.preemptions}


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector for the block (re-entrant)."""
    # A run allocates millions of long-lived, acyclic objects (requests, events, records, the
    # programs' plans before the run) that the cyclic collector would rescan again and again
    # (+20% CPU at 300k requests, +15% at 100k programs); reference counting frees them all,
    # and any cycle is collected once it is back on.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()

"""Run a sweep's missing points on a local process pool or on Ray, and collect its table.

Workers write their own point files (`sim.sweep.store`), so the driver holds no result that a
kill could lose. The pool restarts itself when a worker dies (the points that worker held are
run again); Ray re-runs a task whose worker died (`max_retries`). Both compute each point with
`compute_point`, so they produce the same rows.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pandas as pd

import sim.sweep.store as store
from sim.sweep.spec import Point, Sweep

POOL_RESTARTS = 3  # a worker killed this many times over means something kills every worker


def compute_point(point_id: str, seed: int, config: dict, base_dir: str, out_dir: str) -> str:
    """Simulate one point and write its rows (one; a family section's: one per policy); returns
    the point's file name."""
    from sim.families.registry import section_of

    section = section_of(config)
    rows = _simulate_point(point_id, config, base_dir) if section is None else \
        _section_rows(section, point_id, config, base_dir)
    path = store.point_path(Path(out_dir), point_id, seed)
    store.write_point(path, rows)
    return path.name


def _section_rows(section, point_id: str, config: dict, base_dir: str) -> list[dict]:
    """A family section's point: a row per policy, every policy over the same stream."""
    exp = section.load(config, Path(base_dir))
    inputs = json.dumps({"devices": exp.devices()}, sort_keys=True)
    return [{"point_id": point_id, "calibration": inputs, "policy": name,
             **store.flatten(result.summary())} for name, result in exp.simulate().items()]


def _simulate_point(point_id: str, config: dict, base_dir: str) -> list[dict]:
    """A simulate config's point: its one row."""
    from sim.step_time.calibration import fingerprint, load_calibration
    from sim.config import parse_config
    from sim.simulate import simulate
    from sim.sweep.spec import file_digest

    cfg = parse_config({**config, "output": {"steps": False}}, base_dir)
    result = simulate(cfg)
    cals = []
    for g in cfg.replicas:
        cal = load_calibration(g.calibration)
        cals.append({"pool": g.pool, "calibration": g.calibration.name,
                     "sha256": file_digest(g.calibration),
                     **fingerprint(cal.provenance)})
    row = {"point_id": point_id, "calibration": json.dumps(cals, sort_keys=True),
           **store.flatten(result.summary)}
    if result.programs is not None and len(result.programs):
        row["policy"] = result.programs["policy"][0].as_py()  # the programs' stop policy
    return [row]


def run_sweep(sweep: Sweep, out_dir: str | Path, backend: "Backend | None" = None,
              progress: bool = False, shared: bool = False) -> pd.DataFrame:
    """Compute the sweep's missing points, then write and return its results table. A
    directory holding another sweep's results is refused unless `shared` (a caller that runs
    several sweeps over one points directory and reads the tables they return)."""
    out_dir = Path(out_dir)
    if not shared:
        store.check_same_sweep(out_dir, sweep)
    sweep.validate()  # before the directory exists: a refused sweep leaves nothing behind
    out_dir.mkdir(parents=True, exist_ok=True)
    points = run_points(sweep, out_dir, backend or Backend(), progress, checked=True)
    df = store.collect(out_dir, sweep, points)
    store.write_results(out_dir, sweep, df)
    return df


def run_points(sweep: Sweep, out_dir: Path, backend: "Backend", progress: bool = False,
               checked: bool = False) -> list[Point]:
    """Compute the sweep's points that have no file under `out_dir`; all its points
    (`checked`: the caller validated the sweep)."""
    if not checked:
        sweep.validate()
    pairs = sweep.points()
    todo = [(p, d) for p, d in pairs
            if not store.point_path(out_dir, p.point_id, p.seed).exists()]
    tasks = [(p.point_id, p.seed, d, str(sweep.base_dir), str(out_dir)) for p, d in todo]
    if tasks:
        with _Progress(progress, len(pairs), len(pairs) - len(todo)) as bar:
            backend.run(tasks, Path(out_dir), bar.advance)
    return [p for p, _ in pairs]


WORKERS_PER_CPU = 4
"""local workers (processes, or a local Ray's CPUs) per CPU of this machine at most"""


class Backend:
    """Where points run: in this process (workers=1), a local process pool, or Ray.

    Used as a context manager it keeps its pool (or Ray) up across several runs (capacity
    search probes); otherwise each run starts and stops it.
    """

    def __init__(self, workers: int = 1, use_ray: bool = False, ray_address: str | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        cpus = os.cpu_count() or 1
        if not ray_address and workers > WORKERS_PER_CPU * cpus:
            # a local pool starts every worker at once: thousands of forks stall the machine
            raise ValueError(f"--workers {workers}: more than {WORKERS_PER_CPU}x this machine's "
                             f"{cpus} CPUs (a Ray cluster's: --ray ADDRESS)")
        self.workers, self.use_ray, self.ray_address = workers, use_ray, ray_address
        self.pool: ProcessPoolExecutor | None = None
        self.ray_started = False
        self.active = False

    def __enter__(self) -> "Backend":
        if self.use_ray:
            self._start_ray()
        elif self.workers > 1:
            self.pool = self._new_pool()
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
        if self.ray_started:
            import ray

            ray.shutdown()
            self.ray_started = False

    @contextlib.contextmanager
    def session(self):
        """Up for the block: entered here unless already entered by the caller."""
        if self.active:
            yield self
        else:
            with self:
                yield self

    def name(self) -> str:
        """The backend in words (results, progress)."""
        if self.use_ray:
            return f"ray ({self.ray_address or 'local'}, {self.workers} CPUs)"
        return "in process" if self.workers == 1 else f"process pool ({self.workers} workers)"

    def run(self, tasks: list[tuple], out_dir: Path, advance) -> None:
        """Compute every task (arguments of `compute_point`), calling `advance` per point."""
        with self.session():
            if self.use_ray:
                self._run_ray(tasks, advance)
            elif self.workers == 1:
                for t in tasks:
                    compute_point(*t)
                    advance()
            else:
                self._run_pool(tasks, out_dir, advance)

    def _new_pool(self) -> ProcessPoolExecutor:
        # fork where it is the platform's way (Linux): workers need no importable __main__, so
        # plain scripts work (the progress bar runs no thread that a fork could copy mid-write)
        method = "fork" if sys.platform == "linux" else "spawn"
        pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(method))
        pool.submit(int).result()  # with fork, every worker starts at the first submit
        return pool

    def _run_pool(self, tasks: list[tuple], out_dir: Path, advance) -> None:
        left = list(tasks)
        for _ in range(POOL_RESTARTS + 1):
            try:
                running = {self.pool.submit(compute_point, *t): t for t in left}
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()
                        left.remove(running.pop(f))
                        advance()
                return
            except BrokenProcessPool:  # a worker died: its points have no file; run them again
                self.pool.shutdown(cancel_futures=True)
                self.pool = self._new_pool()
                left = [t for t in left if not store.point_path(out_dir, t[0], t[1]).exists()]
        raise RuntimeError(f"sweep: worker processes died {POOL_RESTARTS + 1} times; "
                           f"{len(left)} points left (re-run to resume)")

    def _start_ray(self) -> None:
        import logging

        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs Ray: pip install -e '.[ray]'") from None
        if ray.is_initialized():
            return
        if self.ray_address:
            ray.init(address=self.ray_address, log_to_driver=False, logging_level=logging.ERROR)
        else:  # a local instance with as many CPUs as workers
            ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR)
        self.ray_started = True

    def _run_ray(self, tasks: list[tuple], advance) -> None:
        import ray

        remote = ray.remote(max_retries=3, num_cpus=1)(compute_point)  # retried if a worker dies
        pending = [remote.remote(*t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
            advance()


class _Progress:
    """A rich progress bar with ETA over the sweep's points (silent when disabled)."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.enabled, self.total, self.done = enabled, total, done
        self.bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            # no refresh thread: pool workers may be forked while the bar is up
            self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                auto_refresh=False)
            self.bar.start()
            self.task = self.bar.add_task("sweep", total=self.total, completed=self.done)
        return self

    def advance(self) -> None:
        """One more point finished."""
        if self.bar is not None:
            self.bar.advance(self.task)
            self.bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

"""Sweeps: a base config x typed overrides x seeds, content-hashed, resumable, on a process pool
or Ray; seed statistics with confidence intervals; capacity search on top."""

from sim.sweep.run import Backend, compute_point, run_points, run_sweep
from sim.sweep.spec import Point, Sweep, apply_overrides, load_sweep
from sim.sweep.store import read_results

__all__ = ["Backend", "Point", "Sweep", "apply_overrides", "compute_point", "load_sweep",
           "read_results", "run_points", "run_sweep"]

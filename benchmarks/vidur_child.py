"""Vidur's side of `vidur_runner.py`: run one simulation in the Vidur venv and time its parts.

Started by `benchmarks/vidur_runner.py` as `VENV/bin/python benchmarks/vidur_child.py ARGS...`
(Vidur's own command-line arguments); writes its timings and counters as JSON to the file named
by VIDUR_RUNNER_STATS. It imports only what the Vidur venv has, never reasonsim.
"""
import json
import os
import time

T0, C0 = time.perf_counter(), time.process_time()
import numpy  # noqa: E402  (imports are timed: import_s)
import pandas  # noqa: E402
import sklearn  # noqa: E402
from sklearn.model_selection import GridSearchCV
import vidur
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
from vidur.execution_time_predictor.sklearn_execution_time_predictor import SklearnExecutionTimePredictor
from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (
    LinearRegressionExecutionTimePredictor as LinearRegression)

# PyPI vidur (0.0.17 to 0.0.26) leaves _get_kv_parallel_communication_time abstract in
# LinearRegressionExecutionTimePredictor (RandomForrest... overrides it by calling the base class's
# version), so the class cannot be instantiated. Nothing calls the method (KV-parallel communication
# is not modelled yet); give LinearRegression the same delegation RandomForrest has.
_KVP = "_get_kv_parallel_communication_time"
if _KVP in LinearRegression.__abstractmethods__:
    def _kvp_time(self, batch):
        return SklearnExecutionTimePredictor._get_kv_parallel_communication_time(self, batch)
    setattr(LinearRegression, _KVP, _kvp_time)
    LinearRegression.__abstractmethods__ = frozenset(LinearRegression.__abstractmethods__ - {_KVP})

S = {"import_s": time.perf_counter() - T0, "train_fits": 0, "train_s": 0.0, "train_cpu_s": 0.0,
     "predictor_init_s": 0.0, "predictor_init_cpu_s": 0.0, "write_output_s": 0.0,
     "write_output_cpu_s": 0.0, "handled_events": 0, "added_events": 0,
     "vidur_version": getattr(vidur, "__version__", None),
     "versions": {"numpy": numpy.__version__, "pandas": pandas.__version__,
                  "scikit-learn": sklearn.__version__}}

def timed(cls, name, key):
    orig = getattr(cls, name)
    def wrapper(*a, **k):
        t, c = time.perf_counter(), time.process_time()
        try:
            return orig(*a, **k)
        finally:
            S[key + "_s"] += time.perf_counter() - t
            S[key + "_cpu_s"] += time.process_time() - c
            if key == "train":
                S["train_fits"] += 1
    setattr(cls, name, wrapper)

timed(GridSearchCV, "fit", "train")
timed(SklearnExecutionTimePredictor, "__init__", "predictor_init")
timed(Simulator, "_write_output", "write_output")
_add_events = Simulator._add_events
def counting_add_events(self, events):
    S["handled_events"] += 1
    S["added_events"] += len(events)
    return _add_events(self, events)
Simulator._add_events = counting_add_events

config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
t = time.perf_counter()
sim = Simulator(config)
S["setup_s"] = time.perf_counter() - t
S["arrival_events"] = len(sim._event_queue)
t, c = time.perf_counter(), time.process_time()
sim.run()
S["run_s"], S["run_cpu_s"] = time.perf_counter() - t, time.process_time() - c
S["event_loop_s"] = S["run_s"] - S["write_output_s"]
S["event_loop_cpu_s"] = S["run_cpu_s"] - S["write_output_cpu_s"]
S["simulated_s"] = float(sim._time)
S["output_dir"] = config.metrics_config.output_dir
try:
    S["max_batch_size"] = [int(rs._max_batch_size) for rs in sim.scheduler._replica_schedulers.values()]
    S["num_kv_blocks"] = int(config.cluster_config.cache_config.num_blocks)
except Exception as e:  # informative only
    S["max_batch_size"] = repr(e)
S["child_total_s"] = time.perf_counter() - T0
S["child_total_cpu_s"] = time.process_time() - C0
with open(os.environ["VIDUR_RUNNER_STATS"], "w") as f:
    json.dump(S, f)

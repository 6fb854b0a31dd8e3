# %% [markdown]
# # Simulated vs live: the shipped Dynasor SC replay
#
# `traces/data/testbed-programs-cpu` is a live run on vLLM (CPU build, 2-core AMD EPYC) of
# `examples/dynasor-sc-branches-certaindex.yaml` with 64 programs (seed 0): self-consistency with
# certaindex stopping, the Dynasor scheduler, 8 sequences per iteration. Here the same config is
# simulated under two calibrations of the same device:
#
# - **grid**: `sim/data/testbed-large-cpu.calib.json`, fitted on a greedy `trace steps` grid
#   (out of sample for this workload);
# - **programs**: `sim/data/testbed-large-programs-cpu.calib.json`, fitted on this very live run's
#   steps (in sample: it shows what the step-time model can do at best, not a prediction).
#
# Seeds 1..N draw other workloads (arrival times, questions): their spread says how much of a
# sim-vs-live gap one seed's workload alone could explain. Analysis reads results tables only.

# %%
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from sim.config import read_yaml
from sim.metrics import summarize
from sim.program_metrics import program_summary
from sim.sweep import Backend, Sweep, read_results, run_sweep
from traces.store import read_table

REPO = Path(os.environ.get("REASONSIM_REPO", Path.cwd()))
OUT = Path(os.environ.get("REASONSIM_NB_OUT", REPO / "reports" / "notebooks")) / "validation"
QUICK = os.environ.get("REASONSIM_NB_QUICK") == "1"
LIVE = REPO / "traces" / "data" / "testbed-programs-cpu"
config = REPO / "examples" / "dynasor-sc-branches-certaindex.yaml"

# %% [markdown]
# ## The live run

# %%
live_programs = read_table(LIVE, "programs").to_pandas()
live_requests = read_table(LIVE, "requests").to_pandas()
run = read_table(LIVE, "runs").to_pandas().iloc[0]
print(run["device"], run["engine"], run["engine_version"], run["command"])
ps, rs = program_summary(live_programs), summarize(live_requests)
live = {"program_latency_s.p50": ps["program_latency_s"]["p50"],
        "program_latency_s.p90": ps["program_latency_s"]["p90"],
        "slo_attainment": ps["slo_attainment"], "tokens_per_program": ps["tokens_per_program"],
        "accuracy": ps["accuracy"], "ttft_s.p50": rs["ttft_s"]["p50"],
        "tpot_s.p50": rs["tpot_s"]["p50"], "throughput_tok_s": rs["throughput_tok_s"]}
live

# %% [markdown]
# ## The simulations: 2 calibrations x seeds

# %%
base = read_yaml(config)
base["workload"]["programs"]["count"] = len(live_programs)
cal = "cluster.replicas.0.calibration"
cases = [{"name": "grid", cal: "../sim/data/testbed-large-cpu.calib.json"},
         {"name": "programs", cal: "../sim/data/testbed-large-programs-cpu.calib.json"}]
sweep = Sweep(base, config.parent, {}, cases, [0, 1, 2] if QUICK else list(range(8)))
with Backend(2) as backend:
    run_sweep(sweep, OUT, backend)
results = read_results(OUT)

# %% [markdown]
# ## Error at the live workload (seed 0) beside the spread over workload draws

# %%
rows = []
for case, g in results.groupby("case"):
    at0 = g[g.seed == 0].iloc[0]
    for metric, value in live.items():
        draws = g[metric].to_numpy(dtype=float)
        rows.append({"calibration": case, "metric": metric, "live": value, "sim": at0[metric],
                     "rel_err": at0[metric] / value - 1,
                     "seeds min..max": f"{draws.min():.4g}..{draws.max():.4g}"})
errors = pd.DataFrame(rows)
errors.style.format({"live": "{:.4g}", "sim": "{:.4g}", "rel_err": "{:+.1%}"})

# %% [markdown]
# ## Program latency CDFs (seed 0): live vs each calibration
# The per-program tables come from `reasonsim simulate -o`, the same schema as the live trace.

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.8))
lat = np.sort((live_programs.finish_s - live_programs.arrival_s).to_numpy())
ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), "k-", label="live (vLLM)")
for case in cases:
    d = OUT / f"tables-{case['name']}"
    if not (d / "programs").exists():
        cfg_path = OUT / f"{case['name']}.yaml"
        cfg = {**base, "cluster": {**base["cluster"], "replicas": [
            {**base["cluster"]["replicas"][0],
             "calibration": str((config.parent / case[cal]).resolve())}]}}
        cfg["workload"]["programs"]["trace"] = str(
            (config.parent / base["workload"]["programs"]["trace"]).resolve())
        cfg_path.write_text(yaml.safe_dump(cfg))
        subprocess.run([sys.executable, "-m", "reasonsim.cli", "simulate", str(cfg_path),
                        "-o", str(d), "--json"], check=True, capture_output=True, cwd=REPO)
    p = read_table(d, "programs").to_pandas()
    lat = np.sort((p.finish_s - p.arrival_s).to_numpy())
    ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), "--", label=f"simulated ({case['name']})")
ax.set_xscale("log")
ax.set_xlabel("program latency (s)")
ax.set_ylabel("CDF")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()

# %%
assert set(errors.calibration) == {"grid", "programs"}
assert np.isfinite(errors.rel_err).all()

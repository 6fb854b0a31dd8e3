# %% [markdown]
# # Policy comparison: Dynasor schedulers and allocations
#
# Self-consistency programs on one replica with a cap of 8 sequences: **which inter-program
# scheduler (FCFS, LPM, App-FIFO, Dynasor's gang/SJF) and which allocation (4 paths for every
# question vs certaindex stopping at agreement) keeps more programs inside their deadlines as
# the arrival rate grows, and what does each cost in tokens and accuracy?**
#
# One sweep (cases: allocations; grid: scheduler x rate; seeds), then analysis of its
# results table only. `REASONSIM_NB_QUICK=1` runs the small version the test suite uses.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt

from sim.config import read_yaml
from sim.families.dynasor.online import max_sustainable_rate
from sim.sweep import Backend, Sweep, read_results, run_sweep
from sim.sweep.stats import by_point

REPO = Path(os.environ.get("REASONSIM_REPO", Path.cwd()))
OUT = Path(os.environ.get("REASONSIM_NB_OUT", REPO / "reports" / "notebooks")) / "policies"
QUICK = os.environ.get("REASONSIM_NB_QUICK") == "1"
TARGET = 0.9
config = REPO / "examples" / "dynasor-certaindex.yaml"

# %%
base = read_yaml(config)
base["workload"]["programs"]["count"] = 64 if QUICK else 256
cases = [{"name": "certaindex", "workload.programs.policy":
          {"type": "sc", "samples": 8, "per_round": 2, "entropy_threshold": 0.5}},
         {"name": "even-4", "workload.programs.policy": {"type": "sc", "samples": 4}}]
grid = {"cluster.scheduler": ["fcfs", "dynasor"] if QUICK else
        ["fcfs", "lpm", "app_fifo", "dynasor"],
        "workload.programs.rate_per_s": [1, 3] if QUICK else [1, 2, 3, 4, 5, 6]}
sweep = Sweep(base, config.parent, grid, cases, [0, 1] if QUICK else [0, 1, 2])
with Backend(2) as backend:
    run_sweep(sweep, OUT, backend)

# %%
results = read_results(OUT)
table = by_point(results, ["slo_attainment", "accuracy", "tokens_per_program",
                           "program_latency_s.p90"])
table = table.rename(columns={"cluster.scheduler": "scheduler",
                              "workload.programs.rate_per_s": "rate"})
table[["case", "scheduler", "rate", "slo_attainment", "slo_attainment.lo", "slo_attainment.hi",
       "accuracy", "tokens_per_program"]]

# %% [markdown]
# ## Deadline attainment vs arrival rate (mean and 95% interval over seeds)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ax, (case, g) in zip(axes, table.groupby("case")):
    for sched, s in g.groupby("scheduler"):
        s = s.sort_values("rate")
        ax.errorbar(s.rate, s.slo_attainment, capsize=2, marker="o", label=sched,
                    yerr=[s.slo_attainment - s["slo_attainment.lo"],
                          s["slo_attainment.hi"] - s.slo_attainment])
    ax.axhline(TARGET, color="gray", ls="--", lw=0.8)
    ax.set_title(case)
    ax.set_xlabel("program arrival rate (1/s)")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("deadline attainment")
axes[0].legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## The highest rate that keeps the mean attainment at the target
# (linear between swept rates, per allocation and scheduler)

# %%
rows = [{"policy": r["case"], "scheduler": r["scheduler"], "axis": "rate_per_s",
         "rate_per_s": r["rate"], "slo_attainment": r["slo_attainment"]}
        for r in table.to_dict("records")]
best = max_sustainable_rate(rows, TARGET)
best

# %% [markdown]
# ## What each allocation spends: tokens per program against accuracy

# %%
cost = table.groupby("case")[["tokens_per_program", "accuracy"]].mean()
ax = cost.plot.scatter(x="tokens_per_program", y="accuracy", figsize=(4.5, 3.2))
for name, r in cost.iterrows():
    ax.annotate(name, (r.tokens_per_program, r.accuracy))
cost

# %%
assert len(best) == len(cases) * len(grid["cluster.scheduler"])
assert cost.loc["certaindex", "tokens_per_program"] != cost.loc["even-4", "tokens_per_program"]

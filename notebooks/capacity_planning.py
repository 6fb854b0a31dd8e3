# %% [markdown]
# # Capacity planning: how many replicas for a program workload?
#
# The question: **how many replicas of the testbed target (vLLM CPU calibration) does Dynasor
# chain-of-thought need to serve 8 programs/s with 90% of programs inside their deadline, and
# does certaindex early stopping need fewer than a fixed token budget?**
#
# A sweep simulates both policies over replica counts and rates (three seeds each: the workload
# draws differ), and everything below reads its results table. A capacity search then pins the
# answer down with its interval. Set `REASONSIM_NB_OUT` to keep the results elsewhere and
# `REASONSIM_NB_QUICK=1` for the small sweep the test suite runs.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt

from sim.config import read_yaml
from sim.sweep import Backend, Sweep, read_results, run_sweep
from sim.sweep.capacity import Question, Search
from sim.sweep.stats import by_point

REPO = Path(os.environ.get("REASONSIM_REPO", Path.cwd()))
OUT = Path(os.environ.get("REASONSIM_NB_OUT", REPO / "reports" / "notebooks")) / "capacity"
QUICK = os.environ.get("REASONSIM_NB_QUICK") == "1"
TARGET = 0.9
config = REPO / "examples" / "dynasor-cot-certaindex.yaml"

# %% [markdown]
# ## The sweep
# One base config; the two policies are cases (they differ only in `workload.programs.policy`);
# replicas and rate are a grid. Points already in `OUT` are reused.

# %%
base = read_yaml(config)
base["workload"]["programs"]["count"] = 64 if QUICK else 256
cases = [{"name": "certaindex", "workload.programs.policy":
          {"type": "certaindex", "window": 3, "interval_tokens": 32}},
         {"name": "budget-96", "workload.programs.policy":
          {"type": "budget", "budget_tokens": 96}}]
grid = {"cluster.replicas.0.count": [1, 2, 4] if QUICK else [1, 2, 3, 4, 5, 6],
        "workload.programs.rate_per_s": [4, 8] if QUICK else [2, 4, 8]}
sweep = Sweep(base, config.parent, grid, cases, [0, 1] if QUICK else [0, 1, 2])
with Backend(2) as backend:
    run_sweep(sweep, OUT, backend)

# %% [markdown]
# ## Attainment by replicas (mean and 95% interval over seeds)

# %%
results = read_results(OUT)
table = by_point(results, ["slo_attainment", "tokens_per_program", "accuracy"])
table = table.rename(columns={"cluster.replicas.0.count": "replicas",
                              "workload.programs.rate_per_s": "rate"})
table[["case", "rate", "replicas", "slo_attainment", "slo_attainment.lo",
       "slo_attainment.hi", "tokens_per_program", "accuracy"]]

# %%
fig, axes = plt.subplots(1, len(grid["workload.programs.rate_per_s"]), figsize=(11, 3.4),
                         sharey=True)
for ax, (rate, g) in zip(axes, table.groupby("rate")):
    for case, c in g.groupby("case"):
        c = c.sort_values("replicas")
        ax.errorbar(c.replicas, c.slo_attainment, capsize=2, marker="o", label=case,
                    yerr=[c.slo_attainment - c["slo_attainment.lo"],
                          c["slo_attainment.hi"] - c.slo_attainment])
    ax.axhline(TARGET, color="gray", ls="--", lw=0.8)
    ax.set_title(f"{rate} programs/s")
    ax.set_xlabel("replicas")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("deadline attainment")
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# ## The fewest replicas that meet the target, read from the table
# "Meets" asks the whole interval to clear the target (the confident answer).

# %%
ok = table[table["slo_attainment.lo"] >= TARGET]
answer = ok.groupby(["case", "rate"]).replicas.min().unstack()
answer

# %% [markdown]
# ## The capacity search at 8 programs/s
# Bisection over the replica count with the same seeds; the interval runs from the count
# where the interval partly clears the target to where it wholly does.

# %%
q = Question("replicas", TARGET, seeds=tuple(sweep.seeds))
found = {}
with Backend(2) as backend:
    for case in cases:
        b = {**base, "workload": {"programs": {**base["workload"]["programs"], "rate_per_s": 8,
                                               "policy": case["workload.programs.policy"]}}}
        a = Search(case["name"], b, config.parent, q, OUT, backend).answer()
        found[case["name"]] = (a.answer, a.interval)
found

# %%
assert set(found) == {"certaindex", "budget-96"}
assert all(n is None or n >= 1 for n, _ in found.values())

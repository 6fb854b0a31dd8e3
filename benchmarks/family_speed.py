"""Every program family's simulation speed: its example compiled (at its calibrations' step-time
model kind and at the other kind), under SimPy, its decisions alone, and its requests with output
lengths doubled (`python benchmarks/sim_speed.py --families`).

Cost must grow with scheduling events, not tokens, for program workloads as for plain requests.
`doubled_outputs` runs the same programs with every request generating twice the tokens the trace
gives it (the oracle's answer doubled on the way to the replicas and halved on the way back, so
each program decides as it does at traced lengths), at the same arrivals; the row gives the CPU
ratio beside the ratios of steps and scheduling events (longer requests overlap more, so more
arrivals cut a running decode run). The calibrations' `max_model_len` is doubled for both runs
(copies under `.bench/`), since a traced request near the model's limit would not fit twice its
output.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from program_decisions import decisions_alone  # noqa: E402  (this directory)
from programs.workload import forget_banks  # noqa: E402
from sim.config import parse_config, read_yaml  # noqa: E402
from sim.engine.cluster import build_replicas  # noqa: E402
from sim.families.registry import sim_family  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.workloads.programs import simulate_programs  # noqa: E402

FAMILIES = {"cot": ("dynasor-cot-certaindex.yaml", 4000, 8),
            "sc": ("dynasor-certaindex.yaml", 4000, 8),
            "mcts": ("dynasor-mcts-certaindex.yaml", 4000, 8),
            "rebase": ("dynasor-rebase-certaindex.yaml", 1000, 8),
            "a1": ("a1-async-separate.yaml", 300, 8),
            "seed": ("seed-separate.yaml", 300, 4)}
"""every program family's example (`--families`): (example, programs, replicas per group), sized
to 10^4-10^5 requests, each run compiled and under SimPy"""


def program_config(example: str, n: int, replicas: int, longer_limit: bool = False,
                   other_kind: bool = False, requests: bool = True):
    """An example program workload with `n` programs, each replica group `replicas` times as
    large at half of the example's rate per replica, writing no steps table (`longer_limit`:
    its calibrations with twice their `max_model_len`, for `doubled_outputs`; `other_kind`: each
    calibration's step-time model replaced by one of the other kind, `_other_kind`;
    `requests=False`: no requests table, each request folded as it finishes)."""
    d = read_yaml(REPO / "examples" / example)
    d["workload"]["programs"].update(count=n, rate_per_s=d["workload"]["programs"]["rate_per_s"]
                                     * replicas * 0.5)
    for group in d["cluster"]["replicas"]:
        group["count"] = group.get("count", 1) * replicas
        cal = REPO / "examples" / group["calibration"]
        if other_kind:
            cal = _other_kind(cal)
        if longer_limit:
            cal = _doubled_limit(cal)
        group["calibration"] = str(cal)
    d["output"] = {"steps": False, "requests": requests}
    return parse_config(d, REPO / "examples")


SHIPPED_STEPS = {"draft": REPO / "traces" / "data" / "testbed-draft-cpu",
                 "target-large": REPO / "traces" / "data" / "testbed-large-cpu"}
"""per testbed model, a shipped trace of its steps (`_other_kind` fits on it)"""


def _other_kind(cal: Path) -> Path:
    """Calibration `cal` with its step-time model replaced by the other kind (linear <->
    serving) fitted on its model's shipped steps (`SHIPPED_STEPS`), its engine limits kept (the
    same replicas and workload), written under .bench/: a family's speed at each model kind."""
    from sim.step_time.calibration import calibrate

    d = json.loads(cal.read_text())
    other = "linear" if d["step_time_model"]["kind"] == "serving" else "serving"
    model = Path(d["provenance"]["model_id"]).name
    fit = calibrate([SHIPPED_STEPS[model]], model=other).to_json()
    fit["engine_limits"] = d["engine_limits"]
    return _bench_copy(fit, f"{other}-{cal.resolve().name}")


def _doubled_limit(cal: Path) -> Path:
    """A copy of calibration `cal` under .bench/ with twice its `max_model_len`."""
    d = json.loads(cal.read_text())
    limits = d["engine_limits"]
    if limits.get("max_model_len"):
        limits["max_model_len"] *= 2
    return _bench_copy(d, f"doubled-limit-{cal.resolve().name}")


def _bench_copy(calibration: dict, name: str) -> Path:
    """Write a calibration mapping as .bench/<name> (ignored by git); its path."""
    out = REPO / ".bench" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(calibration))
    return out


def _kinds(cfg) -> list[str]:
    """The step-time model kinds of a config's calibrations."""
    return sorted({cal.latency.kind for cal, _ in build_replicas(cfg)})


class _Doubled:
    """An oracle whose requests generate twice the traced tokens; outcomes read at traced
    lengths (half of what ran), so the programs decide as they do on the trace."""

    def __init__(self, oracle):
        self._oracle = oracle

    def request(self, run, spec) -> tuple:
        """The traced request with its output doubled."""
        prompt, prefix, key, output = self._oracle.request(run, spec)
        return prompt, prefix, key, 2 * output

    def outcome(self, run, spec, tokens: int, aborted: bool):
        """The traced outcome of the tokens a traced-length request would have generated."""
        return self._oracle.outcome(run, spec, (tokens + 1) // 2, aborted)

    def __getattr__(self, name: str):
        return getattr(self._oracle, name)


@contextmanager
def doubled_outputs():
    """Within: every program family's oracle doubles its requests' outputs (`_Doubled`)."""
    import sim.workloads.programs as harness

    found = harness.sim_family

    def doubling(name: str):
        family = found(name)

        def build_runs(*args):
            runs, capacity, oracle = family.build_runs(*args)
            return runs, capacity, _Doubled(oracle)

        return replace(family, build_runs=build_runs)

    harness.sim_family = doubling
    try:
        yield
    finally:
        harness.sim_family = found


def timed(cfg, repeats: int, compiled: bool = True, templates: bool = True
          ) -> tuple[float, object]:
    """Median CPU seconds of simulating `cfg` over `repeats` runs, and the last run's result
    (`templates=False`: every program driven request by request)."""
    cpu = []
    for _ in range(repeats):
        gc.collect()
        forget_banks()  # a whole run: the trace's load included, as a process's first run
        t0 = time.process_time()
        res = simulate_programs(cfg, compiled=compiled, templates=templates)
        cpu.append(time.process_time() - t0)
    return statistics.median(cpu), res


def family_row(example: str, n: int, replicas: int, repeats: int) -> dict:
    """One family's row: compiled (at its calibrations' model kind and at the other kind),
    request by request, SimPy and its decisions alone, each timed once a round over `repeats`
    rounds (a shared machine's spells land on every column alike; medians), and doubled
    outputs' cost."""
    cfg = program_config(example, n, replicas)
    other = program_config(example, n, replicas, other_kind=True)
    runs = {"compiled": lambda: timed(cfg, 1), "simpy": lambda: timed(cfg, 1, compiled=False),
            "other": lambda: timed(other, 1)}
    if _templated(cfg):  # the same run with every program driven request by request
        runs["request_by_request"] = lambda: timed(cfg, 1, templates=False)
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    last, decisions = {}, []
    for _ in range(repeats):
        for k, run in runs.items():
            t, last[k] = run()
            cpu[k].append(t)
        decisions.append(decisions_alone(cfg)["requests_per_cpu_s"])
    med = {k: statistics.median(v) for k, v in cpu.items()}
    res = last["compiled"]
    requests = res.summary["requests"]
    row = {"example": example, "programs": n, "requests": requests,
           "simulator": res.summary["simulator"], "why_simpy": res.why_simpy,
           "step_time_models": _kinds(cfg), "requests_per_cpu_s": requests / med["compiled"],
           "simpy_requests_per_cpu_s": requests / med["simpy"],
           # the floor under any kernel: the same programs' Python side on instant replicas
           "decisions_alone_requests_per_cpu_s": statistics.median(decisions)}
    if "request_by_request" in med:
        row["request_by_request_per_cpu_s"] = requests / med["request_by_request"]
    row.update(doubled(program_config(example, n, replicas, longer_limit=True), repeats))
    s = last["other"].summary
    row["other_kind"] = {"step_time_models": _kinds(other), "requests": s["requests"],
                         "simulator": s["simulator"],
                         "requests_per_cpu_s": s["requests"] / med["other"]}
    return row


def _templated(cfg) -> bool:
    """Whether the config's programs send from templates (`sim.workloads.program_templates`)."""
    from programs.families import family_of

    return sim_family(family_of(cfg.programs.method, cfg.programs.policy).name).templated


def doubled(cfg, repeats: int) -> dict:
    """The config's programs at traced and at doubled output lengths, timed in alternation (a
    shared machine's drift lands on both; at least 5 pairs): the CPU ratio (medians), and the
    ratios of tokens, steps, requests and scheduling events (deterministic)."""
    base_cpu, double_cpu = [], []
    for _ in range(max(repeats, 5)):  # ratios of ~1 s runs on a shared machine: more pairs
        cpu, base = timed(cfg, 1)
        base_cpu.append(cpu)
        with doubled_outputs():
            cpu, double = timed(cfg, 1)
        double_cpu.append(cpu)
    b, d = base.summary, double.summary
    return {"double_tokens_cost_ratio": statistics.median(double_cpu) / statistics.median(
                base_cpu),
            "double_tokens_token_ratio": d["output_tokens"] / b["output_tokens"],
            "double_requests_ratio": d["requests"] / b["requests"],
            "double_events_ratio": d["events"] / b["events"],
            "double_steps_ratio": d["iterations"] / b["iterations"]}


def families(repeats: int) -> dict:
    """Per program family (`FAMILIES`), `family_row` of its example."""
    simulate(program_config(FAMILIES["cot"][0], 20, 1))  # the kernel's load, timed apart
    return {method: family_row(example, n, replicas, repeats)
            for method, (example, n, replicas) in FAMILIES.items()}


def table(fam: dict) -> str:
    """The per-family rows as text."""
    return "\n".join(
        f"{m:>7} ({r['requests']} requests, {'/'.join(r['step_time_models'])}, "
        f"{r['simulator']}): {r['requests_per_cpu_s']:>8.0f} req/cpu-s; under SimPy "
        f"{r['simpy_requests_per_cpu_s']:>8.0f}" + (f" ({r['why_simpy']})" if r['why_simpy']
                                                    else "")
        + (f"; request by request {r['request_by_request_per_cpu_s']:>8.0f}"
           if "request_by_request_per_cpu_s" in r else "")
        + f"; decisions alone {r['decisions_alone_requests_per_cpu_s']:>8.0f}; doubled outputs "
        f"({r['double_tokens_token_ratio']:.2f}x tokens, {r['double_steps_ratio']:.2f}x steps, "
        f"{r['double_events_ratio']:.2f}x events): cost {r['double_tokens_cost_ratio']:.2f}x"
        f"; {'/'.join(r['other_kind']['step_time_models'])} step times "
        f"({r['other_kind']['simulator']}): {r['other_kind']['requests_per_cpu_s']:.0f} req/cpu-s"
        for m, r in fam.items())

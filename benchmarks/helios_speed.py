"""HELIOS's simulation speed: the what-if example's prompt stream, scaled, on many replicas.

    python benchmarks/helios_speed.py                       # the families-table row
    python benchmarks/helios_speed.py --prompts 1000000 --replicas 1000 \
        --policies helios:throughput

(`python benchmarks/sim_speed.py --families` prints the first row under the program families';
`--program-families helios` times the second, once.)

A row times a whole run as a user's `simulate` does it: the what-if profiles drawn and every
policy's stream served (`Experiment` then `simulate`), in CPU seconds of this process. Each
prompt is one request; its rate is prompts per CPU-second. The same run with every replica a
SimPy process (`simulate_cluster(simpy_events=True)`) and with every prompt generating twice the
tokens (the phases' `output_tokens` doubled) is timed beside it, in alternation.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.config import read_yaml  # noqa: E402
from sim.families.helios.config import Experiment  # noqa: E402
from sim.families.helios.serving import simulate_cluster  # noqa: E402

EXAMPLE = REPO / "examples" / "helios-opt-whatif.yaml"


def helios_config(prompts: int, replicas: int, policies: list[str] | None = None,
                  output_scale: int = 1) -> dict:
    """The what-if example with a stream of `prompts` (split over its phases), `replicas`
    replicas, only the named `policies` (None: all), outputs `output_scale` times as long."""
    d = copy.deepcopy(read_yaml(EXAMPLE))
    h = d["helios"]
    phases = h["what_if"]["phases"]
    for k, phase in enumerate(phases):
        phase["prompts"] = prompts // len(phases) + (k < prompts % len(phases))
        phase["output_tokens"] *= output_scale
    h["replicas"] = replicas
    if policies is not None:
        exp = Experiment(copy.deepcopy(d), EXAMPLE.parent)
        h["policies"] = [p for p in h["policies"] if exp.policy_name(
            exp.spec.helios.policies[h["policies"].index(p)]) in policies]
        if not h["policies"]:
            raise SystemExit(f"no policy named {policies}")
    return d


def timed_run(d: dict, simpy_events: bool = False) -> tuple[float, int, int, float]:
    """CPU seconds of loading the config and simulating every policy (its summary
    included); prompts, tokens and the longest policy's simulated span."""
    gc.collect()
    t0 = time.process_time()
    exp = Experiment(d, EXAMPLE.parent)
    h = exp.spec.helios
    prompts = tokens = 0
    span_s = 0.0
    for p in h.policies:
        res = simulate_cluster(lambda share, p=p: exp.program(p, share), exp.profiles,
                               exp.num_prompts, h.replicas, h.router, exp.max_tokens,
                               h.overlap_loading, simpy_events)
        summary = res.summary()  # as `simulate` reports it
        prompts += summary["prompts"]
        tokens += summary["tokens"]
        span_s = max(span_s, summary["span_s"])
    return time.process_time() - t0, prompts, tokens, span_s


def at_scale(prompts: int, replicas: int) -> dict:
    """`sim_speed.py --program-families helios`: one run of a `prompts` stream on `replicas`
    replicas under the HELIOS throughput policy, in `sim_speed`'s program-row fields (a prompt
    is a program of one request)."""
    cpu, n, _, span_s = timed_run(helios_config(prompts, replicas, ["helios:throughput"]))
    return {"method": "helios", "simulator": "helios loops", "programs": n,
            "replicas": replicas, "requests": n, "cpu_s": cpu, "programs_per_cpu_s": n / cpu,
            "requests_per_cpu_s": n / cpu, "peak_rss_gb": peak_rss_gb(),
            "simulated_s": span_s, "real_time_factor": cpu / span_s}


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def helios_row(prompts: int, replicas: int, repeats: int,
               policies: list[str] | None = None) -> dict:
    """Plain loops, SimPy processes and doubled outputs, timed in alternation (medians)."""
    cpu: dict[str, list[float]] = {"plain": [], "simpy": [], "doubled": []}
    base, double = helios_config(prompts, replicas, policies), \
        helios_config(prompts, replicas, policies, output_scale=2)
    for _ in range(repeats):
        t, n, tok, _ = timed_run(base)
        cpu["plain"].append(t)
        cpu["simpy"].append(timed_run(base, simpy_events=True)[0])
        t2, _, tok2, _ = timed_run(double)
        cpu["doubled"].append(t2)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return {"stream_prompts": prompts, "replicas": replicas, "policies": policies or "all",
            "prompts": n, "tokens": tok, "cpu_s": med["plain"],
            "cpu_s_range": [min(cpu["plain"]), max(cpu["plain"])],
            "prompts_per_cpu_s": n / med["plain"],
            "simpy_prompts_per_cpu_s": n / med["simpy"],
            "double_tokens_token_ratio": tok2 / tok,
            "double_tokens_cost_ratio": med["doubled"] / med["plain"],
            "peak_rss_gb": peak_rss_gb()}


def line(r: dict) -> str:
    """A row as text."""
    return (f"helios ({r['prompts']} prompts: a {r['stream_prompts']}-prompt stream on "
            f"{r['replicas']} replicas, policies {r['policies']}): {r['cpu_s']:.2f} CPU-s, "
            f"{r['prompts_per_cpu_s']:.0f} prompts/cpu-s; as SimPy processes "
            f"{r['simpy_prompts_per_cpu_s']:.0f}; doubled outputs "
            f"({r['double_tokens_token_ratio']:.2f}x tokens): cost "
            f"{r['double_tokens_cost_ratio']:.2f}x; peak {r['peak_rss_gb']:.1f} GB")


def main() -> None:
    """Time the rows asked for; print text or JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=24_000, help="the stream's prompts")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--policies", default=None,
                    help="comma-separated policy names of the example (default: all five)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    row = helios_row(args.prompts, args.replicas, args.repeats,
                     args.policies.split(",") if args.policies else None)
    print(json.dumps(row) if args.json else line(row))


if __name__ == "__main__":
    main()

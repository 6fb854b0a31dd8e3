"""Every simulation path on the README's demo and the fidelity suite's workloads: agreement and speed.

    python benchmarks/path_agreement.py                 # demo (2,000 requests) + the suite
    python benchmarks/path_agreement.py --demo-requests 500 --quick
    python benchmarks/path_agreement.py --effects      # the remaining class's latency effect

Per workload and path (compiled kernels, SimPy fast path, reference replica, the replica vLLM's
own scheduler composes): whether its requests and programs match the reference replica's (same
decisions, tokens and cached tokens; times within 1e-9 s), the largest time difference, and
simulated requests per CPU-second (`validation.path_agreement`). One run each: the speeds are
of this machine at this moment; the agreement does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from sim.config import read_yaml  # noqa: E402
from validation.fidelity import SUITE, load_suite, request_config  # noqa: E402
from validation.fidelity_programs import program_config  # noqa: E402
from validation.path_agreement import PATHS, compare, run_paths  # noqa: E402

REQUESTS_CAL = REPO / "sim" / "data" / "testbed-large-cpu.calib.json"
PROGRAMS_CAL = REPO / "sim" / "data" / "testbed-large-programs-cpu.calib.json"


def workloads(demo_requests: int, quick: bool):
    """(name, config mapping, base dir): the demo, then the suite's workloads."""
    d = read_yaml(REPO / "examples" / "demo.yaml")
    d["workload"]["num_requests"] = demo_requests
    yield "demo", d, REPO / "examples"
    suite = load_suite(SUITE)
    # the suite's engine serves max_model_len tokens (its long prompts exceed the shipped one's)
    cal = json.loads(REQUESTS_CAL.read_text())
    cal["engine_limits"]["max_model_len"] = suite["max_model_len"]
    requests_cal = Path(tempfile.mkdtemp()) / REQUESTS_CAL.name
    requests_cal.write_text(json.dumps(cal))
    for name, spec in suite["workloads"].items():
        if quick and not spec.get("quick"):
            continue
        if "program" in spec:
            yield name, program_config(spec, PROGRAMS_CAL, quick), REPO / "examples"
        else:
            yield name, request_config(spec, requests_cal, quick), REPO


def pressure_cases(requests_cal: Path):
    """(name, config mapping): prefix caching under KV pressure, where the replica's one
    remaining simplification (a freed block's content is not kept cached) shows."""
    suite = load_suite(SUITE)
    for kv in (160, 320):
        d = request_config(suite["workloads"]["prefix_sharing"], requests_cal, False)
        d["cluster"]["replicas"][0].update(block_size=16, kv_blocks=kv)
        yield f"prefix groups, {kv} blocks", d
    for kv in (120, 240):
        d = read_yaml(REPO / "examples" / "demo.yaml")
        d["workload"].update(num_requests=400, arrival={"kind": "poisson", "rate_per_s": 12})
        d["cluster"]["replicas"] = [{"calibration": str(REQUESTS_CAL), "block_size": 16,
                                     "kv_blocks": kv, "enable_prefix_caching": True}]
        yield f"no groups, {kv} blocks", d


def effects(requests_cal: Path) -> None:
    """Print the replica's latency against the vLLM-scheduled replica's on the pressure cases."""
    keys = (("e2e P50", "e2e_s", "p50"), ("e2e P90", "e2e_s", "p90"),
            ("TTFT P50", "ttft_s", "p50"), ("tok/s", "throughput_tok_s", None))
    print(f"{'case':<26}" + "".join(f"{k:>17}" for k, _, _ in keys)
          + f"{'preemptions':>14}{'cached tokens':>18}")
    for name, d in pressure_cases(requests_cal):
        runs = run_paths(d, REPO / "examples", ("reference", "vllm"))
        ref, vllm = (runs[p][0].summary for p in ("reference", "vllm"))
        cells = []
        for _, key, q in keys:
            a, b = (x[key][q] if q else x[key] for x in (ref, vllm))
            cells.append(f"{a / b - 1:+16.1%} ")
        cached = [int(runs[p][0].requests.column("cached_prompt_tokens").to_numpy().sum())
                  for p in ("reference", "vllm")]
        print(f"{name:<26}" + "".join(cells) + f"{ref['preemptions']:>7}/{vllm['preemptions']:<6}"
              f"{cached[0]:>9}/{cached[1]:<8}")


def main() -> None:
    """Run every path on every workload; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-requests", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="the suite's quick workloads")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--effects", action="store_true",
                    help="instead: the replica's latency error against the vLLM-scheduled "
                         "replica under KV pressure with prefix caching")
    args = ap.parse_args()
    if args.effects:
        return effects(REQUESTS_CAL)
    rows = {}
    _, d, base = next(workloads(20, True))  # the demo, small: warms imports (vLLM's), kernels
    run_paths(d, base)
    for name, d, base in workloads(args.demo_requests, args.quick):
        rows[name] = compare(run_paths(d, base))
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'workload':<16}" + "".join(f"{p:>29}" for p in PATHS))
    print(f"{'':<16}" + f"{'agrees  max|dt| s  req/CPU-s':>29}" * len(PATHS))
    for name, row in rows.items():
        cells = [f"{'yes' if c['agrees'] else 'NO':>9} {c['max_time_diff_s']:9.1e} "
                 f"{c['requests'] / max(c['cpu_s'], 1e-9):10,.0f}" for c in row.values()]
        print(f"{name:<16}" + "".join(f"{c:>29}" for c in cells))

if __name__ == "__main__":
    main()

"""Does a tiny fixed computation beside a fidelity run drift with its live runs' step level?

    OMP_NUM_THREADS=1 python benchmarks/host_probe.py sample LOG [--interval-s 1]   # beside
    python benchmarks/host_probe.py judge LOG RUN... [--json]                      # after

The live runs' median decode level drifts by 0.7-1.25x within one fidelity run while the host
steals under 2% of the CPU ([record](../docs/measurements/2026-12-03-steal-level.md)): the
steal does not measure it. `sample` times a fixed single-threaded matrix product (a few
milliseconds, once per `--interval-s`: under 1% of one CPU) and appends `wall-clock-s
duration-ms` to LOG until stopped. `judge` places every live run of the fidelity runs given on
the wall clock (`host_steal.served_span`) and prints, per live run, the probe's median
duration while it served over its median while the run's calibration traffic served (the
probe's level), beside the run's recorded decode level (`step_speed` in fidelity.json); then
the correlation of their logs over the runs, and how far the decode level lies from the
calibration's (1) and from the probe's level (median absolute log error).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from host_steal import served_span  # noqa: E402

SIZE = 192
REPEATS = 8


def probe_ms(a: np.ndarray) -> float:
    """Milliseconds of REPEATS products of the fixed matrix with itself."""
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        a @ a
    return 1e3 * (time.perf_counter() - t0)


def sample(log: Path, interval_s: float, count: int | None = None) -> None:
    """Append `time duration_ms` to log every interval_s, count times (None: until killed)."""
    a = np.random.default_rng(0).standard_normal((SIZE, SIZE)).astype(np.float32)
    probe_ms(a)  # the first call pays for the library's warm-up
    with open(log, "a") as f:
        k = 0
        while count is None or k < count:
            if k:
                time.sleep(interval_s)
            f.write(f"{time.time():.3f} {probe_ms(a):.4f}\n")
            f.flush()
            k += 1


def read_probes(log: Path) -> tuple[np.ndarray, np.ndarray]:
    """(wall clock s, duration ms) per probe."""
    rows = np.array([[float(x) for x in line.split()[:2]]
                     for line in log.read_text().splitlines() if line.strip()])
    return rows[:, 0], rows[:, 1]


def span_median(probes: tuple, span: tuple[float, float] | None) -> float | None:
    """The probes' median duration within span; None with fewer than three there."""
    if span is None:
        return None
    t, ms = probes
    inside = ms[(t >= span[0]) & (t <= span[1])]
    return float(np.median(inside)) if len(inside) >= 3 else None


def run_rows(probes: tuple, run: Path) -> list[dict]:
    """Every live run of RUN the log covers: its probe level and recorded decode level."""
    traffic = [m for t in sorted(run.glob("calibration_traffic_*"))
               if (m := span_median(probes, served_span(t))) is not None]
    if not traffic:
        return []
    base = float(np.median(traffic))
    rows = []
    for w in json.loads((run / "fidelity.json").read_text())["workloads"]:
        lives = sorted((run / w["workload"]).glob("live[0-9]*"))
        for live, speed in zip(lives, w.get("step_speed", [])):
            m = span_median(probes, served_span(live))
            if m is not None and speed.get("decode"):
                rows.append({"live": f"{run.name}/{w['workload']}/{live.name}",
                             "probe_level": m / base, "decode_level": speed["decode"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    """`sample` or `judge`, as the module's docstring says."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("log", type=Path)
    s.add_argument("--interval-s", type=float, default=1.0)
    j = sub.add_parser("judge")
    j.add_argument("log", type=Path)
    j.add_argument("runs", type=Path, nargs="+")
    j.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "sample":
        sample(a.log, a.interval_s)
        return 0
    probes = read_probes(a.log)
    rows = [r for run in a.runs for r in run_rows(probes, run)]
    out = {"rows": rows}
    if len(rows) > 2:
        probe = np.log([r["probe_level"] for r in rows])
        decode = np.log([r["decode_level"] for r in rows])
        out["correlation"] = float(np.corrcoef(probe, decode)[0, 1])
        # each live run's decode level predicted by the calibration's (1) or the probe's
        out["median_abs_log_error"] = {"calibration": float(np.median(np.abs(decode))),
                                       "probe": float(np.median(np.abs(decode - probe)))}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'live run':44s} {'probe':>6s} {'decode':>7s}")
    for r in rows:
        print(f"{r['live']:44s} {r['probe_level']:6.3f} {r['decode_level']:7.3f}")
    if "correlation" in out:
        e = out["median_abs_log_error"]
        print(f"correlation of the logs of the probe's level and the decode level: "
              f"{out['correlation']:+.2f} over {len(rows)} live runs; the decode level's "
              f"median absolute log error at the calibration's level {e['calibration']:.3f}, "
              f"at the probe's {e['probe']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

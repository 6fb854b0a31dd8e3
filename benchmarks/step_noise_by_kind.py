"""How widely decode and prefill steps scatter around their calibration, trace by trace.

    python benchmarks/step_noise_by_kind.py RUN [--calibration CAL]

RUN is a `reasonsim fidelity -o` directory. For each of its calibration traffic traces and live
runs: every step's time over CAL's prediction (default RUN's calibration), its one-second
window's level taken out as the fit takes it (`sim.step_time.spells.window_parts`), and the
10th, 50th and 90th percentiles of what is left, for decode-only steps and for steps that
prefill; then CAL's own noise tables (`step_log_quantiles`, `prefill_log_quantiles`) at the same
percentiles. Sampled latency draws a step's noise from those tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.step_time.live_speed import step_ratios  # noqa: E402
from sim.step_time.spells import window_parts  # noqa: E402

PERCENTILES = (10, 50, 90)


def spread(log_noise: np.ndarray) -> str:
    """The percentiles of exp(log_noise), or '-' for fewer than ten steps."""
    if log_noise.size < 10:
        return "-"
    p = np.exp(np.percentile(log_noise, PERCENTILES))
    return " ".join(f"{v:.3f}" for v in p) + f" ({log_noise.size})"


def main() -> None:
    """Parse arguments and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a `reasonsim fidelity -o` directory")
    ap.add_argument("--calibration", type=Path, help="default: RUN/calibration.json")
    args = ap.parse_args()
    cal = args.calibration or args.run / "calibration.json"
    dirs = sorted(args.run.glob("calibration_traffic_*")) + sorted(args.run.glob("*/live[0-9]*"))
    print(f"{'trace':42s} {'decode p10 p50 p90 (steps)':>28s} "
          f"{'prefill p10 p50 p90 (steps)':>28s}")
    for d in dirs:
        got = step_ratios(cal, d)
        if got is None:
            continue
        ratio, steps = got
        own = window_parts(steps.run_id.astype(str).to_numpy(), steps.start_s.to_numpy(),
                           ratio)[1]
        pre = steps.prefill_tokens.to_numpy() > 0
        print(f"{str(d.relative_to(args.run)):42s} {spread(own[~pre]):>28s} "
              f"{spread(own[pre]):>28s}")
    model = json.loads(cal.read_text())["step_time_model"]
    for key in ("step_log_quantiles", "prefill_log_quantiles"):
        q = np.asarray(model.get(key) or [], float)
        print(f"{cal.name} {key}: " + (spread(q) if q.size else "none"))


if __name__ == "__main__":
    main()

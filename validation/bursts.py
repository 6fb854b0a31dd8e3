"""A burst of other work on the machine while a run served: its steps' total against their
median speed.

A shared machine's neighbour that runs for a few seconds slows the steps of that spell two to
ten times and leaves the median step untouched, so the speed level (a median) and the speed
probe do not see it. The sum does: a run's step time over the model's prediction, in total and
over its median ratio, is 1-3% above 1 on a quiet machine and 20-30% above it with a
seconds-long burst beside it (docs/measurements/2026-12-05-host-adds-in-waves.md). A
calibration fitted through one charges its residuals' mean to every simulated step; a live run
that served through one measures the burst, not the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces import read_table

BURST_TOLERANCE = 0.10
"""a run whose steps' total over their median speed exceeds the calibration's own by this
share (or a calibration whose exceeds every live run's) ran through a burst"""


def in_burst(tail: float | None, calibration: float, tolerance: float = BURST_TOLERANCE) -> bool:
    """Whether a live run whose steps' `step_tail` is `tail` served through a burst the
    calibration's steps (their tail `calibration`) did not have."""
    return tail is not None and tail > calibration * (1 + tolerance)


def step_tail(model, steps_dir: str | Path) -> float | None:
    """A run's step time over `model`'s prediction in total, over the median of the same
    ratio per step: 1 where every step ran at the run's typical speed. None without steps."""
    from sim.step_time.live_speed import live_over_predicted
    from sim.step_time.serving_features import attach_spans

    steps = read_table(steps_dir, "steps").to_pandas()
    if not len(steps):
        return None
    ratio, steps = live_over_predicted(model, attach_spans(steps, [steps_dir]))
    return ratio_tail(ratio, steps.duration_ms.to_numpy())


def ratio_tail(ratio: np.ndarray, duration_ms: np.ndarray) -> float | None:
    """`step_tail` from each step's live-over-predicted `ratio` and its `duration_ms`."""
    if not len(ratio):
        return None
    predicted_ms = duration_ms / ratio
    return float(duration_ms.sum() / predicted_ms.sum() / np.median(ratio))


def run_speed(calibration: str | Path, steps_dir: str | Path, all_seeded: bool = False,
              ) -> dict[str, float | None]:
    """A live run's speed against a calibration from one pass over its steps: the median of
    its decode-only steps' live-over-predicted ratio (`decode`, as
    `sim.step_time.live_speed.step_speed_ratio` with `decode_only`) and its `step_tail`
    (`tail`); None where it ran none."""
    from sim.step_time.live_speed import decode_median, step_ratios

    got = step_ratios(calibration, steps_dir, all_seeded)
    if got is None or not len(got[0]):
        return {"decode": None, "tail": None}
    ratio, steps = got
    return {"decode": decode_median(ratio, steps),
            "tail": ratio_tail(ratio, steps.duration_ms.to_numpy())}


def calibration_tail(model) -> float:
    """The same for the steps a step-time model was fitted on: its residuals' mean over their
    median (what the simulator charges above the median step)."""
    q = np.asarray(getattr(model, "residual_log_quantiles", (0.0,)), float)
    return float(np.exp(q).mean() / np.exp(np.median(q)))


def burst_warning(run_tails: list[dict[str, float]], calibration_tails: dict[str, float],
                  ) -> str | None:
    """Lines for each live run (per pool, `step_tail`) that served through a burst the
    calibration's steps did not have, and for a calibration fitted through one no live run
    had; None where neither."""
    lines = []
    for pool, cal in sorted(calibration_tails.items()):
        live = [(i, r[pool]) for i, r in enumerate(run_tails) if r.get(pool) is not None]
        for i, tail in live:
            if in_burst(tail, cal):
                lines.append(
                    f"warning: live run {i}'s steps on {pool} took {tail - 1:.0%} more in total "
                    f"than at their median speed (the calibration's: {cal - 1:.0%}): it served "
                    "through a burst of other work on this machine, and its latencies measure "
                    "that, not the model; run it again on a quieter spell")
        if live and cal > max(t for _, t in live) * (1 + BURST_TOLERANCE):
            lines.append(
                f"warning: the calibration's steps on {pool} took {cal - 1:.0%} more in total "
                f"than at their median speed (the live runs': at most "
                f"{max(t for _, t in live) - 1:.0%}): it was fitted through a burst of other "
                "work, which the simulation charges to every step; calibrate again on a "
                "quieter spell")
    return "\n".join(lines) or None


LIVE_RERUNS = 1
"""times `reasonsim fidelity` runs a live run again that served through a burst (the quietest
of its attempts is judged)"""
RERUNS_DIR = "burst_runs"
"""where a workload's live runs set aside for a quieter attempt go (WORKLOAD/burst_runs/liveN_K)"""


def replay_quietly(replay, live: Path, tails, reruns: int = LIVE_RERUNS,
                   tolerance: float = BURST_TOLERANCE, clock=None) -> dict:
    """Replay into `live` (`replay(live)`), and again while the run served through a burst
    (`in_burst`; `tails(live)`: its step tail and the calibration's), up to `reruns` more
    times: the attempt of the lowest tail is kept at `live`, the others under
    live.parent/RERUNS_DIR/<live name>_K (K: the attempt). What happened: each attempt's tail,
    the one kept (0-based) and when it started (`clock()`)."""
    live = Path(live)
    aside = live.parent / RERUNS_DIR
    attempts = []  # (tail, started, where it lies now)
    for k in range(reruns + 1):
        if k:  # the attempt before it moves aside: the next writes where it was
            aside.mkdir(exist_ok=True)
            attempts[-1] = attempts[-1][:2] + (aside / f"{live.name}_{k}",)
            live.rename(attempts[-1][2])
        started = clock() if clock else None
        replay(live)
        tail, calibration = tails(live)
        attempts.append((tail, started, live))
        if not in_burst(tail, calibration, tolerance):
            break
    kept = min(range(len(attempts)), key=lambda k: (attempts[k][0] or 0.0, -k))
    if attempts[kept][2] != live:  # an earlier attempt was quieter: it takes the live place
        last = aside / f"{live.name}_{len(attempts)}"
        live.rename(last)
        attempts[kept][2].rename(live)
    return {"tails": [t for t, _, _ in attempts], "kept": kept, "started": attempts[kept][1]}


def tails_against(calibration: str | Path, all_seeded: bool = False):
    """A `replay_quietly` `tails`: a live run's step tail against the calibration at
    `calibration` (`run_speed`) and that calibration's own (`calibration_tail`)."""
    from sim.step_time.calibration import load_calibration

    own = calibration_tail(load_calibration(calibration).latency)
    return lambda live: (run_speed(calibration, live, all_seeded)["tail"], own)

"""What every `reasonsim` command shares: paths, the user-error type, argument parsers, output."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from inputs.repeats import repeated

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "models" / "testbed"
DEFAULT_MODEL = TESTBED / "target-large"  # the trained testbed target: real latency and behaviour


CALIBRATION_SEED_OFFSET = 1000
"""a replay's --calibrate-here serves the config under seed + this: other programs than those
validated"""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_speed_checks(parser) -> None:
    """A family replay's `--speed-checks` flag (`validation.beside_checks`)."""
    parser.add_argument("--speed-checks", action="store_true",
                        help="with --calibrate-here: serve the calibration's programs again after "
                        "each live run, and judge each live run at the decode speed of the "
                        "calibration runs just before and after it (the machine's speed of the "
                        "moment; the estimate at the calibration's speed stays beside it)")


def check_speed_checks(args) -> None:
    """`--speed-checks` serve the calibration's programs: refused without --calibrate-here."""
    if args.speed_checks and not args.calibrate_here:
        raise UserError("--speed-checks serve the calibration's programs again: they need "
                        "--calibrate-here")


def calibrate_pools(engine_dirs: dict[str, list], host_runs: list, cal_dir: Path,
                    ) -> dict[str, str]:
    """`--calibrate-here`: one calibration per pool, fitted on its engines' live steps
    (`engine_dirs`: pool -> engine trace directories; those without steps left out), with the
    loop's host times from `host_runs` (`sim.step_time.host_time.fit_host_ms`), written to
    `cal_dir/<pool>.calib.json`; pool -> path."""
    from dataclasses import asdict, replace

    from sim.step_time.calibration import calibrate
    from sim.step_time.host_time import fit_host_ms
    from traces.store import read_table

    host = asdict(fit_host_ms(host_runs))
    out = {}
    for pool, dirs in engine_dirs.items():
        # a mode that never uses a pool (ar: the draft) leaves its engine's steps empty
        dirs = [d for d in dirs if read_table(d, "steps").num_rows]
        if not dirs:
            raise UserError(f"--calibrate-here: no calibration traffic reached pool {pool!r}")
        path = cal_dir / f"{pool}.calib.json"
        cal = replace(calibrate(dirs), **host)
        path.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
        out[pool] = str(path.resolve())
    return out


def _positive_list(text: str, cast, kind: str, zero_ok: bool = False,
                   unique: bool = True) -> list:
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind}, got {text!r}")
    if not values or any(not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok)
                         for v in values):
        sign = "non-negative" if zero_ok else "positive"
        raise argparse.ArgumentTypeError(f"expected {sign} {kind}, got {text!r}")
    if unique and repeated(values):  # a repeated value is a repeated row
        raise argparse.ArgumentTypeError(f"a value repeats in {text!r}")
    return values


def floats(text: str) -> list[float]:
    """argparse type: comma-separated positive numbers."""
    return _positive_list(text, float, "numbers")


def ints(text: str) -> list[int]:
    """argparse type: comma-separated positive integers."""
    return _positive_list(text, int, "integers")


def ints_in_order(text: str) -> list[int]:
    """argparse type: comma-separated positive integers, a sequence (values may repeat)."""
    return _positive_list(text, int, "integers", unique=False)


def temperatures(text: str) -> list[float]:
    """argparse type: comma-separated sampling temperatures (>= 0), none repeated."""
    values = _positive_list(text, float, "numbers", zero_ok=True)
    if max(values) > 100:
        raise argparse.ArgumentTypeError(f"expected temperatures in [0, 100], got {text!r}")
    return values


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1] (a share, an attainment target, a threshold)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    if not 0 < v <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return v


def int_at_least(low: int):
    """argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = low - 1
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return v

    return parse


def number_in(low: float, high: float = math.inf, low_open: bool = False):
    """argparse type: a finite number in [low, high] ((low, high] with `low_open`): NaN, inf
    and a negative temperature, cache size or rate never reach an engine."""
    what = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and (v > low if low_open else v >= low) and v <= high):
            raise argparse.ArgumentTypeError(f"expected a finite number in {what}, got {text!r}")
        return v

    return parse


TEMPERATURE = number_in(0, 100)
"""argparse type: a sampling temperature (0: greedy)"""
CACHE_GB = number_in(0, 1e4, low_open=True)
"""argparse type: a KV cache size in GiB"""
POSITIVE = number_in(0, low_open=True)
"""argparse type: a finite number > 0"""
RATE = number_in(1e-5)
"""argparse type: an arrival rate per second (`inputs.limits.MIN_RATE_PER_S` at least)"""


def seed_int(text: str) -> int:
    """argparse type: a seed, a whole number in 0..2^63-1 (what numpy's generators take)."""
    from inputs.limits import SEED_MAX

    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed in 0..2^63-1, got {text!r}")
    return v


def server_url(text: str) -> str:
    """argparse type: an OpenAI-compatible server's base URL, http(s)://HOST[:PORT][/PATH]."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected a server URL such as "
                                         f"http://127.0.0.1:8000, got {text!r}")
    return text


def names(text: str) -> list[str]:
    """argparse type: comma-separated names, none repeated."""
    values = [v for v in text.split(",") if v]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    if repeated(values):  # a repeated name is a repeated row
        raise argparse.ArgumentTypeError(f"a name repeats in {text!r}")
    return values


def counts(text: str) -> list[int]:
    """argparse type: comma-separated non-negative integers."""
    return _positive_list(text, int, "integers", zero_ok=True)


def refuse_unread(trace: str, kind: str, flags: dict) -> None:
    """A flag (name -> value, None when not given) the trace's kind never reads is an error: it
    would be silently ignored."""
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise UserError(f"{given[0]}: not read on a {kind} trace ({trace})")


def check_device(args) -> None:
    """`--device cuda` where torch sees no GPU, or beside vLLM (this build runs where it was
    built): refused before any engine starts."""
    device = getattr(args, "device", "auto")
    if device == "auto":
        return
    if getattr(args, "engine", None) == "vllm":
        raise UserError(f"--device {device}: only with --engine torch (vLLM runs where it was "
                        "built)")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no GPU on this machine")


def refuse_inside(out: str | Path, inputs, flag: str) -> None:
    """An output path at or inside an input trace directory would change the input (its
    manifest, its tables): refused."""
    o = Path(out).resolve()
    for given in inputs:
        d = Path(given).resolve()
        if o == d or d in o.parents:
            raise UserError(f"{flag} {out}: inside the input trace {given}; write elsewhere")


def strict_json(obj):
    """`obj` with every NaN or infinite float as null: JSON has no NaN (strict parsers refuse
    Python's `NaN`)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def print_summary(summary: dict, as_json: bool) -> None:
    """A summary as one JSON line or a table."""
    if as_json:  # strict JSON: a figure with no value is null, not NaN
        print(json.dumps(strict_json(summary), sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict):  # {mean, p50, p90, p99}
            value = "  ".join(f"{k}={v:.4g}" for k, v in value.items())
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)


def program_config(path: Path, method: str, count: int | None = None, seed: int | None = None,
                   policy: dict | None = None, calibrations: dict[str, str] | None = None):
    """A program-workload config (its count, seed, policy keys and, by pool, replica
    calibrations overridden) and its workload, checked against its trace; ValueError names what
    is wrong."""
    from programs.workload import load_bank
    from sim.config import parse_config, read_yaml

    d = read_yaml(path)
    progs = d.get("workload", {}).get("programs") if isinstance(d, dict) and isinstance(
        d.get("workload"), dict) else None
    if not isinstance(progs, dict) or progs.get("method") != method:
        raise ValueError(f"not a {method} program config: needs workload.programs.method: "
                         f"{method} (`reasonsim simulate` runs any config)")
    if count is not None:
        progs["count"] = count
    if seed is not None:
        d["seed"] = seed
    if policy:
        progs["policy"] = {**progs["policy"], **policy}
    for group in d.get("cluster", {}).get("replicas", []) if calibrations else []:
        if isinstance(group, dict) and group.get("pool") in calibrations:
            group["calibration"] = str(calibrations[group["pool"]])
    cfg = parse_config(d, Path(path).parent)
    wl = cfg.programs
    load_bank(wl)
    return cfg, wl

"""`reasonsim sweep | capacity`: many simulations of one config, on a process pool or Ray."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonsim.common import UserError, print_summary

SLO_KEYS = {"ttft_s": "slo.ttft_s", "tpot_s": "slo.tpot_s",
            "slo_scale": "workload.programs.deadline.slo_scale",
            "base_s": "workload.programs.deadline.base_s"}


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _value(text: str):
    from sim.config import yaml_value

    return yaml_value(text)


def _values(text: str) -> list:
    return [_value(v) for v in text.split(",")]


def _grid(pairs: list[tuple[str, str]], sets: list[tuple[str, str]]) -> dict[str, list]:
    """--grid KEY=V1,V2 flags as a grid; a key given twice, a repeated value, or a key that a
    --set also fixes is an error (one would silently win)."""
    from inputs.repeats import repeated

    grid: dict[str, list] = {}
    for key, text in pairs:
        if key in grid:
            raise UserError(f"--grid {key} given twice (list every value in one: "
                            f"--grid {key}=A,B,C)")
        values = _values(text)
        if repeated(values):
            raise UserError(f"--grid {key}={text}: a value repeats")
        grid[key] = values
    both = sorted(set(grid) & {k for k, _ in sets})
    if both:
        raise UserError(f"--grid {both[0]} and --set {both[0]}: the grid would replace the "
                        "--set value at every point")
    return grid


def _check_seeds(n: int, flag: str) -> None:
    """A seed count within 1..MAX_SEEDS."""
    from sim.sweep.file import MAX_SEEDS

    if not 1 <= n <= MAX_SEEDS:
        raise UserError(f"{flag} {n}: between 1 and {MAX_SEEDS}")


def _backend(args):
    from sim.sweep import Backend

    if args.workers < 1:
        raise UserError(f"--workers {args.workers}: need at least 1")
    return Backend(args.workers, use_ray=args.ray is not None, ray_address=args.ray or None)


def _check_sets(sweep, sets: list[tuple[str, str]]) -> None:
    """A --set on a key the sweep file's grid or cases set is an error: theirs would replace it
    at every point, or at theirs."""
    keys = {k for k, _ in sets}
    both = sorted(keys & (set(sweep.grid) | {k for case in sweep.cases for k in case}))
    if both:
        raise UserError(f"--set {both[0]}: the sweep file's grid or cases set it and would "
                        "replace the --set value")


def _apply_sets(sweep, sets: list[tuple[str, str]]):
    from sim.sweep import apply_overrides

    if sets:
        sweep.base = apply_overrides(sweep.base, [(k, _value(v)) for k, v in sets])
        for k, v in sets:
            if k == sweep.seed_key:
                sweep.set_seed(_value(v))
    return sweep


def cmd_sweep(args: argparse.Namespace) -> int:
    """`reasonsim sweep`."""
    from sim.sweep import load_sweep, run_sweep
    from sim.sweep.stats import by_point

    _unique_sets(args.set)
    try:
        grid = _grid(args.grid, args.set)
        if args.seeds is not None and args.noise_seeds is not None:
            raise UserError("--seeds or --noise-seeds, not both")
        n = args.seeds if args.noise_seeds is None else args.noise_seeds
        if n is not None:
            _check_seeds(n, "--seeds" if args.noise_seeds is None else "--noise-seeds")
        sweep = _apply_sets(load_sweep(args.spec, grid, None if n is None else list(range(n)),
                                       noise=args.noise_seeds is not None), args.set)
        _check_sets(sweep, args.set)
        with _backend(args) as backend:
            df = run_sweep(sweep, args.out, backend, progress=not args.json)
    except ValueError as e:
        raise UserError(str(e)) from None
    metrics = args.metrics or [m for m in ("slo_attainment", "throughput_tok_s",
                                           "program_latency_s.p90", "e2e_s.p90")
                               if m in df.columns][:3]
    table = by_point(df, metrics)
    from sim.sweep.plots import plot_points

    png = plot_points(table, metrics, Path(args.out) / "sweep.png")
    if args.json:
        print(json.dumps({"results": str(Path(args.out) / "results.parquet"),
                          "plot": None if png is None else str(png),
                          "points": table.to_dict("records")}, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{len(table)} points x {len(sweep.seeds)} seeds "
                    f"(mean [95% CI]; {backend.name()})")
    keys = [c for c in table.columns if c not in {"point_id", "seeds"} and
            not c.startswith(tuple(metrics))]
    for c in keys + metrics:  # the last part of a dotted key is name enough in a header
        t.add_column(c.split(".")[-1] if c in keys else c, justify="right")
    for _, r in table.iterrows():
        t.add_row(*[str(r[c]) for c in keys],
                  *[f"{r[m]:.4g} [{r[m + '.lo']:.4g}, {r[m + '.hi']:.4g}]" for m in metrics])
    Console().print(t)
    print(f"results: {Path(args.out) / 'results.parquet'}" + ("" if png is None else
                                                             f"\nplot: {png}"))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    """`reasonsim capacity`."""
    from sim.config import read_yaml
    from sim.sweep import apply_overrides
    from sim.sweep.capacity import Question, Search
    from sim.sweep.plots import plot_capacity

    out = Path(args.out)
    bad = [k for k, _ in args.slo if k not in SLO_KEYS]
    if bad:
        raise UserError(f"--slo {bad[0]}: not an SLO key (have: {', '.join(SLO_KEYS)})")
    _check_seeds(args.seeds, "--seeds")
    _unique_sets(args.set)
    try:
        q = Question(args.over, args.target, args.metric, tuple(range(args.seeds)),
                     rel_tol=args.tolerance, max_replicas=args.max_replicas)
        variants = _variants(args.configs, args.policies)
        answers = []
        with _backend(args) as backend:
            for label, path, extra in variants:
                base = read_yaml(path)
                if not isinstance(base, dict):
                    raise ValueError(f"{path}: not a mapping")
                sets = [(k, _value(v)) for k, v in args.set] + extra
                if any(k == "seed" for k, _ in sets):  # the probes' seeds would replace it
                    raise UserError("--set/--policies seed: capacity simulates every probe at "
                                    "seeds 0..N-1 (--seeds N); a seed set here would be lost")
                slo = [(SLO_KEYS[k], _value(v)) for k, v in args.slo]
                if any(k.startswith("slo.") for k, _ in slo) and "slo" not in base:
                    base["slo"] = {}
                base = apply_overrides(base, sets + slo)
                search = Search(label, base, Path(path).parent, q, out, backend,
                                on_probe=None if args.json else _print_probe)
                answers.append(search.answer())
    except ValueError as e:
        raise UserError(str(e)) from None
    png = plot_capacity(answers, out / "capacity.png")
    result = {"question": {"over": q.over, "metric": q.metric, "target": q.target,
                           "seeds": len(q.seeds), "level": q.level, "slo": dict(args.slo)},
              "answers": [a.to_json() for a in answers], "plot": str(png)}
    (out / "capacity.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    what = "max rate (1/s)" if q.over == "rate" else "min replicas"
    summary = {}
    for a in answers:
        lo, hi = a.interval
        summary[f"{a.label}: {what}"] = (
            "not bracketed" if a.answer is None else
            f"{a.answer:.4g}  [{_fmt(lo)}, {_fmt(hi)}]  ({len(a.probes)} probes)") + (
            f"; {a.note}" if a.note else "")
    print(f"{q.metric} >= {q.target} (mean over {len(q.seeds)} seeds; "
          f"interval: where the {q.level:.0%} CI is wholly / partly above the target)")
    print_summary(summary, False)
    print(f"plot: {png}")
    return 0


def _print_probe(label: str, x: float, mean: float, lo: float, hi: float) -> None:
    import sys

    print(f"  {label}: {x:.4g} -> {mean:.3f} [{lo:.3f}, {hi:.3f}]", file=sys.stderr)


def _fmt(v) -> str:
    return "none" if v is None else f"{v:.4g}"


def _unique_sets(sets: list[tuple[str, str]]) -> None:
    """A key given to --set twice is an error: the last would silently win."""
    from inputs.repeats import repeated

    if twice := repeated(k for k, _ in sets):
        raise UserError(f"--set {twice[0]} given twice: give each key once")


def _variants(configs: list[str], policies: tuple[str, str] | None) -> list[tuple]:
    """(label, config path, extra overrides) per config x policy value."""
    from inputs.repeats import repeated

    out = []
    for path in configs:
        stem = Path(path).stem
        if policies is None:
            out.append((stem, path, []))
            continue
        key, values = policies
        if repeated(_values(values)):
            raise UserError(f"--policies {key}={values}: a value repeats")
        for v in _values(values):
            out.append((f"{stem} {key.split('.')[-1]}={v}", path, [(key, v)]))
    return out


def _add_backend_args(p) -> None:
    p.add_argument("--workers", type=int, default=2, help="processes (or Ray CPUs) at once")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: a local instance, or the cluster at ADDRESS")
    p.add_argument("--set", type=_assignment, action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted path) for every point")
    p.add_argument("--json", action="store_true")


def add_sweep_parser(sub) -> None:
    """The `sweep` and `capacity` commands."""
    sw = sub.add_parser("sweep", help="simulate a config over a grid of overrides and seeds",
                        description="Expand a sweep file (base config, grid, cases, seeds) or "
                        "a config with --grid into content-hashed points, simulate the missing "
                        "ones on a process pool or Ray, and write DIR/results.parquet (one row "
                        "per point x seed). Re-running resumes: finished points are kept.")
    sw.add_argument("spec", help="sweep file (with base:) or a simulation config")
    sw.add_argument("-o", "--out", required=True, help="results directory (resumable)")
    sw.add_argument("--grid", type=_assignment, action="append", default=[],
                    metavar="KEY=V1,V2", help="sweep a config key over values")
    sw.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds 0..N-1")
    sw.add_argument("--noise-seeds", type=int, default=None, metavar="N",
                    help="noise seeds 0..N-1: the config's workload under N draws of the "
                    "step-time noise (needs latency: sampled): the calibration's error band")
    sw.add_argument("--metrics", type=lambda t: t.split(","), default=None,
                    help="metrics to print (mean and 95%% CI over seeds)")
    _add_backend_args(sw)
    sw.set_defaults(func=cmd_sweep)
    ca = sub.add_parser("capacity", help="max arrival rate or min replicas meeting an SLO target",
                        description="Bisect the arrival rate (or the replica count) of each "
                        "config to where the metric's mean over seeds meets the target; the "
                        "interval is where its confidence interval is wholly and partly above "
                        "it. Probes are sweep points under -o, so a re-run reuses them.")
    ca.add_argument("configs", nargs="+", help="simulation configs (one policy each)")
    ca.add_argument("--over", choices=["rate", "replicas"], default="rate")
    ca.add_argument("--target", type=float, default=0.9, help="required metric value")
    ca.add_argument("--metric", default="slo_attainment")
    ca.add_argument("--slo", type=_assignment, action="append", default=[],
                    metavar="KEY=VALUE", help=f"set an SLO: {', '.join(SLO_KEYS)}")
    ca.add_argument("--policies", type=_assignment, default=None, metavar="KEY=V1,V2",
                    help="one search per value of a config key (e.g. cluster.scheduler=fcfs,"
                    "dynasor)")
    ca.add_argument("--seeds", type=int, default=3)
    ca.add_argument("--tolerance", type=float, default=0.05,
                    help="rate: stop at this relative bracket width")
    ca.add_argument("--max-replicas", type=int, default=256)
    ca.add_argument("-o", "--out", default="reports/capacity")
    _add_backend_args(ca)
    ca.set_defaults(func=cmd_capacity)

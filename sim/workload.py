"""Workloads: the request arrivals and lengths that the simulator and a live replay both consume.

A workload is built from the `workload:` mapping of a YAML config, in one of two forms:

- synthetic: an arrival process (poisson, gamma, constant) and length distributions, drawn from a
  per-run generator seeded by `seed`;
- replay of a trace file (reasonsim `requests` table, Azure, Mooncake, BurstGPT, Vidur CSV), with
  arrival times taken from the file and shifted so the first is 0.

Every config key is checked: an unknown key or an impossible value raises `ValueError` naming it;
a trace row that cannot be read raises naming the file and the row. Rows are never dropped or
clipped silently (the one filter, BurstGPT's failed requests, is the explicit `drop_failed`).

Only numpy is imported at module load: pandas and the trace store are imported by the trace
readers, so the synthetic path stays light. Never imports an engine (torch, vllm) or simpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
"""tokens per Mooncake `hash_ids` block (fixed by the Mooncake trace format)"""

NO_PREFIX_GROUP = -1
"""prefix_group of a request that shares no prefix group (a Mooncake row with no hash_ids)"""

TRACE_FORMATS = ("requests", "azure", "mooncake", "burstgpt", "vidur")
"""trace formats `workload.trace.format` accepts"""

_SYNTHETIC_KEYS = ("arrival", "num_requests", "duration_s", "prompt_tokens", "output_tokens",
                   "prefix")
_TRACE_FORM_KEYS = ("trace", "prefix")
_TRACE_KEYS = ("format", "path", "time_scale", "limit")
_ARRIVAL_KEYS = {"poisson": ("kind", "rate_per_s"), "gamma": ("kind", "rate_per_s", "cv"),
                 "constant": ("kind", "rate_per_s")}
_LENGTH_KEYS = {"uniform": ("kind", "low", "high"), "lognormal": ("kind", "mean", "sigma", "max"),
                "choice": ("kind", "values", "weights")}
_PREFIX_KEYS = ("groups", "tokens")

# One independent child stream per quantity: changing, say, the arrival kind or the request count
# leaves the drawn prompt lengths untouched, so sweeps over one knob compare like with like.
_STREAMS = ("arrival", "prompt_tokens", "output_tokens", "prefix")


# ---------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    """Requests to serve, sorted by arrival: plain numpy columns."""

    arrival_s: np.ndarray
    """arrival time of each request (float64 seconds, non-decreasing, starts >= 0)"""
    prompt_tokens: np.ndarray
    """prompt length of each request (int64, >= 1)"""
    output_tokens: np.ndarray
    """tokens to generate for each request (int64, >= 1)"""
    prefix_group: np.ndarray | None = None
    """id of the shared prompt prefix each request starts with (int64), or None: no sharing"""
    prefix_tokens: np.ndarray | None = None
    """length of that shared prefix (int64, 0 <= prefix_tokens <= prompt_tokens); set together
    with prefix_group"""

    def __post_init__(self):
        # Copy into owned, read-only arrays: a frozen workload must not change under the
        # simulator's feet because a caller kept and mutated the array it passed in.
        arrival = _owned(self.arrival_s, np.float64, "arrival_s")
        n = len(arrival)
        cols = {"arrival_s": arrival}
        for name in ("prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
            value = getattr(self, name)
            if value is None:
                cols[name] = None
                continue
            col = _owned(value, np.int64, name)
            if len(col) != n:
                raise ValueError(f"Workload.{name} has {len(col)} rows, arrival_s has {n}")
            cols[name] = col
        if cols["prompt_tokens"] is None or cols["output_tokens"] is None:
            raise ValueError("Workload needs prompt_tokens and output_tokens")
        if (cols["prefix_group"] is None) != (cols["prefix_tokens"] is None):
            raise ValueError("Workload.prefix_group and prefix_tokens must be given together")
        if n:
            if not np.all(np.isfinite(arrival)):
                raise ValueError(f"Workload.arrival_s row {_first(~np.isfinite(arrival))} "
                                 "is not finite")
            if arrival[0] < 0:
                raise ValueError(f"Workload.arrival_s starts at {arrival[0]}, must be >= 0")
            if np.any(np.diff(arrival) < 0):
                raise ValueError(f"Workload.arrival_s decreases at row "
                                 f"{_first(np.diff(arrival) < 0) + 1}: sort by arrival")
            for name in ("prompt_tokens", "output_tokens"):
                if np.any(cols[name] < 1):
                    raise ValueError(f"Workload.{name} row {_first(cols[name] < 1)} is "
                                     f"{cols[name][_first(cols[name] < 1)]}, must be >= 1")
            pt = cols["prefix_tokens"]
            if pt is not None:
                bad = (pt < 0) | (pt > cols["prompt_tokens"])
                if np.any(bad):
                    r = _first(bad)
                    raise ValueError(f"Workload.prefix_tokens row {r} is {pt[r]}, must be in "
                                     f"[0, prompt_tokens={cols['prompt_tokens'][r]}]")
        for name, col in cols.items():
            object.__setattr__(self, name, col)

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)

    def _replace(self, **cols: np.ndarray) -> Workload:
        fields = {"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                  "output_tokens": self.output_tokens, "prefix_group": self.prefix_group,
                  "prefix_tokens": self.prefix_tokens}
        return Workload(**{**fields, **cols})

    def scaled(self, time_scale: float) -> Workload:
        """The same requests with arrival times multiplied by time_scale (0.5 doubles the rate)."""
        time_scale = _positive(time_scale, "time_scale")
        return self._replace(arrival_s=self.arrival_s * time_scale)

    def with_output_scale(self, factor: float) -> Workload:
        """The same requests with output_tokens multiplied by factor, rounded, and at least 1."""
        factor = _positive(factor, "factor")
        return self._replace(output_tokens=np.maximum(1, np.rint(self.output_tokens * factor)))

    def head(self, n: int) -> Workload:
        """The first n requests (all of them when n >= len)."""
        n = _int(n, "n", minimum=0)
        return Workload(*(None if c is None else c[:n] for c in
                          (self.arrival_s, self.prompt_tokens, self.output_tokens,
                           self.prefix_group, self.prefix_tokens)))


def _owned(value: Any, dtype: type, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"Workload.{name} must be 1-D, has shape {arr.shape}")
    if dtype is np.int64 and arr.size and arr.dtype.kind == "f":
        # Refuse fractional token counts instead of truncating them.
        frac = ~np.isfinite(arr) | (arr != np.round(arr))
        if np.any(frac):
            raise ValueError(f"Workload.{name} row {_first(frac)} is {arr[_first(frac)]}, "
                             "not a whole number")
    out = np.array(arr, dtype=dtype, copy=True)
    out.flags.writeable = False
    return out


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# ---------------------------------------------------------------- config values


def _check_keys(mapping: Any, allowed: tuple[str, ...], where: str) -> dict:
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping, got {type(mapping).__name__}: {mapping!r}")
    for key in mapping:
        if key not in allowed:
            raise ValueError(f"unknown key {key!r} in {where}; allowed keys: "
                             f"{', '.join(allowed)}")
    return mapping


def _require(mapping: dict, key: str, where: str) -> Any:
    if key not in mapping:
        raise ValueError(f"{where}.{key} is required")
    return mapping[key]


def _number(value: Any, key: str) -> float:
    # bool is an int in Python; `rate_per_s: true` is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value}")
    return value


def _positive(value: Any, key: str) -> float:
    value = _number(value, key)
    if value <= 0:
        raise ValueError(f"{key} must be > 0, got {value}")
    return value


def _int(value: Any, key: str, minimum: int | None = None) -> int:
    number = _number(value, key)
    if not number.is_integer():
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    number = int(number)
    if minimum is not None and number < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {number}")
    return number


# ---------------------------------------------------------------- synthetic workloads

Sampler = Callable[[np.random.Generator, int], np.ndarray]


def _length_sampler(spec: Any, where: str) -> Sampler:
    """Parse a length spec (int, uniform, lognormal, choice) into a sampler; validate it now."""
    if not isinstance(spec, dict):
        tokens = _int(spec, where, minimum=1)
        return lambda rng, n: np.full(n, tokens, dtype=np.int64)
    kind = _require(spec, "kind", where)
    if kind not in _LENGTH_KEYS:
        raise ValueError(f"{where}.kind is {kind!r}; allowed kinds: {', '.join(_LENGTH_KEYS)} "
                         "(or a plain int for a fixed length)")
    _check_keys(spec, _LENGTH_KEYS[kind], where)
    if kind == "uniform":
        low = _int(_require(spec, "low", where), f"{where}.low", minimum=1)
        high = _int(_require(spec, "high", where), f"{where}.high", minimum=1)
        if high < low:
            raise ValueError(f"{where}.high ({high}) must be >= {where}.low ({low})")
        # Both bounds included: {low: 1, high: 1} is the fixed length 1.
        return lambda rng, n: rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
    if kind == "lognormal":
        mean = _positive(_require(spec, "mean", where), f"{where}.mean")
        sigma = _number(_require(spec, "sigma", where), f"{where}.sigma")
        if sigma < 0:
            raise ValueError(f"{where}.sigma must be >= 0, got {sigma}")
        cap = _int(spec["max"], f"{where}.max", minimum=1) if "max" in spec else None
        if cap is not None and mean > cap:
            raise ValueError(f"{where}.mean ({mean}) must be <= {where}.max ({cap})")
        # `mean` is the mean of the token counts: E[exp(N(mu, s^2))] = exp(mu + s^2/2).
        mu = math.log(mean) - sigma ** 2 / 2

        def lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
            # Rounded to whole tokens, at least 1 and at most `max`: part of the distribution's
            # definition (a length of 0 or above the model's window cannot be served).
            tokens = np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=n)))
            if cap is not None:
                tokens = np.minimum(tokens, cap)
            return tokens.astype(np.int64)

        return lognormal
    values = _require(spec, "values", where)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{where}.values must be a non-empty list, got {values!r}")
    choices = np.array([_int(v, f"{where}.values[{i}]", minimum=1) for i, v in enumerate(values)],
                       dtype=np.int64)
    probs = None
    if "weights" in spec:
        weights = spec["weights"]
        if not isinstance(weights, (list, tuple)) or len(weights) != len(choices):
            raise ValueError(f"{where}.weights must be a list of {len(choices)} numbers (one "
                             f"per value), got {weights!r}")
        w = np.array([_number(x, f"{where}.weights[{i}]") for i, x in enumerate(weights)])
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"{where}.weights must be >= 0 with a positive sum, got {weights!r}")
        probs = w / w.sum()
    return lambda rng, n: rng.choice(choices, size=n, p=probs)


def _gap_sampler(spec: Any) -> tuple[str, float, Callable[[np.random.Generator, int], np.ndarray]]:
    """Parse `workload.arrival` into (kind, rate, inter-arrival gap sampler)."""
    where = "workload.arrival"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a mapping like {{kind: poisson, rate_per_s: 4.0}}, "
                         f"got {spec!r}")
    kind = _require(spec, "kind", where)
    if kind not in _ARRIVAL_KEYS:
        raise ValueError(f"{where}.kind is {kind!r}; allowed kinds: {', '.join(_ARRIVAL_KEYS)}")
    _check_keys(spec, _ARRIVAL_KEYS[kind], where)
    rate = _positive(_require(spec, "rate_per_s", where), f"{where}.rate_per_s")
    if kind == "poisson":
        return kind, rate, lambda rng, n: rng.exponential(1.0 / rate, size=n)
    if kind == "gamma":
        cv = _positive(_require(spec, "cv", where), f"{where}.cv")
        # Gamma(shape k, scale t) has mean k*t and cv 1/sqrt(k): k = 1/cv^2, t = 1/(rate*k).
        shape = 1.0 / cv ** 2
        scale = 1.0 / (rate * shape)
        return kind, rate, lambda rng, n: rng.gamma(shape, scale, size=n)
    return kind, rate, lambda rng, n: np.full(n, 1.0 / rate)


def _synthetic_arrivals(cfg: dict, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a synthetic workload: `num_requests` of them, or all before `duration_s`."""
    kind, rate, gaps = _gap_sampler(_require(cfg, "arrival", "workload"))
    if ("num_requests" in cfg) == ("duration_s" in cfg):
        raise ValueError("workload needs exactly one of num_requests and duration_s")
    if "num_requests" in cfg:
        n = _int(cfg["num_requests"], "workload.num_requests", minimum=1)
        if kind == "constant":
            return np.arange(n) / rate
        return np.cumsum(gaps(rng, n))
    duration = _positive(cfg["duration_s"], "workload.duration_s")
    if kind == "constant":
        arrivals = np.arange(math.ceil(duration * rate) + 1) / rate
    else:
        # Draw gaps in chunks until the clock passes the duration; the chunk covers the expected
        # count plus slack so one draw nearly always suffices.
        chunk = int(duration * rate * 1.2) + 64
        parts, clock = [], 0.0
        while clock < duration:
            part = clock + np.cumsum(gaps(rng, chunk))
            parts.append(part)
            clock = part[-1]
        arrivals = np.concatenate(parts)
    # Arrivals fall in [0, duration_s): one exactly at duration_s belongs to the next window.
    arrivals = arrivals[arrivals < duration]
    if not len(arrivals):
        raise ValueError(f"workload.duration_s={duration} at rate_per_s={rate} produces no "
                         "request; lengthen the duration or raise the rate")
    return arrivals


def _synthetic(cfg: dict, seed: int) -> Workload:
    """A synthetic workload: arrival process and length distributions drawn from `seed`."""
    _check_keys(cfg, _SYNTHETIC_KEYS, "workload")
    prompt = _length_sampler(_require(cfg, "prompt_tokens", "workload"), "workload.prompt_tokens")
    output = _length_sampler(_require(cfg, "output_tokens", "workload"), "workload.output_tokens")
    rngs = _rngs(seed)
    # Poisson and gamma: the first request arrives after one gap (the process starts at 0 with
    # no request); constant: the first request arrives at exactly 0.
    arrivals = _synthetic_arrivals(cfg, rngs["arrival"])
    n = len(arrivals)
    return Workload(arrivals, prompt(rngs["prompt_tokens"], n), output(rngs["output_tokens"], n))


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    seed = _int(seed, "seed", minimum=0)
    children = np.random.SeedSequence(seed).spawn(len(_STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(_STREAMS, children)}


def _with_random_prefix(w: Workload, spec: Any, seed: int) -> Workload:
    """Assign each request a prefix group uniformly among `groups`, sharing `tokens` tokens."""
    where = "workload.prefix"
    _check_keys(spec, _PREFIX_KEYS, where)
    groups = _int(_require(spec, "groups", where), f"{where}.groups", minimum=1)
    tokens = _int(_require(spec, "tokens", where), f"{where}.tokens", minimum=1)
    group = _rngs(seed)["prefix"].integers(0, groups, size=len(w), dtype=np.int64)
    # A prompt shorter than the prefix is all prefix.
    return w._replace(prefix_group=group, prefix_tokens=np.minimum(tokens, w.prompt_tokens))


# ---------------------------------------------------------------- trace replay


def _trace_path(path: Any, base_dir: Path, fmt: str) -> Path:
    if not isinstance(path, (str, Path)) or not str(path):
        raise ValueError(f"workload.trace.path must be a file path, got {path!r}")
    resolved = Path(path) if Path(path).is_absolute() else base_dir / path
    if not resolved.exists():
        raise ValueError(f"workload.trace.path: {resolved} does not exist ({fmt} trace)")
    want_dir = fmt == "requests"
    if want_dir != resolved.is_dir():
        raise ValueError(f"workload.trace.path: {resolved} must be a "
                         f"{'trace directory' if want_dir else 'file'} for format {fmt}")
    return resolved


def _read_csv(path: Path, columns: tuple[str, ...]):
    """Read a CSV as text (so every cell can be checked), requiring the named columns."""
    import pandas as pd

    try:
        # utf-8-sig: a byte-order mark would otherwise glue itself to the first column name.
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True,
                         encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty file, expected a header with {', '.join(columns)}") \
            from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: malformed CSV: {e}") from None
    df.columns = [str(c).strip() for c in df.columns]
    for col in columns:
        if col not in df.columns:
            raise ValueError(f"{path}: missing column {col!r} (has {', '.join(df.columns)})")
    return df


def _csv_numbers(df, col: str, path: Path, whole: bool) -> np.ndarray:
    """A CSV column as float64; a blank, non-numeric, fractional (if whole) or negative cell
    raises naming the file, the row (1-based, after the header) and the column."""
    import pandas as pd

    text = df[col].astype(str).str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    checks = [(~np.isfinite(values), "is not a number")]
    if whole:
        with np.errstate(invalid="ignore"):
            checks.append((values != np.round(values), "is not a whole number"))
    checks.append((values < 0, "is negative"))
    for bad, why in checks:
        with np.errstate(invalid="ignore"):
            if np.any(bad):
                r = _first(bad)
                raise ValueError(f"{path}: row {r + 1} (after the header): column {col!r} value "
                                 f"{text.iloc[r]!r} {why}")
    return values


def _check_lengths(prompt: np.ndarray, output: np.ndarray, names: tuple[str, str], path: Path,
                   row_of: Callable[[int], str]) -> None:
    """Lengths must be >= 1: a 0-token prompt or output cannot be served; raise naming the row."""
    for values, name in zip((prompt, output), names):
        bad = values < 1
        if np.any(bad):
            r = _first(bad)
            raise ValueError(f"{path}: {row_of(r)}: {name} is {int(values[r])}, must be >= 1")


def _csv_row(r: int) -> str:
    return f"row {r + 1} (after the header)"


def _read_azure(path: Path, opts: dict) -> tuple:
    """Azure LLM inference trace: TIMESTAMP (datetime), ContextTokens, GeneratedTokens."""
    import pandas as pd

    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    # ISO8601 mode reads the trace's 7 fractional digits (pandas keeps nanoseconds).
    stamps = pd.to_datetime(df["TIMESTAMP"].astype(str).str.strip(), format="ISO8601",
                            errors="coerce")
    bad = stamps.isna().to_numpy()
    if np.any(bad):
        r = _first(bad)
        raise ValueError(f"{path}: {_csv_row(r)}: column 'TIMESTAMP' value "
                         f"{df['TIMESTAMP'].iloc[r]!r} is not a datetime")
    arrival = ((stamps - stamps.min()) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    prompt = _csv_numbers(df, "ContextTokens", path, whole=True)
    output = _csv_numbers(df, "GeneratedTokens", path, whole=True)
    _check_lengths(prompt, output, ("ContextTokens", "GeneratedTokens"), path, _csv_row)
    return arrival, prompt, output, None


def _read_vidur(path: Path, opts: dict) -> tuple:
    """Vidur trace CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens."""
    df = _read_csv(path, ("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
    arrival = _csv_numbers(df, "arrived_at", path, whole=False)
    prompt = _csv_numbers(df, "num_prefill_tokens", path, whole=True)
    output = _csv_numbers(df, "num_decode_tokens", path, whole=True)
    _check_lengths(prompt, output, ("num_prefill_tokens", "num_decode_tokens"), path, _csv_row)
    return arrival, prompt, output, None


def _read_burstgpt(path: Path, opts: dict) -> tuple:
    """BurstGPT CSV: Timestamp (s), Request tokens, Response tokens (Model, Log Type unused)."""
    df = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"))
    arrival = _csv_numbers(df, "Timestamp", path, whole=False)
    prompt = _csv_numbers(df, "Request tokens", path, whole=True)
    output = _csv_numbers(df, "Response tokens", path, whole=True)
    # BurstGPT logs a failed request with 0 response tokens. Dropping those rows is the one
    # filter a replay does, and only with drop_failed (default true); with drop_failed: false
    # such a row is an error like any other 0-token length, since it cannot be served as is.
    drop = opts.get("drop_failed", True)
    if not isinstance(drop, bool):
        raise ValueError(f"workload.trace.drop_failed must be true or false, got {drop!r}")
    rows = np.arange(len(df))
    if drop:
        keep = output != 0
        arrival, prompt, output, rows = arrival[keep], prompt[keep], output[keep], rows[keep]
    _check_lengths(prompt, output, ("Request tokens", "Response tokens"), path,
                   lambda r: _csv_row(int(rows[r])))
    return arrival, prompt, output, None


def _read_requests(path: Path, opts: dict) -> tuple:
    """A reasonsim trace directory's `requests` table (validated by the trace store)."""
    from traces import read_table

    table = read_table(path, "requests")
    cols = [table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            for c in ("arrival_s", "prompt_tokens", "output_tokens")]
    _check_lengths(cols[1], cols[2], ("prompt_tokens", "output_tokens"), path / "requests",
                   lambda r: f"row {r} (0-based, as the trace checker counts)")
    return cols[0], cols[1], cols[2], None


def _read_mooncake(path: Path, opts: dict) -> tuple:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""
    fields = ("timestamp", "input_length", "output_length", "hash_ids")
    arrival, prompt, output, hashes = [], [], [], []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue  # a blank (e.g. trailing) line holds no request
            where = f"{path}: line {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in fields:
                if key not in row:
                    raise ValueError(f"{where}: missing field {key!r}")
            for key, whole in (("timestamp", False), ("input_length", True),
                               ("output_length", True)):
                v = row[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{where}: field {key!r} value {v!r} is not a number")
                if v < 0:
                    raise ValueError(f"{where}: field {key!r} value {v!r} is negative")
                if whole and v != int(v):
                    raise ValueError(f"{where}: field {key!r} value {v!r} is not a whole number")
            ids = row["hash_ids"]
            if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in ids):
                raise ValueError(f"{where}: field 'hash_ids' must be a list of ints, got {ids!r}")
            for key in ("input_length", "output_length"):
                if row[key] < 1:
                    raise ValueError(f"{where}: {key} is {row[key]}, must be >= 1")
            arrival.append(row["timestamp"] / 1000.0)
            prompt.append(row["input_length"])
            output.append(row["output_length"])
            hashes.append(tuple(ids))
    # Sharing is computed after sorting and `limit`, over the requests actually replayed.
    return (np.array(arrival, dtype=np.float64), np.array(prompt, dtype=np.float64),
            np.array(output, dtype=np.float64), hashes)


def mooncake_prefixes(hash_ids: list[tuple[int, ...]], prompt_tokens: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Prefix group and shared-prefix length of each Mooncake request, from its hash_ids."""
    # Rule: prefix_group = the request's first hash_id (NO_PREFIX_GROUP when it has none);
    # prefix_tokens = 512 * (the longest run of leading hash_ids the request shares with any
    # other request of the workload), capped at its prompt length. A request whose first block
    # nobody else has gets prefix_tokens 0. Every member of a group counts its shared prefix,
    # the first arrival included (as with synthetic `prefix`): whether it hits the cache is the
    # simulator's business. Computed exactly with a trie of the hash_id sequences: walk each
    # sequence while the node below was reached by >= 2 requests.
    root: dict = {}
    counts: dict[int, int] = {}
    for ids in hash_ids:
        node = root
        for h in ids:
            node = node.setdefault(h, {})
            counts[id(node)] = counts.get(id(node), 0) + 1
    group = np.empty(len(hash_ids), dtype=np.int64)
    shared = np.empty(len(hash_ids), dtype=np.int64)
    for i, ids in enumerate(hash_ids):
        group[i] = ids[0] if ids else NO_PREFIX_GROUP
        node, depth = root, 0
        for h in ids:
            node = node[h]
            if counts[id(node)] < 2:
                break
            depth += 1
        shared[i] = min(depth * MOONCAKE_BLOCK_TOKENS, int(prompt_tokens[i]))
    return group, shared


_READERS = {"requests": _read_requests, "azure": _read_azure, "mooncake": _read_mooncake,
            "burstgpt": _read_burstgpt, "vidur": _read_vidur}
_FORMAT_KEYS = {"burstgpt": ("drop_failed",)}


def _replay(spec: Any, base_dir: Path) -> Workload:
    """A workload replayed from a trace file: its arrivals (shifted to start at 0) and lengths."""
    where = "workload.trace"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a mapping like {{format: azure, path: FILE}}, "
                         f"got {spec!r}")
    fmt = _require(spec, "format", where)
    if fmt not in _READERS:
        raise ValueError(f"{where}.format is {fmt!r}; allowed formats: {', '.join(TRACE_FORMATS)}")
    _check_keys(spec, _TRACE_KEYS + _FORMAT_KEYS.get(fmt, ()), f"{where} (format {fmt})")
    path = _trace_path(_require(spec, "path", where), base_dir, fmt)
    time_scale = _positive(spec.get("time_scale", 1.0), f"{where}.time_scale")
    limit = _int(spec["limit"], f"{where}.limit", minimum=1) if "limit" in spec else None
    arrival, prompt, output, hashes = _READERS[fmt](path, spec)
    if not len(arrival):
        raise ValueError(f"{path}: no requests in the {fmt} trace")
    # Traces are meant to be in time order, but sorting (stably: ties keep file order) costs
    # nothing and makes `limit` mean "the earliest N" whatever the file order.
    order = np.argsort(arrival, kind="stable")[:limit]
    arrival, prompt, output = arrival[order], prompt[order], output[order]
    group = shared = None
    if hashes is not None:
        group, shared = mooncake_prefixes([hashes[i] for i in order], prompt)
    # Shift so the first request arrives at 0, then stretch inter-arrival times by time_scale.
    return Workload((arrival - arrival[0]) * time_scale, prompt, output, group, shared)


# ---------------------------------------------------------------- entry points


def workload_from_config(cfg: dict, seed: int, base_dir: str | Path = ".") -> Workload:
    """Build the workload of a config's `workload:` mapping (trace paths relative to base_dir)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"workload must be a mapping, got {type(cfg).__name__}: {cfg!r}")
    if "trace" in cfg:
        _check_keys(cfg, _TRACE_FORM_KEYS, "workload (a trace replay)")
        w = _replay(cfg["trace"], Path(base_dir))
        if "prefix" in cfg and w.prefix_group is not None:
            raise ValueError("workload.prefix: this trace carries its own prefix sharing "
                             "(mooncake hash_ids); remove workload.prefix")
    else:
        w = _synthetic(cfg, seed)
    if "prefix" in cfg:
        # Random groups are drawn from `seed` even for a replayed trace, whose lengths are fixed.
        w = _with_random_prefix(w, cfg["prefix"], seed)
    return w


def workload_to_vidur_csv(w: Workload, path: str | Path) -> Path:
    """Write the workload as a Vidur trace CSV (arrived_at,num_prefill_tokens,num_decode_tokens)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # pandas writes float64 with round-trip precision, so a reload gives the same arrivals.
    pd.DataFrame({"arrived_at": w.arrival_s, "num_prefill_tokens": w.prompt_tokens,
                  "num_decode_tokens": w.output_tokens}).to_csv(path, index=False)
    return path

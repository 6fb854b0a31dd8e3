"""`reasonsim trace serve`: stream a seeded workload against an OpenAI-compatible server.

Every request is a `/v1/completions` call with a token-id prompt, `ignore_eos` and a fixed
`max_tokens`, streamed with `logprobs=0` so each chunk names the tokens it carries; the client's
receive time of each token is its `token_times` row. Requests are flushed in fixed units of
`UNIT_SIZE` request indices, so `--resume` skips finished units and re-sends unfinished ones under
the same ids (their part files are rewritten, never duplicated).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines.http_engine import http_run_row
from traces import ids
from traces.store import TraceWriter, read_table

UNIT_SIZE = 16
TOKEN_ID_RANGE = (4, 100)  # valid in any vocabulary of >= 100 tokens, incl. the testbed's


@dataclass(frozen=True)
class ServeWorkload:
    """A seeded open-loop workload: Poisson arrivals, prompt/output lengths sampled from choices."""

    num_requests: int = 32
    """requests to send"""
    rate_per_s: float = 4.0
    """Poisson arrival rate; 0 sends everything at time 0"""
    prompt_tokens: list[int] = field(default_factory=lambda: [64, 256])
    """prompt lengths to sample from"""
    output_tokens: list[int] = field(default_factory=lambda: [32, 128])
    """output lengths to sample from (ignore_eos: exactly this many)"""
    seed: int = 0
    """workload seed (arrivals, lengths, prompt ids)"""
    concurrency: int = 64
    """max requests in flight"""
    warmup_requests: int = 2
    """requests sent (and awaited) before the clock starts; not recorded. A fresh vLLM server
    spends tens of seconds on its first request, which would otherwise pollute every TTFT"""

    def __post_init__(self):
        if self.num_requests < 1 or self.rate_per_s < 0 or self.concurrency < 1:
            raise ValueError("num_requests and concurrency must be >= 1, rate >= 0")

    def requests(self) -> list[dict]:
        """The planned requests: id, arrival_s, prompt ids, output tokens."""
        rng = np.random.default_rng(self.seed)
        n = self.num_requests
        gaps = rng.exponential(1.0 / self.rate_per_s, n) if self.rate_per_s > 0 else np.zeros(n)
        arrivals = np.cumsum(gaps) - gaps[0]
        prompts = rng.choice(self.prompt_tokens, n)
        outputs = rng.choice(self.output_tokens, n)
        return [{"request_id": ids.request_id(i), "index": i, "arrival_s": float(arrivals[i]),
                 "prompt_ids": rng.integers(*TOKEN_ID_RANGE, size=int(prompts[i])).tolist(),
                 "output_tokens": int(outputs[i])} for i in range(n)]


async def _one(session, url: str, model: str, req: dict, t0: float, sem) -> tuple[dict, list]:
    """Send one request; return its requests row and its token_times rows."""
    payload = {"model": model, "prompt": req["prompt_ids"], "max_tokens": req["output_tokens"],
               "min_tokens": req["output_tokens"], "ignore_eos": True, "temperature": 0.0,
               "stream": True, "logprobs": 0, "stream_options": {"include_usage": True}}
    token_rows: list[dict] = []
    sent_s = time.perf_counter() - t0  # issue time: client-side queueing counts as latency
    async with sem:
        first_s = finish_s = None
        finish_reason = None
        usage: dict = {}
        async with session.post(f"{url}/v1/completions", json=payload) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status} for {req['request_id']}: "
                                   f"{(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                now_s = time.perf_counter() - t0
                chunk = json.loads(line[5:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    k = len((choice.get("logprobs") or {}).get("tokens") or [])
                    for _ in range(k):
                        token_rows.append({"request_id": req["request_id"],
                                           "token_index": len(token_rows), "time_s": now_s})
                    if k and first_s is None:
                        first_s = now_s
                    if choice.get("finish_reason"):
                        finish_reason, finish_s = choice["finish_reason"], now_s
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    row = {"request_id": req["request_id"], "replica_id": 0, "priority": 0,
           "cell_id": _unit(req["index"]), "arrival_s": sent_s, "scheduled_s": None,
           "first_token_s": first_s, "finish_s": finish_s or time.perf_counter() - t0,
           "prompt_tokens": int(usage.get("prompt_tokens", len(req["prompt_ids"]))),
           "output_tokens": int(usage.get("completion_tokens", len(token_rows))),
           "cached_prompt_tokens": int(cached), "finish_reason": finish_reason}
    return row, token_rows


def _unit(index: int) -> str:
    return f"u{index // UNIT_SIZE:05d}"


async def _run(url: str, model: str, todo: list[dict], writer: TraceWriter, concurrency: int,
               progress: bool, warmup_requests: int = 0) -> None:
    import aiohttp
    from rich.progress import Progress

    sem = asyncio.Semaphore(concurrency)
    left: dict[str, int] = {}
    for r in todo:
        left[_unit(r["index"])] = left.get(_unit(r["index"]), 0) + 1
    pending: dict[str, list] = {u: [] for u in left}
    t0 = 0.0  # set after warm-up; the first remaining request goes then (planned schedule kept)

    results: asyncio.Queue = asyncio.Queue()

    async def send(session, req):
        try:
            results.put_nowait(await _one(session, url, model, req, t0, sem))  # t0: closure, set below
        except Exception as e:  # hand the failure to the consumer instead of hanging it
            results.put_nowait(e)

    async def launch(session):
        tasks = []
        for req in todo:
            delay = req["arrival_s"] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, req)))
        await asyncio.gather(*tasks)

    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in range(warmup_requests):
            warm = {"request_id": f"warmup-{i}", "index": 0, "output_tokens": 4,
                    "prompt_ids": list(range(TOKEN_ID_RANGE[0], TOKEN_ID_RANGE[0] + 16))}
            await _one(session, url, model, warm, time.perf_counter(), sem)
        t0 = time.perf_counter() - (todo[0]["arrival_s"] if todo else 0.0)
        launcher = asyncio.create_task(launch(session))
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task("requests", total=len(todo))
            for _ in range(len(todo)):
                got = await results.get()
                if isinstance(got, Exception):
                    launcher.cancel()
                    raise got
                row, token_rows = got
                bar.advance(task)
                unit = row["cell_id"]
                pending[unit].append((row, token_rows))
                left[unit] -= 1
                if left[unit] == 0:  # a whole unit finished: flush it, crash-safe from here
                    for r, toks in sorted(pending.pop(unit), key=lambda x: x[0]["request_id"]):
                        writer.add("requests", **r)
                        for t in toks:
                            writer.add("token_times", **t)
                    writer.flush(unit)
        await launcher


def trace_serve(url: str, out_dir: str | Path, workload: ServeWorkload, model: str | None = None,
                resume: bool = False, progress: bool = True) -> dict:
    """Run the workload against the server and write requests and token_times; return a summary."""
    url = url.rstrip("/")
    served, run = http_run_row(url, "serve", workload.seed,
                               {"workload": asdict(workload), "url": url}, model)
    model = model or served
    writer = TraceWriter(out_dir, run, resume=resume)
    done = writer.done_units()
    todo = [r for r in workload.requests() if f"u{r['index'] // UNIT_SIZE:05d}" not in done]
    t_wall = time.perf_counter()
    asyncio.run(_run(url, model, todo, writer, workload.concurrency, progress,
                     workload.warmup_requests))
    wall_s = time.perf_counter() - t_wall
    writer.seal()
    return summarize_serve(out_dir) | {"sent": len(todo), "wall_s": round(wall_s, 2)}


def summarize_serve(trace_dir: str | Path) -> dict:
    """TTFT, TPOT and end-to-end medians of a serve trace."""
    r = read_table(trace_dir, "requests").to_pandas()
    tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1).clip(lower=1)
    return {"requests": int(len(r)), "output_tokens": int(r.output_tokens.sum()),
            "ttft_s_p50": float((r.first_token_s - r.arrival_s).median()),
            "tpot_s_p50": float(tpot.median()),
            "e2e_s_p50": float((r.finish_s - r.arrival_s).median())}

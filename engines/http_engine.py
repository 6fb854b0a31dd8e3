"""An OpenAI-compatible server as a live engine: `/v1/completions` with token-id prompts, streamed.

Each request streams on its own connection (a thread per request in flight), returning token
ids, text, and, when asked, each sampled token's log-probability. An abort closes the request's
connection, which makes a vLLM server abort it, and records it with the tokens received so far.
Only the `requests` table is recorded: a server's iterations are not visible from outside.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from urllib.parse import urlparse

from programs.base import Outcome, Sampling
from traces.provenance import cpu_count, cpu_model, run_row


class HttpEngine:
    """A model served over HTTP, speaking `engines.live_engine.LiveEngine`."""

    def __init__(self, url: str, model: str, writer, t0: float, max_in_flight: int = 64,
                 timeout_s: float = 600.0):
        parsed = urlparse(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"{url!r}: expected http://HOST:PORT of an OpenAI-compatible server")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.model = model
        self.writer = writer
        self.t0 = t0
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="http-engine")
        self._futures: dict[Future, str] = {}
        self._meta: dict[str, dict] = {}
        self._aborted: set[str] = set()
        self._lock = threading.Lock()

    def now_s(self) -> float:
        """Seconds since the run's start."""
        return time.perf_counter() - self.t0

    def add(self, request_id: str, prompt_ids: list, sampling: Sampling, priority: int,
            program_id: str, role: str) -> None:
        """Send a request now (the server's priority scheduling reads `priority`)."""
        s = sampling
        payload = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": s.max_tokens,
                   "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed,
                   "stream": True, "return_token_ids": True,
                   "stream_options": {"include_usage": True}}
        if s.stop:
            payload.update(stop=list(s.stop), include_stop_str_in_output=True)
        if s.logprobs:
            payload["logprobs"] = 0
        if priority:
            payload["priority"] = priority
        self._meta[request_id] = {"arrival_s": self.now_s(), "prompt_tokens": len(prompt_ids),
                                  "priority": priority, "program_id": program_id, "role": role}
        self._futures[self._pool.submit(self._stream, request_id, payload)] = request_id

    def abort(self, request_id: str) -> None:
        """Stop a request: its stream is closed at the next chunk and recorded as aborted."""
        with self._lock:
            self._aborted.add(request_id)

    def has_unfinished(self) -> bool:
        """True while any request is in flight."""
        return bool(self._futures)

    def step(self) -> list[tuple[str, Outcome]]:
        """Wait (briefly) for requests to finish; the finished ones, aborted ones recorded only."""
        if not self._futures:
            return []
        done, _ = wait(list(self._futures), timeout=0.05, return_when=FIRST_COMPLETED)
        out = []
        for fut in done:
            rid = self._futures.pop(fut)
            got = fut.result()  # a server error raises here, naming the request
            aborted = rid in self._aborted
            self._record(rid, got, aborted)
            if not aborted:
                eos = got["finish_reason"] == "stop" and got["stop_reason"] is None
                out.append((rid, Outcome(len(got["ids"]), token_ids=tuple(got["ids"]),
                                         text=got["text"], logprobs=tuple(got["logprobs"]),
                                         pieces=tuple(got["pieces"]), eos=eos)))
        return out

    def warm_up(self, prompt_ids: list, n: int = 4) -> None:
        """Throw-away requests (seeded sampling, log-probs), not recorded: a server's first
        requests pay one-off setup that a compared live run must not charge to its own."""
        for i in range(n):
            self._stream(f"warmup-{i}", {"model": self.model, "prompt": list(prompt_ids),
                                         "max_tokens": 8, "temperature": 0.7, "seed": i,
                                         "logprobs": 0, "stream": True,
                                         "return_token_ids": True})

    def close(self) -> None:
        """Abort what is in flight and stop the worker threads."""
        with self._lock:
            self._aborted.update(self._futures.values())
        self._pool.shutdown(wait=True)

    def _stream(self, rid: str, payload: dict) -> dict:
        got = {"ids": [], "text": "", "logprobs": [], "pieces": [], "finish_reason": None,
               "stop_reason": None, "first_token_s": None, "cached": 0}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(payload),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"http://{self.host}:{self.port}: HTTP {resp.status} for "
                                   f"{rid}: {resp.read()[:200]!r}")
            for raw in resp:
                if rid in self._aborted:
                    break  # closing the connection makes the server abort the request
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                usage = chunk.get("usage") or {}
                got["cached"] = (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens") or got["cached"]
                for choice in chunk.get("choices", []):
                    new = choice.get("token_ids") or []
                    if new and got["first_token_s"] is None:
                        got["first_token_s"] = self.now_s()
                    got["ids"] += new
                    got["text"] += choice.get("text") or ""
                    lp = choice.get("logprobs") or {}
                    got["logprobs"] += lp.get("token_logprobs") or []
                    got["pieces"] += lp.get("tokens") or []
                    if choice.get("finish_reason"):
                        got["finish_reason"] = choice["finish_reason"]
                        got["stop_reason"] = choice.get("stop_reason")
        finally:
            conn.close()
        got["finish_s"] = self.now_s()
        return got

    def _record(self, rid: str, got: dict, aborted: bool) -> None:
        m = self._meta.pop(rid)
        self.writer.add("requests", request_id=rid, replica_id=0, cell_id=None,
                        program_id=m["program_id"], role=m["role"], priority=m["priority"],
                        arrival_s=m["arrival_s"], scheduled_s=None,
                        first_token_s=got["first_token_s"], finish_s=got["finish_s"],
                        prompt_tokens=m["prompt_tokens"], output_tokens=len(got["ids"]),
                        cached_prompt_tokens=int(got["cached"]),
                        finish_reason="abort" if aborted else got["finish_reason"])


def server_model(url: str) -> tuple[str, str]:
    """(served model id, server version) of an OpenAI-compatible server."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
        models = json.loads(r.read())["data"]
    version = "unknown"
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=10) as r:
            version = json.loads(r.read()).get("version", "unknown")
    except OSError:
        pass
    if not models:
        raise ValueError(f"{url}: server lists no models")
    return models[0]["id"], version


def http_run_row(url: str, kind: str, seed: int, params: dict,
                 model: str | None = None) -> tuple[str, dict]:
    """(served model id, `runs` row) of a run against an OpenAI-compatible server."""
    host = urlparse(url).hostname or ""
    if not urlparse(url).scheme.startswith("http") or not host:
        raise ValueError(f"--url must be http(s)://host:port, got {url!r}")
    try:
        served, version = server_model(url)
    except OSError as e:
        raise ValueError(f"{url}: no OpenAI-compatible server answers ({e})") from None
    local = host in ("127.0.0.1", "localhost", "::1")
    return served, run_row(kind, "vllm-openai-http", version,
                           cpu_model() if local else f"remote {host}", cpu_count() if local else 0,
                           model or served, "remote", "server", "server", seed, params)

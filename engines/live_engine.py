"""Engines the live runner drives, behind one small interface (`LiveEngine`).

An engine takes requests as token ids with `programs.base.Sampling`, runs iterations, and
returns finished requests as raw `Outcome`s (ids, text, log-probabilities, end of sequence);
every request and iteration is recorded in the trace schema. `VllmEngine` is the in-process
vLLM engine (`engines.vllm_engine`); an HTTP (OpenAI-compatible) or PyTorch engine implements
the same five methods.
"""

from __future__ import annotations

from typing import Protocol

from programs.base import Outcome, Sampling


class LiveEngine(Protocol):
    """What the live runner needs of an engine."""

    def now_s(self) -> float: ...

    def add(self, request_id: str, prompt_ids: list, sampling: Sampling, priority: int,
            program_id: str, role: str) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[tuple[str, Outcome]]: ...

    def has_unfinished(self) -> bool: ...


def _prompt_logprob_args(s: Sampling, full: bool = False) -> dict:
    if not s.prompt_logprobs:
        return {}
    # vLLM skips the prefix cache for prompt log-probabilities unless told otherwise; a scoring
    # request needs them only for its tail (the step), so it reads the cache: positions up to
    # the cached length come back as junk, later ones exact, and junk cannot be detokenized,
    # hence detokenize=False (`docs/measurements/2026-11-23-prompt-logprobs-cache.md`).
    return {"prompt_logprobs": s.top_logprobs, "skip_reading_prefix_cache": full,
            "detokenize": False}


def _tail_logprobs(out, tail: int) -> tuple[tuple, tuple] | None:
    """The prompt's last `tail` log-probabilities and their top-k rows ({token: log-prob}), or
    None when the cache covered any of them."""
    ids, lps = out.prompt_token_ids, out.prompt_logprobs
    start = len(ids) - tail
    if start <= (out.num_cached_tokens or 0) or not lps or len(lps) != len(ids):
        return None
    rows = tuple(lps[i] for i in range(start, len(ids)))
    return tuple(r[t].logprob for r, t in zip(rows, ids[start:])), rows


def _rows(rows) -> tuple:
    return tuple({t: x.logprob for t, x in r.items()} for r in rows)


class VllmEngine:
    """The in-process vLLM engine with its step recorder, speaking `LiveEngine` (with
    `host_cpu`, a run that is not resumed: the recorder samples the host's CPU ticks)."""

    def __init__(self, engine, writer, t0: float, host_cpu: bool = False):
        from vllm import SamplingParams

        from engines.recorder import StepRecorder

        self.engine = engine
        self.rec = StepRecorder(engine, writer, t0, record_tokens=False, host_cpu=host_cpu)
        self._params = SamplingParams
        self._scored: dict[str, tuple] = {}   # engine id -> (our id, how to re-run it uncached)
        self._engine_id: dict[str, str] = {}  # our id -> engine id (differs once re-run)
        self._top: set[str] = set()          # our ids whose generated positions' rows are asked
        self.rescored = 0
        """scoring requests re-run in full: the prefix cache had covered part of their tail"""

    def now_s(self) -> float:
        """Seconds since the run's start."""
        return self.rec.now_s()

    def add(self, request_id: str, prompt_ids: list, sampling: Sampling, priority: int,
            program_id: str, role: str) -> None:
        """Queue a request (vLLM priority scheduling reads `priority`)."""
        s = sampling
        params = self._params(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                              seed=s.seed, stop=list(s.stop) or None,
                              include_stop_str_in_output=bool(s.stop),
                              logprobs=s.top_logprobs or (0 if s.logprobs else None),
                              **_prompt_logprob_args(s))
        self.rec.add(request_id, prompt_ids, params, priority=priority, program_id=program_id,
                     role=role)
        if s.prompt_logprobs:
            self._scored[request_id] = (request_id, prompt_ids, s, priority, program_id, role)
        if s.top_logprobs:
            self._top.add(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request in flight (recorded with its partial output)."""
        rid = self._engine_id.pop(request_id, request_id)
        self._scored.pop(rid, None)
        self._top.discard(request_id)
        self.rec.abort(rid)

    def step(self) -> list[tuple[str, Outcome]]:
        """One engine iteration; the requests it finished."""
        done = []
        for out in self.rec.step():
            if not out.finished:
                continue
            o = out.outputs[0]
            rid, plps, top = out.request_id, (), ()
            scored = self._scored.pop(rid, None)
            if scored is not None:
                rid = scored[0]
                self._engine_id.pop(rid, None)
                tail = _tail_logprobs(out, scored[2].prompt_logprobs)
                if tail is None:  # re-run it, reading no cache, under a derived id
                    self._rescore(*scored)
                    continue
                plps, top = tail
                top = _rows(top) if scored[2].top_logprobs else ()
            ids = tuple(o.token_ids)
            logprobs = pieces = ()
            if o.logprobs:
                lps = [lp[t] for t, lp in zip(ids, o.logprobs)]
                logprobs = tuple(x.logprob for x in lps)
                pieces = tuple(x.decoded_token or "" for x in lps)
                if rid in self._top:
                    self._top.discard(rid)
                    top += _rows(o.logprobs)
            eos = o.finish_reason == "stop" and o.stop_reason is None
            done.append((rid, Outcome(len(ids), token_ids=ids, text=o.text, logprobs=logprobs,
                                      pieces=pieces, eos=eos, prompt_logprobs=plps,
                                      top_logprobs=top,
                                      cached_tokens=int(out.num_cached_tokens or 0))))
        return done

    def _rescore(self, request_id: str, prompt_ids, s: Sampling, priority: int, program_id: str,
                 role: str) -> None:
        params = self._params(max_tokens=1, temperature=s.temperature, seed=s.seed,
                              logprobs=s.top_logprobs or None,
                              **_prompt_logprob_args(s, full=True))
        full_id = f"{request_id}~full"
        self.rescored += 1
        self._engine_id[request_id] = full_id
        self._scored[full_id] = (request_id, prompt_ids, s, priority, program_id, role)
        self.rec.add(full_id, prompt_ids, params, priority=priority, program_id=program_id,
                     role=role)

    def has_unfinished(self) -> bool:
        """True while any request is in flight."""
        return self.engine.has_unfinished()

    def hint_idle_programs(self) -> None:
        """From now on `idle` moves a program's cached blocks first in the eviction order."""
        self.engine.hint_idle_programs()

    def idle(self, program_id: str) -> None:
        """The program has no request in flight here: its cached blocks are evicted first."""
        self.engine.demote(program_id)

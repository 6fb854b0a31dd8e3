"""Engines the live runner drives, behind one small interface (`LiveEngine`).

An engine takes requests as token ids with `programs.base.Sampling`, runs iterations, and
returns finished requests as raw `Outcome`s (ids, text, log-probabilities, end of sequence);
every request and iteration is recorded in the trace schema. `VllmEngine` is the in-process
vLLM engine (`tracers.engine`); an HTTP (OpenAI-compatible) or PyTorch engine implements the same
five methods.
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


class VllmEngine:
    """The in-process vLLM engine with its step recorder, speaking `LiveEngine`."""

    def __init__(self, engine, writer, t0: float):
        from vllm import SamplingParams

        from tracers.recorder import StepRecorder

        self.engine = engine
        self.rec = StepRecorder(engine, writer, t0, record_tokens=False)
        self._params = SamplingParams

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
                              logprobs=0 if s.logprobs else None)
        self.rec.add(request_id, prompt_ids, params, priority=priority, program_id=program_id,
                     role=role)

    def abort(self, request_id: str) -> None:
        """Abort a request in flight (recorded with its partial output)."""
        self.rec.abort(request_id)

    def step(self) -> list[tuple[str, Outcome]]:
        """One engine iteration; the requests it finished."""
        done = []
        for out in self.rec.step():
            if not out.finished:
                continue
            o = out.outputs[0]
            ids = tuple(o.token_ids)
            logprobs = pieces = ()
            if o.logprobs:
                lps = [lp[t] for t, lp in zip(ids, o.logprobs)]
                logprobs = tuple(x.logprob for x in lps)
                pieces = tuple(x.decoded_token or "" for x in lps)
            eos = o.finish_reason == "stop" and o.stop_reason is None
            done.append((out.request_id, Outcome(len(ids), token_ids=ids, text=o.text,
                                                 logprobs=logprobs, pieces=pieces, eos=eos)))
        return done

    def has_unfinished(self) -> bool:
        """True while any request is in flight."""
        return self.engine.has_unfinished()

"""The PyTorch engine speaking `engines.live_engine.LiveEngine`, so the live runner drives it as
it drives vLLM: requests as token ids with `programs.base.Sampling`, seeded sampling with a
nucleus, the scheduler's priorities, aborts, stop strings and the sampled tokens'
log-probabilities; every step and request recorded in the trace schema
(`engines.pytorch.rows`).

Stop strings are found here, in the text decoded after each new token: the request ends at the
token that completes one, its text cut just after it (kept in the output, as vLLM's
`include_stop_str_in_output`). The engine has no prefix cache and returns no prompt or top-k
log-probabilities: a request asking for them is refused.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from engines.pytorch.engine import TorchEngine
from engines.pytorch.requests import Seq
from engines.pytorch.rows import BLOCK_SIZE, TorchStepWriter, kv_blocks_total
from engines.pytorch.spec import TorchSpec
from engines.vllm_engine import device_info
from programs.base import Outcome, Sampling
from traces.provenance import config_hash, run_row


class TorchLiveEngine:
    """The in-process PyTorch engine with its step rows, speaking `LiveEngine`."""

    def __init__(self, engine: TorchEngine, writer, tokenizer, t0: float | None = None):
        self.engine = engine
        self.rows = TorchStepWriter(engine, writer, time.perf_counter() if t0 is None else t0)
        self.tokenizer = tokenizer
        self._stops: dict[str, tuple[str, ...]] = {}

    def now_s(self) -> float:
        """Seconds since the run's start."""
        return self.rows.now_s()

    def add(self, request_id: str, prompt_ids: list, sampling: Sampling, priority: int,
            program_id: str, role: str) -> None:
        """Queue a request (the engine orders its waiting queue by `priority` when its
        scheduling policy is priority)."""
        s = sampling
        if s.prompt_logprobs or s.top_logprobs:
            raise ValueError(f"request {request_id}: the PyTorch engine returns no prompt or "
                             "top-k log-probabilities")
        self.rows.add(request_id, prompt_ids, s.max_tokens, None, program_id=program_id,
                      role=role, temperature=s.temperature, seed=s.seed, top_p=s.top_p,
                      priority=priority, logprobs=s.logprobs)
        if s.stop:
            self._stops[request_id] = tuple(s.stop)

    def abort(self, request_id: str) -> None:
        """Abort a request in flight (recorded with its partial output)."""
        self._stops.pop(request_id, None)
        self.rows.end(request_id, "abort")

    def step(self) -> list[tuple[str, Outcome]]:
        """One engine iteration; the requests it finished (or a stop string ended)."""
        res = self.rows.step(None)
        done = []
        for rid, seq in self.rows.done.items():
            text = self._cut(rid, self._text(seq.output_ids))[0]
            self._stops.pop(rid, None)
            done.append((rid, self._outcome(seq, text)))
        for t in res.tokens:
            if t.request_id not in self._stops:
                continue
            seq = self.engine.running_seq(t.request_id)
            text, stopped = self._cut(t.request_id, self._text(seq.output_ids))
            if stopped:
                self.rows.end(t.request_id, "stop")
                done.append((t.request_id, self._outcome(seq, text)))
        return done

    def _cut(self, request_id: str, text: str) -> tuple[str, bool]:
        """The text up to the end of its first stop string, and whether it has one (then the
        request's stop strings are forgotten)."""
        stops = self._stops.get(request_id, ())
        cut = min((text.find(x) + len(x) for x in stops if x in text), default=-1)
        if cut < 0:
            return text, False
        del self._stops[request_id]
        return text[:cut], True

    def has_unfinished(self) -> bool:
        """True while any request is in flight."""
        return self.engine.has_unfinished()

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _outcome(self, seq: Seq, text: str) -> Outcome:
        ids = tuple(seq.output_ids)
        eos = seq.stop_at_eos and bool(ids) and ids[-1] == self.engine.config.eos_token_id
        logprobs = pieces = ()
        if seq.logprobs:
            logprobs = tuple(seq.output_logprobs)
            pieces = tuple(self.tokenizer.decode([t]) for t in ids)
        return Outcome(len(ids), token_ids=ids, text=text, logprobs=logprobs, pieces=pieces,
                       eos=eos)


def reasoning_torch_engine(model_dir: str, seed: int, device: str = "auto",
                           max_num_seqs: int = 16, scheduling_policy: str = "fcfs",
                           max_model_len: int = 1024) -> TorchEngine:
    """The PyTorch engine reasoning programs run on (probes traces, program replays): its
    serving mode, sized as `engines.vllm_engine.reasoning_engine`'s sequences and context."""
    return TorchEngine(TorchSpec(model=str(model_dir), device=device, seed=seed,
                                 max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                 max_num_batched_tokens=2048, serving=True,
                                 scheduling_policy=scheduling_policy))


def torch_params(engine: TorchEngine) -> dict:
    """The engine's parameters for a run's params_json (as `Engine.params` gives vLLM's)."""
    return {**asdict(engine.spec), "block_size": BLOCK_SIZE,
            "kv_blocks_total": kv_blocks_total(engine), "enable_prefix_caching": False,
            "resolved_device": str(engine.device)}


def torch_run_row(engine: TorchEngine, kind: str, seed: int, params: dict) -> dict:
    """A `runs` row for a run of the PyTorch engine (its model, device, version)."""
    import torch

    dev, count = device_info()
    return run_row(kind, "torch", torch.__version__, dev, count, engine.spec.model,
                   config_hash(engine.spec.model), str(engine.dtype).removeprefix("torch."),
                   engine.spec.load_format, seed, params)

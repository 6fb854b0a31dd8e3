"""`reasonsim trace spec --engine torch`: greedy draft-model speculative decoding on two PyTorch
engines, where vLLM does not run (the GPU machines we reach).

The same trace as `trace spec` (`tracers/spec.py`) records from vLLM: each round the draft
proposes K tokens per running sequence (K batched decode steps of the draft engine), the target
verifies them in one batched forward over K + 1 positions (`TorchEngine.extend`), keeps the
accepted prefix and one token of its own, and both engines roll back what was rejected
(`set_context`). Acceptance is greedy (temperature 0), so the output equals the target's own
greedy output token for token. With random weights (`--load-format dummy`, a real draft/target
shape pair) almost nothing is accepted: such a trace calibrates draft and verify times, not
acceptance.

Rows: `steps` (a round is one step, draft + verify; a wave's prefill is one too), `requests`,
`spec_steps` (per request per round: proposed, accepted, the round's draft ms and the rest).
Cells are vLLM's: `k{K}-t0-b{batch}-w{first question}`, so `calibrate --spec-k K` and `seed
offline` read either trace.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines.vllm_engine import device_info
from tracers.spec import MAX_MODEL_LEN, SpecWorkload
from testbed import lm, tasks
from engines.pytorch.engine import TorchEngine
from engines.pytorch.rows import BLOCK_SIZE
from engines.pytorch.spec import TorchSpec
from traces import ids
from traces.provenance import config_hash, run_row
from traces.store import TraceWriter, check_out_dir


@dataclass
class _Request:
    rid: str
    item: tasks.Item
    prompt_len: int
    arrival_s: float
    out: list[int] = field(default_factory=list)
    rounds: int = 0
    first_token_s: float = 0.0


class SpecPair:
    """A draft and a target engine decoding the same sequences speculatively (greedy)."""

    def __init__(self, target: TorchEngine, draft: TorchEngine, max_tokens: int):
        if target.config.vocab_size > draft.config.vocab_size:
            raise ValueError(f"draft vocabulary {draft.config.vocab_size} is smaller than the "
                             f"target's {target.config.vocab_size}")
        self.target, self.draft, self.max_tokens = target, draft, max_tokens
        eos = target.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.live: dict[str, _Request] = {}
        self.draft_kv: dict[str, int] = {}

    def start(self, wave: list[_Request], prompts: list[list[int]]) -> tuple[float, list]:
        """Prefill a wave on both engines (the target's first token is each output's first);
        (ms, requests finished at once)."""
        if len(self.live) + len(wave) > self.target.spec.max_num_seqs:
            raise ValueError(f"a wave of {len(wave)} over {len(self.live)} live sequences "
                             f"exceeds the engines' {self.target.spec.max_num_seqs} slots")
        t0 = time.perf_counter()
        for r, p in zip(wave, prompts):
            self.target.add(r.rid, p, self.max_tokens, stop_at_eos=False)
            self.draft.add(r.rid, p, self.draft.spec.max_model_len - len(p), stop_at_eos=False)
        res = self.target.step()
        self.draft.step()
        now = time.perf_counter()
        first = {t.request_id: t.token_id for t in res.tokens}
        for r in wave:
            r.out, r.first_token_s = [first[r.rid]], now
            self.live[r.rid] = r
            self.draft_kv[r.rid] = r.prompt_len
            self._sync_draft(r)
        return (now - t0) * 1e3, self._finish([r for r in wave if self._done(r)])

    def round(self, k: int) -> tuple[float, float, dict[str, int], list]:
        """One speculative round over every live sequence: (draft ms, verify ms, accepted per
        request, requests finished)."""
        live = list(self.live.values())
        draft_ms = 0.0
        lag = {r.rid: r.out[-2:-1] for r in live if self.draft_kv[r.rid] < self._kv(r)}
        if lag:  # every proposal was accepted last round: the draft lacks the last one's KV
            _, ms = self.draft.extend(lag)
            draft_ms += ms
            for rid in lag:
                self.draft_kv[rid] += 1
        for _ in range(k):
            draft_ms += self.draft.step().duration_ms
        proposals = {r.rid: self.draft.running_output_ids(r.rid)[-k:] for r in live}
        greedy, verify_ms = self.target.extend({r.rid: [r.out[-1]] + proposals[r.rid]
                                                for r in live})
        accepted = {}
        for r in live:
            prop, tgt = proposals[r.rid], greedy[r.rid]
            m = 0
            while m < k and prop[m] == tgt[m]:
                m += 1
            accepted[r.rid] = m
            kv_before = self._kv(r)
            new = prop[:m] + [tgt[m]]
            for j, tok in enumerate(new):
                if tok in self.eos:
                    new = new[:j + 1]
                    break
            r.out += new[:self.max_tokens - len(r.out)]
            r.rounds += 1
            # the draft fed the last token and proposals 1..K-1: valid up to the accepted ones
            self.draft_kv[r.rid] = min(kv_before + k, kv_before + 1 + m)
            self.target.set_context(r.rid, r.out, self._kv(r))
            self._sync_draft(r)
        return draft_ms, verify_ms, accepted, self._finish([r for r in live if self._done(r)])

    def _kv(self, r: _Request) -> int:
        """Tokens whose KV a caught-up engine holds: all but the last output token."""
        return r.prompt_len + len(r.out) - 1

    def _sync_draft(self, r: _Request) -> None:
        self.draft_kv[r.rid] = min(self.draft_kv[r.rid], self._kv(r))
        self.draft.set_context(r.rid, r.out, self.draft_kv[r.rid])

    def _done(self, r: _Request) -> bool:
        return len(r.out) >= self.max_tokens or r.out[-1] in self.eos

    def _finish(self, done: list[_Request]) -> list[_Request]:
        for r in done:
            self.target.release(r.rid)
            self.draft.release(r.rid)
            del self.live[r.rid], self.draft_kv[r.rid]
        return done


def trace_torch_spec(target: str, draft: str, out_dir: str | Path, workload: SpecWorkload,
                     load_format: str = "auto", progress: bool = True) -> dict:
    """Record greedy speculative decoding for each K x batch size on the PyTorch engine."""
    import torch

    if any(t != 0 for t in workload.temperatures):
        raise ValueError("trace spec --engine torch: greedy acceptance only (--temperatures 0)")
    out_dir = check_out_dir(out_dir, False, can_resume=False)
    max_len = MAX_MODEL_LEN + max(workload.k_values) + 1  # a verify runs K + 1 past the output
    specs = [TorchSpec(model=m, load_format=load_format, seed=workload.seed,
                       max_num_seqs=max(workload.batch_sizes), max_model_len=max_len,
                       max_num_batched_tokens=max_len * max(workload.batch_sizes))
             for m in (target, draft)]
    tgt, drf = TorchEngine(specs[0]), TorchEngine(specs[1])
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    items = tasks.items(workload.seed, max(workload.questions_per_wave, n_cells))
    prompts = {n: _prompts(items, n, workload.seed) for n in workload.prompt_tokens}
    params = {"workload": asdict(workload), "draft": {"model_id": draft},
              "engine": {**asdict(specs[0]), "block_size": BLOCK_SIZE,
                         "kv_blocks_total": specs[0].max_num_seqs * max_len // BLOCK_SIZE,
                         "resolved_device": str(tgt.device)}}
    device, count = device_info()
    writer = TraceWriter(out_dir, run_row("spec", "torch", torch.__version__, device, count,
                                          target, config_hash(target),
                                          str(tgt.dtype).removeprefix("torch."), load_format,
                                          workload.seed, params))
    rec = _Recorder(writer, str(draft), str(target), time.perf_counter())
    _warm_up(SpecPair(tgt, drf, 8), prompts[workload.prompt_tokens[0]], workload.k_values[0])
    for k in workload.k_values:
        pair = SpecPair(tgt, drf, workload.max_tokens)
        for batch, n in ((b, n) for n in workload.prompt_tokens for b in workload.batch_sizes):
            for w0 in range(0, workload.questions_per_wave, batch):
                unit = f"k{k}-t0-b{batch}-w{w0}" + (f"-p{n}" if n else "")
                wave = range(w0, min(w0 + batch, workload.questions_per_wave))
                rec.run_wave(pair, k, unit, [(qi, items[qi], prompts[n][qi]) for qi in wave])
                writer.flush(unit)
        if progress:
            print(f"spec (torch): K = {k}: {rec.stats['rounds']} rounds", flush=True)
    writer.seal()
    return {**rec.stats, "device": device,
            "wall_s": round(time.perf_counter() - rec.t0, 2)}


class _Recorder:
    """Writes a wave's steps, spec_steps and requests rows on one clock."""

    def __init__(self, writer: TraceWriter, draft_id: str, target_id: str, t0: float):
        self.writer, self.draft_id, self.target_id, self.t0 = writer, draft_id, target_id, t0
        self.step_id = 0
        self.stats = {"requests": 0, "rounds": 0, "spec_rows": 0, "accepted_tokens": 0}

    def run_wave(self, pair: SpecPair, k: int, unit: str, wave: list) -> None:
        """Prefill the wave, then rounds until every request finishes."""
        reqs = [_Request(f"{unit}-{ids.question_id(qi, it.family, it.level)}", it, len(p),
                         time.perf_counter() - self.t0) for qi, it, p in wave]
        start = time.perf_counter()
        ms, done = pair.start(reqs, [p for _, _, p in wave])
        self._step(unit, start, ms, reqs, prefill=True)
        self._requests(done, unit, pair.eos)
        while pair.live:
            start = time.perf_counter()
            live = list(pair.live.values())
            draft_ms, verify_ms, accepted, done = pair.round(k)
            step_ms = (time.perf_counter() - start) * 1e3
            for r in live:
                m = accepted[r.rid]
                self.writer.add("spec_steps", request_id=r.rid, draft_model_id=self.draft_id,
                                target_model_id=self.target_id, replica_id=0,
                                step_id=self.step_id, step_index=r.rounds - 1,
                                proposed_tokens=k, accepted_tokens=m,
                                accepted_positions=[i < m for i in range(k)],
                                num_speculative_tokens=k, temperature=0.0,
                                family=r.item.family, difficulty=r.item.level,
                                draft_ms=draft_ms, verify_ms=max(0.0, step_ms - draft_ms))
                self.stats["accepted_tokens"] += m
            self.stats["spec_rows"] += len(live)
            self.stats["rounds"] += 1
            self._step(unit, start, step_ms, live, prefill=False)
            self._requests(done, unit, pair.eos)

    def _step(self, unit: str, start: float, ms: float, reqs: list[_Request],
              prefill: bool) -> None:
        ctx = [r.prompt_len + len(r.out) for r in reqs]
        self.writer.add("steps", replica_id=0, step_id=self.step_id, cell_id=unit,
                        start_s=start - self.t0, duration_ms=ms,
                        prefill_tokens=sum(r.prompt_len for r in reqs) if prefill else 0,
                        prefill_seqs=len(reqs) if prefill else 0,
                        decode_seqs=0 if prefill else len(reqs), num_running=len(reqs),
                        num_waiting=0, context_tokens=sum(ctx),
                        kv_blocks_used=sum(-(-c // BLOCK_SIZE) for c in ctx),
                        kv_blocks_total=0, preemptions=0, is_warmup=False)
        self.step_id += 1

    def _requests(self, done: list[_Request], unit: str, eos: set[int]) -> None:
        end_s = time.perf_counter() - self.t0
        for r in done:
            self.writer.add("requests", request_id=r.rid, replica_id=0, cell_id=unit,
                            program_id=None, role="main", priority=0, arrival_s=r.arrival_s,
                            scheduled_s=r.arrival_s, first_token_s=r.first_token_s - self.t0,
                            finish_s=end_s, prompt_tokens=r.prompt_len,
                            output_tokens=len(r.out), cached_prompt_tokens=0,
                            finish_reason="stop" if r.out[-1] in eos else "length")
            self.stats["requests"] += 1


def _prompts(items: list, n: int, seed: int) -> list[list[int]]:
    """The question itself (n = 0, as the testbed models read it) or n tokens cut from the
    testbed's questions."""
    if n == 0:
        return [lm.encode(it.prompt) for it in items]
    return tasks.testbed_prompts(_CharTokenizer(), [n] * len(items), seed, items)


class _CharTokenizer:
    """The testbed's character tokenizer behind the `encode` that `testbed_prompts` calls."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return lm.encode(text)


def _warm_up(pair: SpecPair, prompts: list[list[int]], k: int) -> None:
    """A throw-away wave: the first forwards of fresh engines pay one-off setup."""
    n = min(2, pair.target.spec.max_num_seqs)  # a batch-1 grid has one slot
    reqs = [_Request(f"warmup-{i}", None, len(p), 0.0) for i, p in enumerate(prompts[:n])]
    pair.start(reqs, prompts[:n])
    while pair.live:
        pair.round(k)

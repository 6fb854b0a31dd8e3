"""`reasonsim trace probes`: probe-in-the-middle traces of chain-of-thought on real vLLM.

For each question x sample, the reasoning is decoded in chunks of `stride_tokens` up to a budget,
and after every chunk a probe request (reasoning so far + the probe suffix, up to `probe_tokens`)
asks for the current answer. Nothing stops early, so any window/interval policy can be replayed
counterfactually from the trace.

Every chunk is its own request whose prompt is the question plus the reasoning so far, sampled
with a seed derived from (request seed, chunk index): the trajectory is a deterministic function of
the request seed and the stride, so a live replay with the same seeds reproduces it token for
token. Prefix caching makes the re-sent prefix cheap for both chunks and probes. Chunk i+1 and the
probe after chunk i depend only on chunk i, so they go to the engine together.

Storage is incremental: each probe row holds only the chunk generated since the previous probe.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from policies.certaindex import PROBE_SUFFIX, probe_from_text
from engines.vllm_engine import check_model, reasoning_engine
from testbed import tasks
from traces import ids
from traces.seeds import chunk_seed, request_seed
from traces.store import TraceWriter, check_out_dir


@dataclass(frozen=True)
class ProbeWorkload:
    """Which questions, how many samples, and how the reasoning is chunked and probed."""

    questions_per_cell: int = 4
    """held-out testbed questions per task family x difficulty level"""
    samples: int = 4
    """reasoning samples per question (each with its own seed)"""
    stride_tokens: int = 16
    """reasoning tokens between probes"""
    budget_tokens: int = 256
    """reasoning token budget per sample"""
    probe_tokens: int = 20
    """tokens a probe may generate"""
    temperature: float = 0.7
    """reasoning temperature"""
    probe_temperature: float = 0.6
    """probe temperature (the public reference's)"""
    probe_top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("questions_per_cell", "samples", "stride_tokens", "budget_tokens",
                     "probe_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class _Trajectory:
    question_id: str
    sample_id: int
    seed: int
    item: tasks.Item
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # reasoning token ids so far
    text: str = ""
    tokens: int = 0
    chunks: int = 0
    finished: str | None = None  # finish reason once done
    last_probe_at: int = 0  # characters of `text` already stored in a probe row

    @property
    def request_id(self) -> str:
        return ids.trajectory_id(self.question_id, self.sample_id)


def trace_probes(model: str, out_dir: str | Path, workload: ProbeWorkload, resume: bool = False,
                 kv_cache_gb: float = 1.0, progress: bool = True) -> dict:
    """Record probes and trajectories of every question x sample; return a summary."""
    model_dir = check_model(model, "auto")
    out_dir = check_out_dir(out_dir, resume)
    from vllm import SamplingParams

    from engines.recorder import StepRecorder

    engine = reasoning_engine(model_dir, workload.seed, kv_cache_gb)
    run = engine.run_row("probes", workload.seed, {"workload": asdict(workload), "engine": engine.params(),
                                  "probe_suffix": PROBE_SUFFIX})
    writer = TraceWriter(out_dir, run, resume=resume)
    done = writer.done_units()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    held = tasks.items(workload.seed, workload.questions_per_cell * n_cells)
    t0 = time.perf_counter()
    rec = StepRecorder(engine, writer, t0, record_tokens=False)
    tokenizer = engine.engine.get_tokenizer()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    suffix_ids = encode(PROBE_SUFFIX)
    stats = {"trajectories": 0, "probes": 0}

    from rich.progress import Progress

    # One unit per question: a killed trace resumes at the first unfinished question.
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("tracing probes", total=len(held))
        for qi, item in enumerate(held):
            qid = ids.question_id(qi, item.family, item.level)
            if qid in done:
                bar.advance(task)
                continue
            trajs = [_Trajectory(qid, s, request_seed(workload.seed, qi, s), item,
                                 encode(item.prompt)) for s in range(workload.samples)]
            _run_question(rec, trajs, workload, SamplingParams, suffix_ids, tokenizer.eos_token_id,
                          stats)
            for tr in trajs:
                final = tasks.extract_boxed(tr.text)
                writer.add("trajectories", question_id=qid, sample_id=tr.sample_id,
                           request_id=tr.request_id, request_seed=tr.seed, family=item.family,
                           difficulty=item.level, prompt_tokens=len(tr.prompt_ids),
                           reasoning_tokens=tr.tokens, gold_answer=item.answer,
                           final_answer=final, is_correct=final == item.answer,
                           finish_reason=tr.finished)
            stats["trajectories"] += len(trajs)
            writer.flush(qid)
            bar.advance(task)
    writer.seal()
    stats["wall_s"] = round(time.perf_counter() - t0, 2)
    return stats


def _run_question(rec, trajs: list[_Trajectory], wl: ProbeWorkload, SamplingParams,
                  suffix_ids: list[int], eos_id: int | None, stats: dict) -> None:
    """Decode every sample of one question chunk by chunk, probing after each chunk."""
    # request id -> (kind, trajectory, sent at, reasoning tokens and characters when sent)
    pending: dict[str, tuple[str, _Trajectory, float, int, int]] = {}

    def send_chunk(tr: _Trajectory) -> None:
        n = min(wl.stride_tokens, wl.budget_tokens - tr.tokens)
        sp = SamplingParams(max_tokens=n, temperature=wl.temperature, top_p=1.0,
                            seed=chunk_seed(tr.seed, tr.chunks))
        rid = ids.chunk_id(tr.request_id, tr.chunks)
        rec.add(rid, tr.prompt_ids + tr.ids, sp, program_id=tr.request_id, role="main")
        pending[rid] = ("chunk", tr, rec.now_s(), tr.tokens, len(tr.text))

    def send_probe(tr: _Trajectory) -> None:
        sp = SamplingParams(max_tokens=wl.probe_tokens, temperature=wl.probe_temperature,
                            top_p=wl.probe_top_p, seed=chunk_seed(tr.seed, -1 - tr.chunks))
        rid = ids.probe_id(tr.request_id, tr.chunks)
        rec.add(rid, tr.prompt_ids + tr.ids + suffix_ids, sp,
                program_id=tr.request_id, role="probe")
        pending[rid] = ("probe", tr, rec.now_s(), tr.tokens, len(tr.text))

    for tr in trajs:
        send_chunk(tr)
    while pending:
        for out in rec.step():
            if not out.finished or out.request_id not in pending:
                continue
            # The next chunk may finish before this probe: use the state at sending time.
            kind, tr, sent_s, position, chars = pending.pop(out.request_id)
            text = out.outputs[0].text
            if kind == "probe":
                probe = probe_from_text(position, text)
                rec.writer.add("probes", question_id=tr.question_id, sample_id=tr.sample_id,
                               request_id=tr.request_id, request_seed=tr.seed,
                               position_tokens=position, probe_text=text,
                               answer=probe.answer or None, is_hesitant=probe.hesitant,
                               is_empty=not probe.answer,
                               is_correct=probe.answer == tr.item.answer,
                               probe_tokens=len(out.outputs[0].token_ids),
                               probe_latency_ms=(rec.now_s() - sent_s) * 1e3,
                               cached_prompt_tokens=int(out.num_cached_tokens or 0),
                               chunk_text=tr.text[tr.last_probe_at:chars])
                tr.last_probe_at = chars
                stats["probes"] += 1
                continue
            new_ids = list(out.outputs[0].token_ids)
            tr.tokens += len(new_ids)
            if new_ids and new_ids[-1] == eos_id:
                new_ids.pop()  # the end-of-sequence token is not reasoning to re-send
            tr.ids += new_ids
            tr.text += text
            tr.chunks += 1
            if out.outputs[0].finish_reason == "stop":
                tr.finished = "stop"
            elif tr.tokens >= wl.budget_tokens:
                tr.finished = "length"
            # Probe the reasoning so far; continue it in the same batch unless it is done.
            send_probe(tr)
            if tr.finished is None:
                send_chunk(tr)

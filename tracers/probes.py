"""`reasonsim trace probes`: probe-in-the-middle traces of chain-of-thought on a real engine
(vLLM, or the PyTorch engine where vLLM cannot run), driven through `LiveEngine`.

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

from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines.reasoning_engines import open_reasoning_engine
from engines.model_dir import check_model
from policies.certaindex import PROBE_SUFFIX, probe_from_text
from programs.base import Sampling
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
                 kv_cache_gb: float = 1.0, progress: bool = True, engine: str = "vllm",
                 device: str = "auto") -> dict:
    """Record probes and trajectories of every question x sample on vLLM, or on the PyTorch
    engine's serving mode (`engine="torch"`, on `device`); return a summary."""
    model_dir = check_model(model, "auto")
    out_dir = check_out_dir(out_dir, resume)
    params = {"workload": asdict(workload), "probe_suffix": PROBE_SUFFIX}
    live, writer, tokenizer = open_reasoning_engine(engine, model_dir, workload.seed, "probes",
                                                    params, out_dir, resume, kv_cache_gb, device)
    done = writer.done_units()
    n_cells = len(tasks.FAMILIES) * len(tasks.LEVELS)
    held = tasks.items(workload.seed, workload.questions_per_cell * n_cells)

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
            _run_question(live, writer, trajs, workload, suffix_ids, stats)
            for tr in trajs:
                _trajectory_row(writer, tr)
            stats["trajectories"] += len(trajs)
            writer.flush(qid)
            bar.advance(task)
    writer.seal()
    stats["wall_s"] = round(live.now_s(), 2)
    return stats


def _trajectory_row(writer: TraceWriter, tr: _Trajectory) -> None:
    final = tasks.extract_boxed(tr.text)
    writer.add("trajectories", question_id=tr.question_id, sample_id=tr.sample_id,
               request_id=tr.request_id, request_seed=tr.seed, family=tr.item.family,
               difficulty=tr.item.level, prompt_tokens=len(tr.prompt_ids),
               reasoning_tokens=tr.tokens, gold_answer=tr.item.answer, final_answer=final,
               is_correct=final == tr.item.answer, finish_reason=tr.finished)


def _run_question(live, writer: TraceWriter, trajs: list[_Trajectory], wl: ProbeWorkload,
                  suffix_ids: list[int], stats: dict) -> None:
    """Decode every sample of one question chunk by chunk, probing after each chunk."""
    # request id -> (kind, trajectory, sent at, reasoning tokens and characters when sent)
    pending: dict[str, tuple[str, _Trajectory, float, int, int]] = {}

    def send_chunk(tr: _Trajectory) -> None:
        n = min(wl.stride_tokens, wl.budget_tokens - tr.tokens)
        rid = ids.chunk_id(tr.request_id, tr.chunks)
        live.add(rid, tr.prompt_ids + tr.ids, Sampling(n, wl.temperature, 1.0,
                                                       chunk_seed(tr.seed, tr.chunks)),
                 0, tr.request_id, "main")
        pending[rid] = ("chunk", tr, live.now_s(), tr.tokens, len(tr.text))

    def send_probe(tr: _Trajectory) -> None:
        rid = ids.probe_id(tr.request_id, tr.chunks)
        live.add(rid, tr.prompt_ids + tr.ids + suffix_ids,
                 Sampling(wl.probe_tokens, wl.probe_temperature, wl.probe_top_p,
                          chunk_seed(tr.seed, -1 - tr.chunks)), 0, tr.request_id, "probe")
        pending[rid] = ("probe", tr, live.now_s(), tr.tokens, len(tr.text))

    for tr in trajs:
        send_chunk(tr)
    while pending:
        for rid, out in live.step():
            if rid not in pending:
                continue
            # The next chunk may finish before this probe: use the state at sending time.
            kind, tr, sent_s, position, chars = pending.pop(rid)
            if kind == "probe":
                _probe_row(writer, tr, out, position, chars, (live.now_s() - sent_s) * 1e3)
                stats["probes"] += 1
                continue
            new_ids = list(out.token_ids)
            tr.tokens += len(new_ids)
            if out.eos:
                new_ids.pop()  # the end-of-sequence token is not reasoning to re-send
            tr.ids += new_ids
            tr.text += out.text
            tr.chunks += 1
            if out.eos:
                tr.finished = "stop"
            elif tr.tokens >= wl.budget_tokens:
                tr.finished = "length"
            # Probe the reasoning so far; continue it in the same batch unless it is done.
            send_probe(tr)
            if tr.finished is None:
                send_chunk(tr)


def _probe_row(writer: TraceWriter, tr: _Trajectory, out, position: int, chars: int,
               latency_ms: float) -> None:
    probe = probe_from_text(position, out.text)
    writer.add("probes", question_id=tr.question_id, sample_id=tr.sample_id,
               request_id=tr.request_id, request_seed=tr.seed, position_tokens=position,
               probe_text=out.text, answer=probe.answer or None, is_hesitant=probe.hesitant,
               is_empty=not probe.answer, is_correct=probe.answer == tr.item.answer,
               probe_tokens=out.tokens, probe_latency_ms=latency_ms,
               cached_prompt_tokens=out.cached_tokens,
               chunk_text=tr.text[tr.last_probe_at:chars])
    tr.last_probe_at = chars

"""A live run's speed probe: a fixed decode workload run just before and just after the run.

A shared machine's speed drifts by ±10% within minutes (`benchmarks/speed_spells.py`): the
calibration traffic of one fidelity run decoded at 1.06-1.12x of its fit, live runs minutes later
at 0.80-0.98x. The probe measures that level without looking at the run itself: the same
decode batches every time, on the run's own warmed engine, recorded in the `speed_probe` table.
`sim.step_time.live_speed.probe_level` prices its steps with a calibration; their median ratio is
the machine's speed of the moment, against which a simulation can be leveled and the rest of the
model judged.

Then one-prompt prefills of fixed lengths, a few times each: the machine's speed for prefills
moves on its own (compute-bound where decodes are memory-bound). In one full fidelity run every
live prefill ran at 1.11-1.35x of the model through both passes while decodes held at 1.0x,
and a check after it found a 64-token prefill at 4.3 ms where it took 3.1 ms hours before: the
decode probe alone saw nothing. Each prompt is new random tokens (no prefix-cache hits), and
a length's first run in a process is a never-run shape, which `probe_level` leaves out.
"""

from __future__ import annotations

import numpy as np

from traces.store import TraceWriter
from engines.vllm_engine import FIRST_TOKEN_ID, Engine

BATCHES = (1, 4, 8)
"""decode batch sizes the probe runs, one after another"""
PROMPT_TOKENS = 32
DECODE_TOKENS = 100
"""tokens each probe sequence decodes (a phase is about 0.8 s on the testbed target)"""
PREFILL_TOKENS = (64, 256, 1024)
"""one-prompt prefills the probe runs after the decode batches (those the engine's limits
allow), PREFILL_REPEATS times each"""
PREFILL_REPEATS = 4


def run_speed_probe(engine: Engine, writer: TraceWriter, phase: str, max_num_seqs: int,
                    seed: int = 0) -> int:
    """Run the probe's decode batches, then its prefills, on `engine` (nothing else in flight)
    and write each iteration as a `speed_probe` row of `phase`; the number of rows."""
    from vllm import SamplingParams

    if engine.has_unfinished():
        raise RuntimeError("speed probe: the engine has requests in flight")
    vocab = int(engine.engine.vllm_config.model_config.get_vocab_size())
    rng = np.random.default_rng(seed)

    def prompt(tokens: int) -> list[int]:
        return rng.integers(FIRST_TOKEN_ID, vocab, size=tokens).tolist()

    decode = SamplingParams(max_tokens=DECODE_TOKENS, min_tokens=DECODE_TOKENS, ignore_eos=True,
                            temperature=0.0, detokenize=False)
    index = 0
    for batch in BATCHES:
        names = [f"speed-probe-{phase}-{batch}-{i}" for i in range(min(batch, max_num_seqs))]
        for name in names:
            engine.add(name, prompt(PROMPT_TOKENS), decode)
        index = _drain(engine, writer, phase, index, names)
    first_token = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    # a prompt the engine takes whole in one step (a chunked one would be another shape)
    longest = min(engine.spec.max_model_len - 1, engine.max_num_batched_tokens)
    for tokens in (t for t in PREFILL_TOKENS if t <= longest):
        for i in range(PREFILL_REPEATS):
            name = f"speed-probe-{phase}-prefill-{tokens}-{i}"
            engine.add(name, prompt(tokens), first_token)
            index = _drain(engine, writer, phase, index, [name])
    return index


def _drain(engine: Engine, writer: TraceWriter, phase: str, index: int, names: list[str]) -> int:
    """Step until the probe requests `names` finish, writing each iteration; the next index."""
    while engine.has_unfinished():
        _, _, dt, sched = engine.step()
        if sched is None:
            continue
        writer.add("speed_probe", phase=phase, step_index=index, duration_ms=dt * 1e3,
                   **{k: sched[k] for k in ("prefill_tokens", "prefill_seqs", "decode_seqs",
                                            "context_tokens")})
        index += 1
    for name in names:
        engine.forget(name)
    return index

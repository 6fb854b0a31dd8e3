"""A live run's speed probe: a fixed decode workload run just before and just after the run.

A shared machine's speed drifts by ±10% within minutes (`benchmarks/speed_spells.py`): the
calibration traffic of one fidelity run decoded at 1.06-1.12x of its fit, live runs minutes later
at 0.80-0.98x. The probe measures that level without looking at the run itself: the same
decode batches every time, on the run's own warmed engine, recorded in the `speed_probe` table.
`sim.live_speed.probe_level` prices its steps with a calibration; their median ratio is the
machine's speed of the moment, against which a simulation can be leveled and the rest of the
model judged.
"""

from __future__ import annotations

import numpy as np

from traces.store import TraceWriter
from tracers.engine import Engine
from tracers.step_profile import FIRST_TOKEN_ID

BATCHES = (1, 4, 8)
"""decode batch sizes the probe runs, one after another"""
PROMPT_TOKENS = 32
DECODE_TOKENS = 100
"""tokens each probe sequence decodes (a phase is about 0.8 s on the testbed target)"""


def run_speed_probe(engine: Engine, writer: TraceWriter, phase: str, max_num_seqs: int,
                    seed: int = 0) -> int:
    """Run the probe's decode batches on `engine` (nothing else in flight) and write each
    iteration as a `speed_probe` row of `phase`; the number of rows."""
    from vllm import SamplingParams

    if engine.has_unfinished():
        raise RuntimeError("speed probe: the engine has requests in flight")
    vocab = int(engine.engine.vllm_config.model_config.get_vocab_size())
    rng = np.random.default_rng(seed)
    sp = SamplingParams(max_tokens=DECODE_TOKENS, min_tokens=DECODE_TOKENS, ignore_eos=True,
                        temperature=0.0, detokenize=False)
    index = 0
    for batch in BATCHES:
        names = [f"speed-probe-{phase}-{batch}-{i}" for i in range(min(batch, max_num_seqs))]
        for name in names:
            engine.add(name, rng.integers(FIRST_TOKEN_ID, vocab, size=PROMPT_TOKENS).tolist(), sp)
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

"""The tokens a PyTorch engine step attends over: its decode batch padded to its longest sequence.

In the engine's HELIOS mode (`engines/pytorch/engine.py`, `_forward`) a decode step runs one
attention over the batch with one mask: every sequence attends over the span of the batch's
longest (`span = max(length) + 1`), so the step's attention work is decode sequences x that
span, not the batch's summed context; each admitted prompt prefills in its own forward, over
its own tokens. The layered step model (`sim.step_time.layered`) takes this as its context
feature: a trace's stream admits prompts as slots free (old and new sequences in one batch),
a HELIOS round admits its prompts together, and the same summed context costs them differently
(`docs/measurements/2026-12-06-family-replays.md`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def attended_tokens(steps: pd.DataFrame, requests: pd.DataFrame) -> np.ndarray:
    """Per step of one engine's run (`steps` in step order, one cell), the tokens it attended
    over: its decode sequences x the longest one's span, plus the prompts it prefilled. Each
    request (`requests` of that run and engine) is prefilled by the step during which its first
    token came and decodes in every later step up to the one during which it finished."""
    starts = steps.start_s.to_numpy()
    first = np.searchsorted(starts, requests.first_token_s.to_numpy(), "right") - 1
    last = np.searchsorted(starts, requests.finish_s.to_numpy(), "right") - 1
    n = len(steps)
    decoding, longest, prefilled = np.zeros(n), np.zeros(n), np.zeros(n)
    for a, f, prompt in zip(first, last, requests.prompt_tokens.to_numpy()):
        prefilled[a] += prompt
        later = np.arange(a + 1, f + 1)
        decoding[later] += 1
        # at the k-th decode step after its prefill a sequence attends over prompt + k tokens
        longest[later] = np.maximum(longest[later], prompt + later - a)
    if not np.array_equal(decoding, steps.decode_seqs.to_numpy()):
        raise ValueError("the requests do not account for the steps' decode batches (another "
                         "engine's requests, or a trace cut short)")
    return decoding * longest + prefilled

"""A steady heap for every engine reasonsim starts: glibc malloc without mmap'd chunks or trims.

With glibc's defaults a step's cost depends on the allocator's history, not only on its shape.
Large activations (a long prompt's attention scores: 1500 tokens x 4 heads x fp32 is ~36 MB)
come from fresh mmap'd pages or a heap top that was trimmed back to the OS, and first-touching
those pages costs more than the step's arithmetic: with glibc's defaults the same long prefill
costs up to 3x more on one pass over the lengths than on another, on this heap a few percent
(`docs/measurements/2026-11-27-steady-heap.md`). A calibration can only price a step by its
shape if the engine's cost is a function of the shape: traces, live replays and servers all run
on this heap. Memory is kept for reuse instead of returned (a process holds its peak). vLLM's CPU
guide recommends TCMalloc in its performance tips; glibc's own switches need no install.
"""

from __future__ import annotations

import ctypes
import os

TRIM_THRESHOLD_BYTES = 2**31 - 1
"""never give the top of the heap back to the OS (mallopt takes a C int: its largest)"""
ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}
"""the same settings for a child process (glibc reads them at start-up)"""
OPT_OUT = "REASONSIM_DEFAULT_HEAP"
"""set (non-empty) to keep glibc's default heap: to measure what the steady heap changes"""
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # <malloc.h>


def steady_heap() -> bool:
    """Switch this process's glibc malloc to the steady heap (from now on); False where the C
    library is not glibc (nothing to switch) or OPT_OUT is set."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # a C library that does not know the name: not glibc
        glibc = None
    if not glibc or os.environ.get(OPT_OUT):
        return False
    mallopt = ctypes.CDLL(None).mallopt  # this process's C library: glibc
    # mallopt returns 1 on success; a 0 would leave step times history-dependent: say so.
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        raise RuntimeError("glibc mallopt refused the steady-heap settings")
    return True


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the steady heap's settings for a child process
    (unless it sets OPT_OUT)."""
    env = dict(os.environ if env is None else env)
    return env if env.get(OPT_OUT) else {**env, **ENV}

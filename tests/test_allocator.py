"""The steady heap (`engines.allocator`): large buffers come from a heap kept for reuse."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engines.allocator import ENV, OPT_OUT, child_env

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")

# Allocate and free a 64 MiB buffer twice, counting the mmap'd chunks it added while held
# (mallinfo2's hblks) and the heap's size after it is freed (arena): glibc's default maps it
# and unmaps it, the steady heap keeps it.
PROBE = """
import ctypes, json
from engines.allocator import steady_heap
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
steady = steady_heap()
held, kept = [], []
for _ in range(2):
    before = libc.mallinfo2().hblks
    p = libc.malloc(64 << 20)
    ctypes.memset(p, 1, 64 << 20)
    held.append(libc.mallinfo2().hblks - before)
    libc.free(p)
    kept.append(libc.mallinfo2().arena >= 64 << 20)
print(json.dumps({"steady": steady, "mmapped": held, "kept": kept}))
"""


def probe(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout)


def test_steady_heap_keeps_large_buffers_for_reuse():
    base = {k: v for k, v in child_env().items() if k not in ENV}
    default = probe({**base, OPT_OUT: "1"})
    steady = probe(base)
    assert default == {"steady": False, "mmapped": [1, 1], "kept": [False, False]}
    assert steady == {"steady": True, "mmapped": [0, 0], "kept": [True, True]}


def test_child_env_sets_the_heap_unless_opted_out():
    assert child_env({"A": "1"}) == {"A": "1", **ENV}
    assert child_env({OPT_OUT: "1"}) == {OPT_OUT: "1"}

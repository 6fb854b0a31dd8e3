"""Compiled fast paths (numba), each equal to the SimPy engine it mirrors.

numba's on-disk cache (`cache=True`, in `__pycache__` here) checks only the file that defines a
function, not the functions it calls from other files: a kernel whose callee changed in another
module would load stale machine code. The cache is therefore kept per version of all the
kernels' sources together: importing this package drops it when any of them changed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def _drop_stale_cache() -> None:
    """Delete numba's cached kernels when the kernels' sources differ from those they were
    compiled from (a read-only install keeps its cache)."""
    here = Path(__file__).parent
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(here.glob("*.py"))))
    cache, stamp = here / "__pycache__", here / "__pycache__" / "kernels.sources"
    try:
        if stamp.exists() and stamp.read_text() == digest.hexdigest():
            return
        for f in cache.glob("*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest.hexdigest())
    except OSError:
        pass


_drop_stale_cache()

"""How many decode iterations a replica's batch can run unchanged: until a request finishes or
the KV blocks they need run out (the length of one fast-forwarded run)."""

from __future__ import annotations

from sim.engine.spec_decode import spec_tokens


def decode_run_length(running: list, free_blocks: int, block_size: int, spec: bool) -> int:
    """Iterations (>= 1) the all-decode batch `running` can run before a request finishes or
    its new KV blocks exceed `free_blocks`; `spec`: requests advance by their drawn accepted
    lengths (`sim.engine.spec_decode`), else one token an iteration."""
    k = min((len(r.spec_cum) - r.spec_it) if spec else (r.output - r.generated)
            for r in running)
    if k <= 1:
        return 1
    bs = block_size

    def extra(j: int) -> int:  # new blocks needed to run j iterations (plain Python: small)
        need = 0
        for r in running:
            x = -(-(r.computed + (spec_tokens(r, j) if spec else j)) // bs) - r.blocks - r.shared
            if x > 0:
                need += x
        return need

    # Each request holds blocks for its computed tokens, so k iterations of one token need at
    # most k // bs + 1 new blocks each: when even that fits, skip the per-request count.
    if (not spec and len(running) * (k // bs + 2) <= free_blocks) or extra(k) <= free_blocks:
        return k
    lo, hi = 1, k  # extra(lo) fits (the planned iteration allocated it), extra(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(mid) <= free_blocks:
            lo = mid
        else:
            hi = mid
    return lo

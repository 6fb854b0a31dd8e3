"""Dynasor's eviction hint on vLLM's block pool: an idle program's cached blocks go first.

vLLM v1 keeps free KV blocks in one queue: blocks holding no cached content at its head (handed
out first), then cached blocks in the order they were freed (evicted in that order when a
request needs room). `ProgramBlocks` records which blocks each program's requests freed (the
block and the content hash it held then); `demote(program)` moves those still free and still
holding that content, in their queue order, to the front of the cached part: the next
allocations evict them before any other program's. The simulator's replica does the same to its
prefix cache (`sim.engine.prefix_cache.PrefixCache.demote`).
"""

from __future__ import annotations


class ProgramBlocks:
    """Per program, the blocks its requests freed in one in-process vLLM engine."""

    def __init__(self, scheduler):
        manager = scheduler.kv_cache_manager
        self.queue = manager.block_pool.free_block_queue
        self.program_of: dict[str, str] = {}
        """vLLM's request id -> its program, until the request frees its blocks for good"""
        self.freed: dict[str, dict[int, object]] = {}
        """program -> block id -> the content hash the block held when the program freed it"""
        original = manager.free

        def free(request):
            program = self.program_of.get(request.request_id)
            if program is not None:
                mine = self.freed.setdefault(program, {})
                for group in manager.get_blocks(request.request_id).blocks:
                    for block in group:
                        if block.block_hash is not None:
                            mine[block.block_id] = block.block_hash
            original(request)

        # Observe, not replace: vLLM frees as it does; the hint reads what was freed.
        manager.free = free

    def add(self, request_id: str, program: str) -> None:
        """A request of `program` enters the engine (vLLM's own request id)."""
        self.program_of[request_id] = program

    def finished(self, request_id: str) -> None:
        """A request left the engine: its blocks are freed (and recorded) by now."""
        self.program_of.pop(request_id, None)

    def demote(self, program: str) -> int:
        """Queue the program's free cached blocks first for eviction; how many moved."""
        mine = self.freed.pop(program, None)
        if not mine:
            return 0
        queue = self.queue
        tail = queue.fake_free_list_tail
        block, uncached = queue.fake_free_list_head.next_free_block, 0
        while block is not tail and block.block_hash is None:  # the head's blocks holding nothing
            block, uncached = block.next_free_block, uncached + 1
        picked = []
        while block is not tail:
            held = block.block_hash
            if held is not None and mine.get(block.block_id) == held:
                picked.append(block)
            block = block.next_free_block
        for block in picked:
            queue.remove(block)
        # After the blocks holding nothing: they cost no eviction, so they still go first.
        empty = queue.popleft_n(uncached)
        queue.prepend_n(picked)
        queue.prepend_n(empty)
        return len(picked)


"""`books()` for vLLM: read off its KV cache manager and its queues, between iterations.

Pages are vLLM's KV blocks: block `b` is page `b - 1`, since block 0 is the block pool's null
block (never free: if vLLM ever queued it as free, it shows as page -1). A request holds
the blocks of its `req_to_blocks` (every request the scheduler still has: waiting, running,
finished with a free deferred). Slots are the worker's request slots: a request the scheduler still
has holds the one the worker gave it (none while it waits); the others are free as far as the
scheduler is concerned (the worker frees a finished request's slot when the next step's output
names it, as vLLM's does). Cached pages are the blocks with a block hash (the prefix cache's
map); vLLM keeps a freed cached block in its free queue, evictable: it is listed as cached, not
free. Locked pages are cached blocks a request references. Blocks whose free vLLM deferred
(`deferred_frees`, the KV-connector fence) belong to no request any more: each batch of them is
listed as a finished holding under uid `-1 - i`.
"""

from __future__ import annotations

from typing import Any

from overlapcheck.core.protocol import Books, Holding


def read_books(sched: Any, uid_of: dict[str, int], slots: dict[str, int], num_slots: int) -> Books:
    manager = sched.kv_cache_manager
    pool = manager.block_pool
    coordinator = manager.coordinator
    owned = coordinator.single_type_managers[0].req_to_blocks
    live: list[Holding] = []
    for req_id, request in sched.requests.items():
        blocks = owned.get(req_id, ())
        pages = tuple(b.block_id - 1 for b in blocks if not b.is_null)
        status = request.status
        finished = request.is_finished()
        preempted = status.name == "PREEMPTED"
        live.append(Holding(uid_of[req_id], slots.get(req_id), pages, finished, preempted))
    for i, (_, blocks) in enumerate(sched.deferred_frees):
        pages = tuple(b.block_id - 1 for b in blocks if not b.is_null)
        live.append(Holding(-1 - i, None, pages, True, False))
    free: list[int] = []
    for block in pool.free_block_queue.get_all_free_blocks():
        if block.block_hash is None:
            free.append(block.block_id - 1)
    cached: list[int] = []
    locked: list[int] = []
    for block in pool.blocks:
        if block.block_hash is not None and not block.is_null:
            cached.append(block.block_id - 1)
            if block.ref_cnt > 0:
                locked.append(block.block_id - 1)
    return Books(
        live=tuple(live),
        free_slots=tuple(sorted(set(range(num_slots)) - {h.slot for h in live})),
        free_pages=tuple(free),
        cached_pages=tuple(cached),
        locked_pages=tuple(locked),
    )

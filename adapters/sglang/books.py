"""`books()` for SGLang: read off its own pools and tree between iterations.

Slots are `req_pool_idx` rows of its `ReqToTokenPool` (`free_slots` is its free list); row 0 is
its padding row and it hands out rows 1..N, which are our slots 0..N-1. Pages are
its allocator's: SGLang keeps page 0 as the padding page and hands out pages 1..N, which are our
pages 0..N-1; a KV index `i` lies in SGLang page `i // page_size`. Free pages: the allocator's
`get_all_free_pages()` (its free list and the pages freed but not merged back yet). Cached pages:
the device values of the radix tree (`all_values_flatten()`). Locked pages are not told: the tree
is SGLang's Rust tree core, whose nodes Python does not see (SGLang's own checker, run every
iteration, compares its protected size with what requests hold).

Live requests: those waiting (`waiting_queue`, pending), the chunked one, those running, and
those of the batches launched and not processed yet (`last_batch`, `result_queue`), unless
finished with their row given back. What one holds: its row, and the pages of
`req_to_token[row, :kv_allocated_len]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.adapters.sglang.transport import uid_of
from overlapcheck.backends.torchsim.tensor import SimTensor
from overlapcheck.core.protocol import Books, Holding


def _ints(tensor: Any) -> np.ndarray:
    if tensor is None:
        return np.zeros(0, dtype=np.int64)
    out: np.ndarray = np.asarray(_host(tensor), dtype=np.int64).reshape(-1)
    return out


def _host(tensor: Any) -> np.ndarray:
    """Its values on the host without an aten op where there is no need for one (each one costs
    a trip through `peeking()`): on the simulated CUDA its logical copy (the values in program
    order, which is what `peeking()` reads), on the cpu the tensor itself."""
    host = tensor.logic if isinstance(tensor, SimTensor) else tensor
    if host.device.type == "cpu" and not host.requires_grad:
        out: np.ndarray = host.numpy()
        return out
    out = host.detach().cpu().numpy()
    return out


def _pages(indices: np.ndarray, page_size: int) -> tuple[int, ...]:
    return tuple((np.unique(indices // page_size) - 1).tolist())


def _order(holding: Holding) -> tuple[int, int, tuple[int, ...]]:
    """Holdings by uid (a uid's old request, still holding its row, beside its new one)."""
    return holding.uid, -1 if holding.slot is None else holding.slot, tuple(holding.pages)


def read_books(sched: Any) -> Books:
    page_size = int(sched.page_size)
    free = {int(s) for s in sched.req_to_token_pool.free_slots}
    free_slots = tuple(int(s) - 1 for s in sched.req_to_token_pool.free_slots)
    # SGLang builds fewer rows than asked on a small pool (its running requests capped at half
    # the pool's tokens): the slots it has no row for are never used, hence free
    unbuilt = range(int(sched.req_to_token_pool.size), int(sched.server_args.max_running_requests))
    free_slots += tuple(unbuilt)
    table = _host(sched.req_to_token_pool.req_to_token)  # read once, not once a request
    # By request, not by uid: a uid sent again after its request finished is a new request while
    # the old one may still hold its row and pages (its last batch not processed yet).
    seen: set[int] = set()
    live: list[Holding] = []

    def add(req: Any) -> None:
        if id(req) in seen:
            return
        uid = uid_of(req.rid)
        slot = req.kv.req_pool_idx
        if slot is not None and int(slot) in free:
            slot = None
        if slot is None and req.finished():
            return
        seen.add(id(req))
        if slot is None:
            live.append(Holding(uid, None, ()))
            return
        allocated = int(req.kv.kv_allocated_len)
        indices = table[int(slot), :allocated].astype(np.int64)
        live.append(Holding(uid, int(slot) - 1, _pages(indices, page_size)))

    pending = tuple(uid_of(r.rid) for r in sched.waiting_queue)
    for req in sched.waiting_queue:
        add(req)
    if sched.chunked_req is not None:
        add(sched.chunked_req)
    for req in sched.running_batch.reqs:
        add(req)
    batches = [sched.last_batch] + [b for b, _ in getattr(sched, "result_queue", ())]
    for batch in batches:
        for req in batch.reqs if batch is not None else ():
            add(req)
    allocator = sched.token_to_kv_pool_allocator
    free_pages = tuple((_ints(allocator.get_all_free_pages()) - 1).tolist())
    cached: tuple[int, ...] = ()
    tree = sched.tree_cache
    if getattr(tree, "disable", False) is False and hasattr(tree, "all_values_flatten"):
        cached = _pages(_ints(tree.all_values_flatten()), page_size)
    return Books(
        live=tuple(sorted(live, key=_order)),
        free_slots=free_slots,
        free_pages=free_pages,
        cached_pages=cached,
        locked_pages=(),
        pending=pending,
    )

"""`books()` for mini-sglang: read off its table and cache managers, between iterations.

Device values (the page table, the free list, the radix tree's page indices) are read from the
simulated CUDA's logical copies: the values in program order, which is what the scheduler's
accounting means (`backends/torchsim/memory.py`).

Live requests: those waiting (a chunked one holds its row and pages), running, or in the batch in
flight and not yet given back (not finished, and its row not on the free list). What one holds:
its row, and the pages of `page_table[row, :cached_len]` (the positions pages were allocated for).
Cached pages are those of every node of the radix tree; locked ones, of nodes with references.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.adapters.base import Loaded
from overlapcheck.backends.torchsim.tensor import SimTensor
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.protocol import Books, Holding


def _values(tensor: Any) -> np.ndarray:
    """The values as integers: a signed integer array as it is (its `tolist` gives the same ints
    as int64's, without the copy), any other as int64."""
    values = _view(tensor)
    return values if values.dtype.kind == "i" else values.astype(np.int64)


def _view(tensor: Any) -> np.ndarray:
    """The values without a copy where they can be read in place (a row of the page table is
    converted, not the whole table, at every step)."""
    if isinstance(tensor, SimTensor):
        out: np.ndarray = tensor.logic.numpy()
        return out
    return np.asarray(tensor)


def _attr(owner: Any, *names: str) -> Any:
    """The first of `names` that `owner` has: mini-sglang renamed its managers' fields over its
    history (c7f800d: `_free_slots` -> `free_slots`, `manager` -> `prefix_cache`)."""
    for name in names:
        if hasattr(owner, name):
            return getattr(owner, name)
    raise AttributeError(f"{type(owner).__name__} has none of {', '.join(names)}")


def _pages(cells: list[int], page_size: int) -> tuple[int, ...]:
    """The pages of these cells, sorted, once each (a set of a few dozen ints costs less than
    `np.unique`, which runs for every request at every step)."""
    if page_size == 1:  # (a cell is its page: no division per cell)
        return tuple(sorted(set(cells)))
    return tuple(sorted({c // page_size for c in cells}))


class LastList:
    """The last list read off an array, to make the next one from where it only lost its head
    or gained a tail (the free list an allocator takes from and gives back to): the same int
    objects, so a checker comparing it with its last snapshot compares by identity, and only
    the new values are converted."""

    def __init__(self) -> None:
        self.values: np.ndarray | None = None
        self.pages: tuple[int, ...] = ()

    def of(self, values: np.ndarray) -> tuple[int, ...]:
        """`tuple(values.tolist())`, made from the last one where it can be."""
        last, n = self.values, len(values)
        pages: tuple[int, ...] | None = None
        if last is not None and last.dtype == values.dtype:
            m = len(last)
            if n <= m and (values == last[m - n :]).all():
                pages = self.pages[m - n :]
            elif n > m and (values[:m] == last).all():
                pages = self.pages + tuple(values[m:].tolist())
        if pages is None:
            pages = tuple(values.tolist())
        self.values, self.pages = values.copy(), pages  # (`values` may be the tensor's own)
        return pages


def read_books(
    sched: Any,
    data: Any,
    config: SchedulerConfig,
    up: Loaded,
    defers_frees: bool = False,
    free_list: LastList | None = None,
) -> Books:
    """The books between iterations. `defers_frees`: the checkout keeps a finished request's row
    and pages until no batch in flight holds it (`checkout.Features`). `free_list`: the last
    free list read, kept by the caller from one call to the next."""
    chunked_cls = up["minisgl.scheduler.prefill"].ChunkedReq
    table = _view(sched.engine.page_table)
    page_size = config.page_size
    free_slots = tuple(int(s) for s in sched.table_manager._free_slots)

    def pages(req: Any) -> tuple[int, ...]:
        row = table[int(req.table_idx), : int(req.cached_len)].tolist()
        return _pages(row, page_size)

    live: list[Holding] = []
    seen: set[int] = set()
    pending: list[int] = []
    for p in sched.prefill_manager.pending_list:
        pending.append(int(p.uid))
        seen.add(int(p.uid))
        chunk = p.chunked_req
        if chunk is None:
            live.append(Holding(int(p.uid), None, ()))
        else:
            live.append(Holding(int(p.uid), int(chunk.table_idx), pages(chunk)))
    running = sorted(sched.decode_manager.running_reqs, key=lambda r: int(r.uid))
    for req in running:
        seen.add(int(req.uid))
        live.append(Holding(int(req.uid), int(req.table_idx), pages(req)))
    if data is not None:
        free = set(free_slots)
        for req in data[0].batch.reqs:
            uid = int(req.uid)
            given_back = req in sched.finished_reqs and not defers_frees
            if uid in seen or isinstance(req, chunked_cls) or given_back:
                continue
            if int(req.table_idx) in free:
                continue
            seen.add(uid)
            live.append(Holding(uid, int(req.table_idx), pages(req)))
    cache = sched.cache_manager
    cells = _values(_attr(cache, "free_slots", "_free_slots"))
    free_values = cells if page_size == 1 else cells // page_size
    free_pages = tuple(free_values.tolist()) if free_list is None else free_list.of(free_values)
    cached: list[int] = []
    locked: list[int] = []
    root = getattr(_attr(cache, "prefix_cache", "manager"), "root_node", None)
    stack = [] if root is None else list(root.children.values())
    while stack:
        node = stack.pop()
        # (each node's pages as they come: the lists are made sorted and unique once, below)
        values = _values(node.value)
        node_pages = (values if page_size == 1 else values // page_size).tolist()
        cached.extend(node_pages)
        if node.ref_count > 0:
            locked.extend(node_pages)
        stack.extend(node.children.values())
    cached_pages = tuple(sorted(set(cached)))
    # (the same list when every node is locked, as while each cached prefix serves a running
    # request: unlocked nodes added nothing to it)
    locked_pages = cached_pages if len(locked) == len(cached) else tuple(sorted(set(locked)))
    return Books(
        live=tuple(live),
        free_slots=free_slots,
        free_pages=free_pages,
        cached_pages=cached_pages,
        locked_pages=locked_pages,
        pending=tuple(pending),
    )

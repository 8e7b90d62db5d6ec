"""`no-uninit-read`: no forward and no device-to-host copy reads device memory that nothing wrote
since it was allocated (what `compute-sanitizer --tool initcheck` reports on a GPU).

A backend that reports allocations (`Trace.allocations`: the simulated CUDA does, for every
device tensor it hands out, a block the caching allocator reuses included) marks the tensor's
cells "never written". Any traced write of a cell clears its mark, in issue order: a kernel's
output, `zeros`/`full`/`fill_`, an index write, a copy into it. `empty*` allocates and writes
nothing. A write issued before the read but not yet landed on the device is a race, which
`no-race` judges; this check judges the program as issued.

Which reads count: the inputs of a forward (its tokens are the run's output) and the source of a
device-to-host copy (`.to("cpu")`, `.item()`, `.tolist()`: what the host learns). Other kernels
may read never-written cells whose values never reach either (a padded row's lanes, a scratch
buffer), so their reads are not judged: a read that could be harmless is never an alarm. A
forward's reads of cells the same forward writes (the new KV it stores before attending) are
not judged either. A never-written value that a data-moving kernel copies (a gather, an index
select, `copy_`, a clone: `Op.moves`, from the simulated CUDA) stays never-written where it
lands, so the forward that reads the copy is judged as if it read the original. What this
misses: garbage carried through arithmetic (values are tracked through copies, not sums).
"""

from __future__ import annotations

import numpy as np

from overlapcheck.core.sites import Location
from overlapcheck.core.trace import Allocation, Op
from overlapcheck.invariants.base import TraceScanner
from overlapcheck.invariants.locations import locations, op_location

_JUDGED = ("forward", "d2h")
_count = np.count_nonzero
_CLEAN = -1  # a cell's mark: written since its allocation (or never allocated by the program)


class NoUninitRead(TraceScanner):
    """No forward and no device-to-host copy reads device memory that nothing wrote since its
    allocation (`empty*`, or a block the caching allocator reused).

    Per buffer with never-written cells: each cell's allocation (an index into the trace's
    allocations), or `_CLEAN`. A buffer leaves `pending` once all its cells are written, so most
    ops cost one dictionary test."""

    id = "no-uninit-read"

    def __init__(self) -> None:
        self.seen = 0  # ops judged
        self.allocated = 0  # allocations applied
        self.pending: dict[str, np.ndarray] = {}
        # Buffers of one allocation not yet marked in `pending`: its cells and index. Most
        # allocations are written whole by the op that makes them (`empty` then the kernel's
        # output): that op only forgets them, no marks made and cleared.
        self.fresh: dict[str, tuple[np.ndarray, int]] = {}

    def _scan(self) -> None:
        trace = self.run.trace
        ops, allocations = trace.ops, trace.allocations
        n, count = len(ops), len(allocations)
        i, k = self.seen, self.allocated
        while i < n:
            while k < count and allocations[k].seq <= i:
                self._allocate(allocations[k], k)
                k += 1
            if not self.pending and not self.fresh:  # nothing to judge until the next allocation
                i = min(allocations[k].seq, n) if k < count else n
                continue
            op = ops[i]
            i += 1
            if op.accesses:
                self.seen, self.allocated = i, k  # a finding here leaves the next scan after it
                self._op(op)
        self.seen, self.allocated = n, k

    def _allocate(self, allocation: Allocation, index: int) -> None:
        if len(allocation.cells):
            buffer = allocation.buffer
            if buffer in self.pending or buffer in self.fresh:
                self._unfresh(buffer)
                self._mark(buffer, allocation.cells, index)
            else:
                self.fresh[buffer] = (allocation.cells, index)

    def _unfresh(self, buffer: str) -> None:
        """Mark a fresh buffer's allocation in `pending`, as `_allocate` would have."""
        found = self.fresh.pop(buffer, None)
        if found is not None:
            self._mark(buffer, *found)

    def _op(self, op: Op) -> None:
        fresh = self.fresh
        if fresh:
            # A fresh buffer stays unmarked only where this op writes all its cells and reads
            # none of them, nor copies them (an op's reads come before its writes).
            for move in op.moves:
                if move.src in fresh:
                    self._unfresh(move.src)
            for access in op.accesses:
                found = fresh.get(access.buffer)
                if found is None:
                    continue
                cells = access.cells
                if (
                    access.mode != "w"
                    or len(cells) != len(found[0])
                    or (cells is not found[0] and _count(cells != found[0]))
                ):
                    self._unfresh(access.buffer)
            for access in op.accesses:
                if access.buffer in fresh:  # written whole: marked, then every mark cleared
                    del fresh[access.buffer]
        pending = self.pending
        carried = self._carried(op) if op.moves else ()
        if op.kind in _JUDGED:
            for access in op.accesses:
                marks = pending.get(access.buffer)
                if marks is None or access.mode != "r":
                    continue
                cells = access.cells[access.cells < len(marks)]
                bad = cells[marks[cells] != _CLEAN]
                if bad.size and op.kind == "forward":
                    bad = np.setdiff1d(bad, self._own_writes(op, access.buffer))
                if bad.size:
                    self._report(op, access.buffer, np.unique(bad), marks)
        for access in op.accesses:
            if access.mode != "w":
                continue
            marks = pending.get(access.buffer)
            if marks is None:
                continue
            cells = access.cells[access.cells < len(marks)]
            marks[cells] = _CLEAN
            if not (marks != _CLEAN).any():
                del pending[access.buffer]
        for buffer, cells, origins in carried:
            self._unfresh(buffer)
            self._mark(buffer, cells, origins)

    def _carried(self, op: Op) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """The never-written values a data-moving kernel copies (`Op.moves`): each destination
        cell whose source cell is unwritten, with that cell's allocation (read before the op's
        writes clear anything)."""
        out = []
        for move in op.moves:
            marks = self.pending.get(move.src)
            if marks is None:
                continue
            inside = move.src_cells < len(marks)
            origins = np.full(len(move.src_cells), _CLEAN, dtype=np.int64)
            origins[inside] = marks[move.src_cells[inside]]
            dirty = origins != _CLEAN
            if dirty.any():
                out.append((move.dst, move.dst_cells[dirty], origins[dirty]))
        return out

    def _mark(self, buffer: str, cells: np.ndarray, origins: np.ndarray | int) -> None:
        """`cells` of `buffer` unwritten, each since allocation `origins` (one, or per cell)."""
        size = max(self.run.trace.sizes.get(buffer, 0), int(cells.max()) + 1)
        marks = self.pending.get(buffer)
        if marks is None:
            marks = np.full(size, _CLEAN, dtype=np.int64)
        elif len(marks) < size:
            marks = np.concatenate([marks, np.full(size - len(marks), _CLEAN, dtype=np.int64)])
        marks[cells] = origins
        self.pending[buffer] = marks

    @staticmethod
    def _own_writes(op: Op, buffer: str) -> np.ndarray:
        written = [a.cells for a in op.accesses if a.mode == "w" and a.buffer == buffer]
        return np.concatenate(written) if written else np.empty(0, dtype=np.int64)

    def _report(self, op: Op, buffer: str, cells: np.ndarray, marks: np.ndarray) -> None:
        allocation = self.run.trace.allocations[int(marks[cells[0]])]
        file, line, function = _site(allocation.site)
        what = "forward" if op.kind == "forward" else "device-to-host copy"
        span = f"{int(cells[0])}..{int(cells[-1])}" if len(cells) > 1 else f"{int(cells[0])}"
        held = (  # (a value a gather or copy carried over from never-written memory)
            ""
            if allocation.buffer == buffer
            else f", values copied from {allocation.buffer}, which was"
        )
        found = [
            Location.of("allocated", allocation.origin, "", allocation.step, allocation.what)
            if allocation.origin is not None
            else None,
            op_location("read", op),
        ]
        self.fail(
            f"read of never-written device memory: {what} `{op.label}` (step {op.step}, "
            f"{op.agent} stream) reads {buffer}[{span}] ({len(cells)} cells){held} allocated by "
            f"`{allocation.what} @{allocation.site}` (step {allocation.step}) and not written "
            "since: on a GPU it reads whatever the memory held before",
            op.uids,
            locations(*found),
            buffer=buffer,
            cells=[int(c) for c in cells[:16]],
            num_cells=len(cells),
            read={"seq": op.seq, "label": op.label, "agent": op.agent, "step": op.step},
            allocation={
                "file": file,
                "line": line,
                "function": function,
                "step": allocation.step,
                "op": allocation.what,
            },
        )


def _site(site: str) -> tuple[str, int, str]:
    """(`file`, line, function) of a `file:line function` site ("?" where unknown)."""
    where, _, function = site.partition(" ")
    file, _, line = where.rpartition(":")
    return (file or where), int(line) if line.isdigit() else 0, function

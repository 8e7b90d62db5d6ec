"""PyTorch's two caching allocators, as far as they decide which memory a new tensor gets.

**Device** (`CUDACachingAllocator`). A request is rounded up to a multiple of 512 bytes
(`round_size`); one of up to 1 MiB is served from the small pool, a larger one from the large
pool. Each pool keeps its free blocks per stream, best fit (the smallest block that fits, then the
lowest address): a block belongs to the stream whose allocation made its segment, and only an
allocation on that stream ever gets it. With no block that fits, a new segment is reserved
(`segment_size`: 2 MiB for a small request, 20 MiB for one under 10 MiB, else the request rounded
to 2 MiB). A block larger than the request is split (`should_split`: a small block when 512 bytes
or more remain, a large one when more than 1 MiB does), the request at its start and the rest a
free block of its own; a freed block merges with its free neighbours in its segment. So the bytes
of a freed tensor go to the next fitting request on that stream whatever its dtype or size: a
small tensor lands in the middle of a freed larger one, or across two freed neighbours.

Freed (its last tensor gone), a block goes back to its stream's pool at once: the stream's later
work is ordered after the block's earlier uses on the same stream, but not after its uses on other
streams. `Tensor.record_stream(s)` names such a stream: the free then records an event on each
named stream, and the block rejoins the pool (and may merge) only once an allocation finds all
those events complete. Without it, the next allocation on the allocating stream may get the bytes
while another stream still reads or writes them.

**Trace buffers.** The trace names memory by buffer and element (cell), one dtype per buffer; the
allocator keeps, per segment, which buffer last owned each byte range (`_Piece`). A block that
lies inside one earlier buffer of the same dtype is that buffer again, at an element offset (a
*twin*: same name, same cells, same values), so a same-dtype reuse reads as two tensors' uses of
one buffer, as before splitting existed. Any other reuse (another dtype, or bytes of several
earlier buffers) is a new buffer that starts with the old bytes, and a `Reuse` with a `source`
and a cell-to-cell map for each earlier buffer: the race checker carries the old cells' accesses
over to the new ones (`invariants/races.py`), so a use of the old tensor and one of the new are
still two accesses of the same memory, and a finding names the freed and the reused tensor.

**Host** (`CachingHostAllocator`). A pinned request is rounded up to a power of two; every
non-blocking copy to or from a pinned block records an event on the copy's stream. A freed block
is handed to a later pinned request of the same power-of-two size, of any dtype, only once its
events are complete; the latest freed first, as PyTorch's free lists pop from the back. A block
handed to another dtype is a new buffer on the same memory, with the same carried-over accesses.

An allocation that finds an event complete has queried it: the host is then ordered after the
event, as after any successful `Event.query()`, and the trace says so (a host `query`). So a reuse
the allocators make is ordered after every use they waited for, and correct code stays clean.

Frees are seen at safe points (the start of the next aten call, an allocation), never in the
middle of issuing an op: a device tensor's death is reported by a weak reference, a pinned
block's by its storage's use count falling back to the allocator's own.

Not modelled: `empty_cache` and the release of cached segments when memory runs out (memory never
runs out here), `PYTORCH_CUDA_ALLOC_CONF` (`max_split_size_mb`, power-of-two roundup, expandable
segments), CUDA-graph private pools, the host allocator's events recorded at the free rather than
after each copy (recorded after the copy here, which waits for no less than the copy itself). A
reuse across layouts copies the old bytes to the new buffer at the allocation: a write the old
tensor's late op makes afterwards does not reach the new tensor's values (the race checker still
reports it).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from ctypes import memmove
from dataclasses import dataclass, field
from typing import Any

import torch

from overlapcheck.backends.torchsim.memory import Buffer, Geometry, Memory, same_geometry
from overlapcheck.backends.torchsim.streams import UNKNOWN, Marker, SimStream, StreamRuntime
from overlapcheck.core.sites import Site, caller
from overlapcheck.core.trace import HOST, Reuse

# `Tensor.copy_` itself: inside the block `torch.Tensor.copy_` is a Python stand-in
# (`session._copy`) that the allocators' own copies need not go through.
_copy_into = torch._C.TensorBase.copy_

MIN_BLOCK = 512  # bytes (kMinBlockSize): every block a multiple, every request at least this
SMALL = 1 << 20  # bytes (kSmallSize): requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20  # kSmallBuffer: the segment a small request reserves
LARGE_SEGMENT = 20 << 20  # kLargeBuffer: the segment a request under MIN_LARGE reserves
MIN_LARGE = 10 << 20  # kMinLargeAlloc: a request this large gets a segment of its own size
ROUND_LARGE = 2 << 20  # kRoundLarge: ... rounded up to a multiple of this


def round_size(nbytes: int) -> int:
    """A request's block size (`round_size`, without the power-of-two divisions option)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment a request of `size` (rounded) reserves when no free block fits
    (`get_allocation_size`)."""
    if size <= SMALL:
        return SMALL_SEGMENT
    if size < MIN_LARGE:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size: int, size: int) -> bool:
    """Whether a free block of `block_size` serving a request of `size` is split."""
    remaining = block_size - size
    return remaining >= MIN_BLOCK if size <= SMALL else remaining > SMALL


@dataclass(eq=False)
class _Piece:
    """Bytes [start, end) of a segment, last owned by `buffer` (a root buffer, never a twin),
    whose element 0 is at `origin`. `freed`: where the program dropped the tensor that owned
    them last, and the step (None: still live, or never freed)."""

    start: int
    end: int
    origin: int
    buffer: Buffer
    freed: tuple[Site | None, int] = (None, 0)

    def cut(self, start: int, end: int) -> _Piece:
        return _Piece(start, end, self.origin, self.buffer, self.freed)


@dataclass(eq=False)
class _Segment:
    """One reservation (`cudaMalloc`): its stream, pool, and its bytes' last owners by address."""

    stream: SimStream
    small: bool
    pieces: list[_Piece] = field(default_factory=list)  # sorted, disjoint
    starts: list[int] = field(default_factory=list)  # each piece's start, for bisect


@dataclass(eq=False)
class _Block:
    """A block of a segment: [ptr, ptr + size), free, held for events, or a tensor's."""

    ptr: int
    size: int
    segment: _Segment
    prev: _Block | None = None
    next: _Block | None = None
    state: str = "free"  # "free" (in its pool), "live", "held" (waiting for its events)
    piece: _Piece | None = None  # live: the bytes' owner it was given
    uses: list[SimStream] = field(default_factory=list)  # other streams, by record_stream
    markers: list[Marker] = field(default_factory=list)  # held: events it waits for
    freed: tuple[Site | None, int] = (None, 0)  # where the program dropped its last tensor, step


class _Pool:
    """Free blocks of one stream and size class, by (size, address): best fit is a bisect."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, _Block] = {}

    def add(self, block: _Block) -> None:
        insort(self.keys, (block.size, block.ptr))
        self.blocks[block.ptr] = block

    def remove(self, block: _Block) -> None:
        del self.keys[bisect_left(self.keys, (block.size, block.ptr))]
        del self.blocks[block.ptr]

    def take(self, size: int) -> _Block | None:
        """The smallest free block of at least `size` bytes (the lowest address of a size)."""
        i = bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        return self.blocks.pop(self.keys.pop(i)[1])


class DeviceAllocator:
    """Which device memory a new tensor on the current stream gets."""

    def __init__(self, runtime: StreamRuntime, memory: Memory) -> None:
        self.runtime = runtime
        self.memory = memory
        self.blocks: dict[int, _Block] = {}  # live blocks, by id of their tensor's buffer
        self.dead: list[Buffer] = []  # freed by the program, not yet seen by the allocator
        self.held: list[_Block] = []  # freed, waiting for the events of their record_stream
        self.pools: dict[tuple[str, bool], _Pool] = {}  # by stream name and small
        self.top = 0  # the next segment's address
        self.segments = 0
        self.reused = 0  # allocations that got memory an earlier tensor had

    def allocate(
        self, like: torch.Tensor, hint: str, site: Any = UNKNOWN
    ) -> tuple[Buffer, torch.Tensor]:
        """Memory for `like`'s storage (dtype and size) on the current stream: its buffer, and
        `like`'s geometry there as a view of the buffer's logical copy. `site`: the scheduler's
        frame that asked (None: none), when the caller found it already (else it is looked up
        on a reuse)."""
        if self.dead:
            self.collect()
        if self.held:
            self._release()
        nbytes = like.untyped_storage().nbytes()
        if nbytes == 0:  # no block at all, as in PyTorch
            buffer = self.memory.new_device(0, like.dtype, hint)
            return buffer, same_geometry(buffer.logical, like)
        size = round_size(nbytes)
        stream = self.runtime.current
        small = size <= SMALL
        pool = self.pools.get((stream.name, small))
        if pool is None:
            pool = self.pools[stream.name, small] = _Pool()
        block = pool.take(size)
        if block is None:
            block = self._reserve(stream, small, segment_size(size))
        if should_split(block.size, size):
            rest = _Block(block.ptr + size, block.size - size, block.segment, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.add(rest)
        block.state = "live"
        buffer, offset = self._owner(block, like.dtype, like.element_size(), hint, stream, site)
        buffer.on_free = self._freed
        self.blocks[id(buffer)] = block
        return buffer, buffer.logical.as_strided(
            like.size(), like.stride(), like.storage_offset() + offset
        )

    def _reserve(self, stream: SimStream, small: bool, size: int) -> _Block:
        """A new segment (`cudaMalloc`) of `size` bytes: one free block, at a fresh address."""
        segment = _Segment(stream, small)
        block = _Block(self.top, size, segment)
        self.top += size
        self.segments += 1
        return block

    def _owner(
        self,
        block: _Block,
        dtype: torch.dtype,
        esize: int,
        hint: str,
        stream: SimStream,
        site: Any,
    ) -> tuple[Buffer, int]:
        """The buffer a new tensor of `dtype` in `block` is named by, and its element offset
        there; the block's bytes are its from now on."""
        start, end = block.ptr, block.ptr + block.size
        segment = block.segment
        starts = segment.starts
        i = bisect_left(starts, start)
        if i and segment.pieces[i - 1].end > start:
            i -= 1
        j = bisect_left(starts, end, i)
        old = segment.pieces[i:j]
        root = old[0].buffer if old else None
        twin = (
            root is not None
            and root.physical.dtype == dtype
            and old[0].start <= start
            and old[-1].end >= end
            and (
                len(old) == 1  # (the common case: one earlier tensor's block again)
                or all(
                    old[k].buffer is root and old[k].start == old[k - 1].end
                    for k in range(1, len(old))
                )
            )
        )
        if twin:
            assert root is not None
            offset = (start - old[0].origin) // esize
            buffer = Buffer(root.name, False, root.physical, root.logical, origin=root)
            buffer._ids = root._ids
            piece = _Piece(start, end, old[0].origin, root)
        else:
            buffer = self.memory.new_device(block.size // esize, dtype, hint)
            offset = 0
            piece = _Piece(start, end, start, buffer)
        if old:
            self._reused(old, buffer, start, end, None if twin else esize, stream, site)
        # the block's bytes are the new piece's; the old pieces keep what lies outside them
        if j == i + 1 and old[0].start == start and old[0].end == end:
            segment.pieces[i] = piece  # (exactly one earlier piece's bytes: its start stays)
        else:
            kept = [p.cut(p.start, start) for p in old[:1] if p.start < start]
            kept.append(piece)
            kept += [p.cut(end, p.end) for p in old[-1:] if p.end > end]
            segment.pieces[i:j] = kept
            segment.starts[i:j] = [p.start for p in kept]
        block.piece = piece
        return buffer, offset

    def _reused(
        self,
        old: list[_Piece],
        buffer: Buffer,
        start: int,
        end: int,
        esize: int | None,
        stream: SimStream,
        site: Any,
    ) -> None:
        """Trace the reuse of `old` pieces' bytes [start, end) by `buffer`; `esize`: the new
        buffer's element size when it is not the old one (its cells then map to theirs)."""
        self.reused += 1
        trace = self.runtime.device.trace
        here = caller() if site is UNKNOWN else site
        step, seq = self.runtime.device.recorder.step, len(trace.ops)
        for piece in old:
            if esize is None:
                trace.reuses.append(Reuse(buffer.name, seq, stream.name, *piece.freed, here, step))
                continue
            lo, hi = max(piece.start, start), min(piece.end, end)  # (512-byte aligned)
            old_esize = piece.buffer.physical.element_size()
            cells = ((lo - start) // esize, (hi - start) // esize)
            source_cells = ((lo - piece.origin) // old_esize, (hi - piece.origin) // old_esize)
            trace.reuses.append(
                Reuse(
                    buffer.name,
                    seq,
                    stream.name,
                    *piece.freed,
                    here,
                    step,
                    source=piece.buffer.name,
                    cells=cells,
                    source_cells=source_cells,
                )
            )
            # the new tensor's memory holds the old one's bytes (garbage, as on a GPU): copied
            # as bytes between the flat copies, in bounds of both (a block lies in each buffer)
            src, dst = lo - piece.origin, lo - start
            for new, former in (
                (buffer.physical, piece.buffer.physical),
                (buffer.logical, piece.buffer.logical),
            ):
                memmove(new.data_ptr() + dst, former.data_ptr() + src, hi - lo)

    def record_stream(self, buffer: Buffer, stream: SimStream) -> None:
        """`Tensor.record_stream(stream)` on a tensor of `buffer`."""
        block = self.blocks.get(id(buffer))
        if block is not None and stream is not block.segment.stream and stream not in block.uses:
            block.uses.append(stream)

    def _freed(self, buffer: Buffer) -> None:
        """The program dropped the buffer's last tensor (a weak reference's callback, run in the
        frame that dropped it): noted with that frame, seen at the next `collect`."""
        block = self.blocks.get(id(buffer))
        if block is not None:
            block.freed = (caller(), self.runtime.device.recorder.step)
        self.dead.append(buffer)

    def collect(self) -> None:
        """See the frees since the last call: to the pool, or held for their streams' events."""
        while self.dead:
            buffer = self.dead.pop(0)
            if buffer.holders:
                continue
            block = self.blocks.pop(id(buffer), None)
            if block is None:
                continue
            if block.piece is not None:
                block.piece.freed = block.freed
                block.piece = None
            if block.uses:
                block.markers = [self.runtime.record(s, why="free") for s in block.uses]
                block.uses = []
                block.state = "held"
                self.held.append(block)
            else:
                self._free(block)

    def _release(self) -> None:
        """Held blocks whose events are all complete (the host queries them) go to their pool."""
        if not self.held:
            return
        for block in list(self.held):
            if all(m.query() for m in block.markers):
                for marker in block.markers:
                    self.runtime.observe(marker, why="free")
                block.markers = []
                self.held.remove(block)
                self._free(block)

    def _free(self, block: _Block) -> None:
        """`block` back to its pool, merged with its free neighbours (`try_merge_blocks`)."""
        segment = block.segment
        pool = self.pools[segment.stream.name, segment.small]
        before, after = block.prev, block.next
        if before is not None and before.state == "free":
            pool.remove(before)
            block.ptr, block.size, block.prev = before.ptr, block.size + before.size, before.prev
            if before.prev is not None:
                before.prev.next = block
        if after is not None and after.state == "free":
            pool.remove(after)
            block.size, block.next = block.size + after.size, after.next
            if after.next is not None:
                after.next.prev = block
        block.state = "free"
        block.freed = (None, 0)
        pool.add(block)


@dataclass(eq=False)
class _PinnedBlock:
    buffer: Buffer  # the latest tensor's (another dtype: another buffer on the same memory)
    storage: int  # the storage's handle, for its use count
    own: int  # its use count when only the allocator holds it
    bucket: int  # its size in bytes, a power of two
    markers: dict[str, Marker] = field(default_factory=dict)  # by stream: after its last copy


def _use_count(storage: int) -> int:
    count: int = torch._C._storage_Use_Count(storage)
    return count


def _bucket(nbytes: int) -> int:
    return 1 << max(nbytes - 1, 0).bit_length()


class HostAllocator:
    """Which pinned block a new pinned tensor gets."""

    def __init__(self, runtime: StreamRuntime, memory: Memory) -> None:
        self.runtime = runtime
        self.memory = memory
        self.blocks: dict[int, _PinnedBlock] = {}  # by id of each buffer it has had
        self.live: list[_PinnedBlock] = []
        self.free: dict[int, list[_PinnedBlock]] = {}  # by bucket, each in free order
        self.reused = 0

    def allocate(self, made: torch.Tensor, hint: str, site: Any = UNKNOWN) -> torch.Tensor:
        """A pinned tensor with the sizes, dtype and values of `made` (a fresh, plain one);
        `site`: the scheduler's frame that asked, when the caller found it already."""
        self._collect()
        dtype = made.dtype
        where: Geometry = (made.size(), made.stride(), 0)
        bucket = _bucket(made.untyped_storage().nbytes())
        esize = made.element_size()
        free = self.free.get(bucket)
        block = None
        if free:
            for b in reversed(free):  # the latest freed first (PyTorch's free list pops its back)
                if bucket % esize and b.buffer.physical.dtype != dtype:
                    continue
                for m in b.markers.values():  # (`Marker.query`, inline: a dozen blocks a call)
                    if not m.fired.triggered:
                        break
                else:
                    block = b
                    break
        if block is not None:
            assert free is not None
            for marker in block.markers.values():
                self.runtime.observe(marker, why="pinned", site=site)
            block.markers = {}
            free.remove(block)
            self.reused += 1
            old = block.buffer
            if old.logical is not old.physical and torch.equal(old.logical, old.physical):
                # no copy on it is in flight (its events fired): copies that agree are one
                # tensor again, and the host's ops on it run once (`Buffer.split`)
                old.logical = old.physical
            if block.buffer.physical.dtype != dtype:
                self._retype(block, dtype, hint, site)
        else:
            numel = max(bucket // esize, 1)
            buffer = self.memory.new_pinned(numel, dtype, hint)
            storage = buffer.physical.untyped_storage()._cdata
            block = _PinnedBlock(buffer, storage, _use_count(storage), bucket)
            self.blocks[id(buffer)] = block
        self.live.append(block)
        tensor = self.memory.pinned_tensor(block.buffer, where)
        _copy_into(tensor, made)
        if block.buffer.logical is not block.buffer.physical:
            _copy_into(same_geometry(block.buffer.logical, tensor), made)
        return tensor

    def _retype(self, block: _PinnedBlock, dtype: torch.dtype, hint: str, site: Any) -> None:
        """The block's memory for a tensor of another dtype: a new buffer on it, whose cells
        the race checker maps to the old buffer's (a `Reuse` with a `source`)."""
        old = block.buffer
        buffer = self.memory.retype_pinned(old, dtype, hint)
        esize, old_esize = buffer.physical.element_size(), old.physical.element_size()
        trace = self.runtime.device.trace
        here = caller() if site is UNKNOWN else site
        step = self.runtime.device.recorder.step
        trace.reuses.append(
            Reuse(
                buffer.name,
                len(trace.ops),
                HOST,
                None,
                0,
                here,
                step,
                source=old.name,
                cells=(0, block.bucket // esize),
                source_cells=(0, block.bucket // old_esize),
            )
        )
        trace.sizes[buffer.name] = buffer.numel
        block.buffer = buffer
        block.own = _use_count(block.storage)
        self.blocks[id(buffer)] = block

    def copied(self, buffers: list[Buffer], stream: SimStream, site: Any = UNKNOWN) -> None:
        """A stream op just issued on `stream` reads or writes these pinned buffers: an event
        after it, as PyTorch's copies record one (`site`: the op's, when known)."""
        blocks = [self.blocks[id(b)] for b in buffers if id(b) in self.blocks]
        if blocks:
            marker = self.runtime.record(stream, why="pinned", site=site)
            for block in blocks:
                block.markers[stream.name] = marker

    def _collect(self) -> None:
        """Blocks no tensor of the program's uses any more are free."""
        still = []
        count = torch._C._storage_Use_Count  # (`_use_count`, inline: every live block a call)
        for block in self.live:
            if count(block.storage) > block.own:
                still.append(block)
            else:
                self.free.setdefault(block.bucket, []).append(block)
        self.live = still

"""PyTorch's two caching allocators, as far as they decide which memory a new tensor gets.

**Device** (`CUDACachingAllocator`). A block belongs to the stream it was allocated on and only an
allocation on that stream ever gets it again. Freed (its last tensor gone), it goes back to that
stream's pool at once: the stream's later work is ordered after the block's earlier uses on the
same stream, but not after its uses on other streams. `Tensor.record_stream(s)` names such a
stream: the free then records an event on each named stream, and the block rejoins the pool only
once an allocation finds all those events complete. Without it, the next allocation on the
allocating stream may get the block while another stream still reads or writes it: the old and
the new tensor are the same cells of the same buffer, so the race checker sees the two uses, and
the values show it too. Sizes are rounded up to 512 bytes; a request up to 1 MiB comes from the
small pool, a larger one from the large pool, and each is served best fit from its own pool.

**Host** (`CachingHostAllocator`). Every non-blocking copy to or from a pinned block records an
event on the copy's stream. A freed block is handed to a later pinned allocation of the same
power-of-two size only once its events are complete.

An allocation that finds an event complete has queried it: the host is then ordered after the
event, as after any successful `Event.query()`, and the trace says so (a host `query`). So a reuse
the allocators make is ordered after every use they waited for, and correct code stays clean.

Frees are seen at safe points (the start of the next aten call, an allocation), never in the
middle of issuing an op: a device tensor's death is reported by a weak reference, a pinned
block's by its storage's use count falling back to the allocator's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from overlapcheck.backends.torchsim.memory import Buffer, Geometry, Memory, same_geometry
from overlapcheck.backends.torchsim.streams import Marker, SimStream, StreamRuntime
from overlapcheck.core.sites import Site, caller
from overlapcheck.core.trace import Reuse

ROUND = 512  # bytes: every device block is a multiple
SMALL = 1 << 20  # bytes: device requests up to this come from the small pool


@dataclass(eq=False)
class _Block:
    buffer: Buffer
    stream: SimStream  # the stream it was allocated on
    uses: list[SimStream] = field(default_factory=list)  # other streams, by record_stream
    markers: list[Marker] = field(default_factory=list)  # freed: events it waits for
    freed: tuple[Site | None, int] = (None, 0)  # where the program dropped its last tensor, step

    @cached_property
    def nbytes(self) -> int:
        return self.buffer.numel * self.buffer.physical.element_size()

    @cached_property
    def dtype(self) -> torch.dtype:
        return self.buffer.physical.dtype


class DeviceAllocator:
    """Which device buffer a new tensor on the current stream gets."""

    def __init__(self, runtime: StreamRuntime, memory: Memory) -> None:
        self.runtime = runtime
        self.memory = memory
        self.blocks: dict[int, _Block] = {}  # by id of the buffer
        self.dead: list[Buffer] = []  # freed by the program, not yet seen by the allocator
        self.held: list[_Block] = []  # freed, waiting for the events of their record_stream
        self.pools: dict[str, list[_Block]] = {}  # by stream name: free blocks, in free order
        self.reused = 0  # allocations served from a pool

    def allocate(self, like: torch.Tensor, hint: str) -> Buffer:
        """A buffer for `like`'s storage (dtype and size) on the current stream."""
        self.collect()
        self._release()
        dtype, size = like.dtype, like.element_size()
        nbytes = like.untyped_storage().nbytes()
        if nbytes == 0:  # no block at all, as in PyTorch
            return self.memory.new_device(0, dtype, hint)
        rounded = -(-nbytes // ROUND) * ROUND
        stream = self.runtime.current
        pool = self.pools.setdefault(stream.name, [])
        small = rounded <= SMALL
        fits = [
            b
            for b in pool
            if b.dtype == dtype and b.nbytes >= rounded and (b.nbytes <= SMALL) == small
        ]
        if fits:
            block = min(fits, key=lambda b: b.nbytes)  # best fit; the earliest freed of a size
            pool.remove(block)
            self.reused += 1
            trace = self.runtime.device.trace
            trace.reuses.append(
                Reuse(
                    block.buffer.name,
                    len(trace.ops),
                    stream.name,
                    *block.freed,
                    caller(),
                    self.runtime.device.recorder.step,
                )
            )
            return block.buffer
        buffer = self.memory.new_device(rounded // size, dtype, hint)
        buffer.on_free = self._freed
        self.blocks[id(buffer)] = _Block(buffer, stream)
        return buffer

    def record_stream(self, buffer: Buffer, stream: SimStream) -> None:
        """`Tensor.record_stream(stream)` on a tensor of `buffer`."""
        block = self.blocks.get(id(buffer))
        if block is not None and stream is not block.stream and stream not in block.uses:
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
            block = self.blocks[id(buffer)]
            if buffer.holders:
                continue
            if block.uses:
                block.markers = [self.runtime.record(s, why="free") for s in block.uses]
                block.uses = []
                self.held.append(block)
            else:
                self.pools.setdefault(block.stream.name, []).append(block)

    def _release(self) -> None:
        """Held blocks whose events are all complete (the host queries them) go to their pool."""
        for block in list(self.held):
            if all(m.query() for m in block.markers):
                for marker in block.markers:
                    self.runtime.observe(marker, why="free")
                block.markers = []
                self.held.remove(block)
                self.pools.setdefault(block.stream.name, []).append(block)


@dataclass(eq=False)
class _PinnedBlock:
    buffer: Buffer
    storage: int  # the storage's handle, for its use count
    own: int  # its use count when only the allocator holds it
    markers: dict[str, Marker] = field(default_factory=dict)  # by stream: after its last copy

    @cached_property
    def dtype(self) -> torch.dtype:
        return self.buffer.physical.dtype

    @cached_property
    def bucket(self) -> int:
        return _bucket(self.buffer.numel * self.buffer.physical.element_size())


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
        self.blocks: dict[int, _PinnedBlock] = {}  # by id of the buffer
        self.live: list[_PinnedBlock] = []
        self.free: list[_PinnedBlock] = []  # in free order
        self.reused = 0

    def allocate(self, made: torch.Tensor, hint: str) -> torch.Tensor:
        """A pinned tensor with the sizes, dtype and values of `made` (a fresh, plain one)."""
        self._collect()
        dtype = made.dtype
        where: Geometry = (tuple(made.size()), tuple(made.stride()), 0)
        bucket = _bucket(made.untyped_storage().nbytes())
        block = next(
            (
                b
                for b in self.free
                if b.dtype == dtype
                and b.bucket == bucket
                and all(m.query() for m in b.markers.values())
            ),
            None,
        )
        if block is not None:
            for marker in block.markers.values():
                self.runtime.observe(marker, why="pinned")
            block.markers = {}
            self.free.remove(block)
            self.reused += 1
        else:
            numel = max(bucket // made.element_size(), 1)
            buffer = self.memory.new_pinned(numel, dtype, hint)
            storage = buffer.physical.untyped_storage()._cdata
            block = _PinnedBlock(buffer, storage, _use_count(storage))
            self.blocks[id(buffer)] = block
        self.live.append(block)
        tensor = self.memory.pinned_tensor(block.buffer, where)
        tensor.copy_(made)
        same_geometry(block.buffer.logical, tensor).copy_(made)
        return tensor

    def copied(self, buffers: list[Buffer], stream: SimStream) -> None:
        """A stream op just issued on `stream` reads or writes these pinned buffers: an event
        after it, as PyTorch's copies record one."""
        blocks = [self.blocks[id(b)] for b in buffers if id(b) in self.blocks]
        if blocks:
            marker = self.runtime.record(stream, why="pinned")
            for block in blocks:
                block.markers[stream.name] = marker

    def _collect(self) -> None:
        """Blocks no tensor of the program's uses any more are free."""
        still = []
        for block in self.live:
            if _use_count(block.storage) > block.own:
                still.append(block)
            else:
                self.free.append(block)
        self.live = still

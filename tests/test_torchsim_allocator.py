"""The simulated CUDA's caching allocators as PyTorch's: size classes and rounding, blocks split
from segments and merged when freed, memory reused across dtypes, and the reuse race that only a
split block exposes, found by the race checker with the freed and the reused tensor named."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

torch = pytest.importorskip("torch")

from overlapcheck.backends.sim.device import SimDevice  # noqa: E402
from overlapcheck.backends.sim.toy_model import ToyModel  # noqa: E402
from overlapcheck.backends.torchsim.allocators import (  # noqa: E402
    LARGE_SEGMENT,
    SMALL_SEGMENT,
    DeviceAllocator,
    round_size,
    segment_size,
    should_split,
)
from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402
from overlapcheck.core.config import SchedulerConfig  # noqa: E402
from overlapcheck.invariants.base import InvariantViolated, Violation  # noqa: E402
from overlapcheck.invariants.no_race import NoRace  # noqa: E402
from overlapcheck.invariants.races import RaceDetector  # noqa: E402

MiB = 1 << 20


def _device() -> SimDevice:
    cfg = SchedulerConfig()
    return SimDevice(cfg, ToyModel(cfg.vocab_size, cfg.eos_token_id))


def _allocator(cuda: SimulatedCuda) -> DeviceAllocator:
    return cuda.interceptor.device_memory


def _span(cuda: SimulatedCuda, tensor: torch.Tensor) -> tuple[int, int]:
    """The address and size of the block a live device tensor got."""
    block = _allocator(cuda).blocks[id(tensor.buffer)]  # type: ignore[attr-defined]
    return block.ptr, block.size


# -- size classes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "rounded"),
    [(1, 512), (511, 512), (512, 512), (513, 1024), (3 * MiB + 1, 3 * MiB + 512)],
)
def test_requests_round_up_to_512_bytes(nbytes: int, rounded: int) -> None:
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, SMALL_SEGMENT),
        (MiB, SMALL_SEGMENT),  # the small pool's largest request
        (MiB + 512, LARGE_SEGMENT),
        (10 * MiB - 512, LARGE_SEGMENT),
        (10 * MiB, 10 * MiB),  # from 10 MiB on: a segment of its own, rounded to 2 MiB
        (11 * MiB, 12 * MiB),
    ],
)
def test_a_request_with_no_free_block_reserves_a_segment_of_its_class(
    size: int, segment: int
) -> None:
    assert segment_size(size) == segment


@pytest.mark.parametrize(
    ("block", "size", "split"),
    [
        (2 * MiB, 512, True),
        (1024, 512, True),  # 512 bytes remain: a small block of their own
        (1024, 1024, False),
        (3 * MiB, 2 * MiB, False),  # a large block splits only with more than 1 MiB left
        (3 * MiB + 512, 2 * MiB, True),
    ],
)
def test_a_block_splits_when_enough_remains_for_its_pool(
    block: int, size: int, split: bool
) -> None:
    assert should_split(block, size) is split


# -- split, merge, reuse across dtypes -----------------------------------------------------------


def test_small_tensors_are_carved_from_one_segment_and_freed_neighbours_merge() -> None:
    device = _device()
    cuda = SimulatedCuda(device, ("main",))
    with cuda, torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        a = torch.zeros(256, dtype=torch.int32, device="cuda")  # 1024 bytes
        b = torch.zeros(100, dtype=torch.float32, device="cuda")  # 400: a 512-byte block
        c = torch.zeros(128, dtype=torch.int64, device="cuda")  # 1024
        assert [_span(cuda, t) for t in (a, b, c)] == [(0, 1024), (1024, 512), (1536, 1024)]
        assert _allocator(cuda).segments == 1
        names = a.buffer.name, b.buffer.name
        del a, b  # neighbours: one free block of 1536 bytes once both are seen
        d = torch.zeros(384, dtype=torch.float32, device="cuda")  # 1536: fits only merged
        assert _span(cuda, d) == (0, 1536)
        assert d.buffer.name not in names  # another dtype and size: a buffer of its own
        moved = [r for r in device.trace.reuses if r.buffer == d.buffer.name]
        assert [r.source for r in moved] == list(names)
        assert _allocator(cuda).segments == 1
        # a large request splits a 20 MiB segment; the next one fits in what remains
        e = torch.zeros(2 * MiB // 4, dtype=torch.float32, device="cuda")
        f = torch.zeros(3 * MiB, dtype=torch.uint8, device="cuda")
        (e_at, e_size), (f_at, _) = _span(cuda, e), _span(cuda, f)
        assert e_size == 2 * MiB and f_at == e_at + 2 * MiB
        assert _allocator(cuda).segments == 2
        del c, d, e, f


def test_a_freed_block_goes_to_a_smaller_tensor_of_another_dtype_with_its_bytes() -> None:
    device = _device()
    cuda = SimulatedCuda(device, ("main",))
    with cuda, torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        x = torch.arange(1, 129, dtype=torch.int64, device="cuda")  # 1024 bytes
        keep = torch.zeros(4, dtype=torch.int32, device="cuda")  # after it: x merges with none
        old = x.buffer.name
        torch.cuda.synchronize()  # x's values are in the memory before it is freed
        del x
        y = torch.empty(64, dtype=torch.int32, device="cuda")  # 256: a 512-byte split of x's
        assert _span(cuda, y) == (0, 512)
        assert y.buffer.name != old
        (reuse,) = [r for r in device.trace.reuses if r.buffer == y.buffer.name]
        assert reuse.source == old
        # its 128 int32 cells are the bytes of x's first 64 int64 cells
        assert (reuse.cells, reuse.source_cells) == ((0, 128), (0, 64))
        # empty memory holds what the freed tensor left there, as on a GPU
        assert y.cpu().view(torch.int64).tolist() == list(range(1, 33))
        # the rest of x's block is free: a same-dtype tensor there is x's buffer again
        z = torch.zeros(64, dtype=torch.int64, device="cuda")
        assert _span(cuda, z) == (512, 512)
        del keep
    assert _span_name(device, z) == (old, list(range(64, 128)))


def _span_name(device: SimDevice, tensor: torch.Tensor) -> tuple[str, list[int]]:
    """The buffer the trace names `tensor`'s allocation by, and its cells there."""
    allocation = next(a for a in reversed(device.trace.allocations) if a.what == "zeros")
    return allocation.buffer, allocation.cells.tolist()


# -- the reuse race only a split block exposes ---------------------------------------------------

# The scheduler's side, as a file of its own outside overlapcheck (findings name the scheduler's
# files): the scheduler stream stages two index tensors carved from one segment; the engine
# gathers through the second; the host drops it and stages a mask of another dtype and size,
# which the allocator carves from the freed block.
PROGRAM = """
import torch


def program(record, host_waits, stream_waits):
    engine, scheduler = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.set_stream(scheduler)
    pool = torch.arange(100, 356, dtype=torch.int32, device="cuda")
    first = torch.tensor([1, 2], dtype=torch.int64, pin_memory=True).to("cuda", non_blocking=True)
    rows = torch.arange(0, 256, 2, dtype=torch.int64, pin_memory=True).to("cuda", non_blocking=True)
    with torch.cuda.stream(engine):
        engine.wait_stream(scheduler)
        for _ in range(3):
            pool.add_(0)
        gathered = pool[rows]
        if record:
            rows.record_stream(engine)
        done = torch.cuda.Event()
        done.record(engine)
    del rows
    if host_waits:
        done.synchronize()
    if stream_waits:
        scheduler.wait_stream(engine)
    mask = torch.ones(64, dtype=torch.bool, device="cuda")
    return first, mask, gathered
"""
FREE_LINE = PROGRAM.splitlines().index("    del rows") + 1
REUSE_LINE = (
    PROGRAM.splitlines().index('    mask = torch.ones(64, dtype=torch.bool, device="cuda")') + 1
)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    path = tmp_path_factory.mktemp("user") / "prog.py"
    path.write_text(PROGRAM)
    namespace: dict[str, Any] = {}
    exec(compile(PROGRAM, str(path), "exec"), namespace)
    return cast(Callable[..., Any], namespace["program"])


def _run(
    program: Callable[..., Any],
    record: bool = False,
    host_waits: bool = False,
    stream_waits: bool = False,
) -> tuple[SimDevice, dict[str, str]]:
    device = _device()
    cuda = SimulatedCuda(device, ("engine", "scheduler"))
    with cuda, torch.inference_mode():
        first, mask, gathered = program(record, host_waits, stream_waits)
        names = {"first": first.buffer.name, "mask": mask.buffer.name}
        del first, mask, gathered
        torch.cuda.synchronize()
    return device, names


def _no_race(device: SimDevice) -> Violation | None:
    check = NoRace()
    check.run = SimpleNamespace(trace=device.trace, step=1, now=lambda: 0.0)  # type: ignore[assignment]
    check.detector = RaceDetector()
    try:
        check.check()
    except InvariantViolated as e:
        return e.violation
    return None


def test_a_mask_carved_from_a_freed_index_block_while_the_engine_reads_it_is_a_race(
    program: Callable[..., Any],
) -> None:
    device, names = _run(program)
    mask = names["mask"]
    (reuse,) = [r for r in device.trace.reuses if r.buffer == mask]
    rows = reuse.source
    assert rows is not None and rows not in (mask, names["first"])  # rows: its own block
    violation = _no_race(device)
    assert violation is not None and violation.details["kind"] == "WAR"
    assert violation.details["buffer"] == mask
    first = device.trace.ops[violation.details["first"]["seq"]]
    assert first.agent == "engine" and first.label.startswith("index")
    assert any(a.buffer == rows for a in first.accesses)  # the gather read the freed rows
    assert f"the tensor {rows} was freed" in violation.message
    assert f"reused by the caching allocator for {mask}" in violation.message
    roles = {loc.role: loc for loc in violation.locations}
    assert roles["freed"].line == FREE_LINE and roles["freed"].file.endswith("prog.py")
    assert roles["reused"].line == REUSE_LINE and roles["reused"].agent == "scheduler"


@pytest.mark.parametrize(
    ("record", "host_waits", "stream_waits"),
    [(True, False, False), (True, True, False), (False, False, True)],
    ids=["record_stream", "record_stream+host-waits", "wait_stream"],
)
def test_the_same_program_ordered_is_clean(
    program: Callable[..., Any], record: bool, host_waits: bool, stream_waits: bool
) -> None:
    device, names = _run(program, record, host_waits, stream_waits)
    assert _no_race(device) is None
    reused = [r for r in device.trace.reuses if r.buffer == names["mask"]]
    # record_stream without a wait holds the block: the mask gets fresh memory; after the host
    # saw the engine done, or with the stream ordered, it gets the freed block, cleanly
    assert bool(reused) is (host_waits or stream_waits)


# -- pinned host memory --------------------------------------------------------------------------


def test_a_freed_pinned_block_goes_to_another_dtype_of_its_power_of_two_size() -> None:
    device = _device()
    cuda = SimulatedCuda(device, ("main",))
    with cuda, torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        out = torch.zeros(2, dtype=torch.int64, device="cuda")
        staged = torch.tensor([7, 9], dtype=torch.int64, pin_memory=True)  # 16 bytes
        out.copy_(staged, non_blocking=True)
        old, where = cuda.memory.pinned_of(staged), staged.data_ptr()
        assert old is not None
        del staged
        torch.cuda.synchronize()  # the copy ran: its event is complete
        mask = torch.empty(12, dtype=torch.bool, pin_memory=True)  # 12 bytes: 16 again
        now = cuda.memory.pinned_of(mask)
        assert mask.data_ptr() == where and now is not None and now.name != old.name
        assert mask.is_pinned() and now.physical.dtype == torch.bool
        (reuse,) = [r for r in device.trace.reuses if r.buffer == now.name]
        assert reuse.source == old.name
        assert (reuse.cells, reuse.source_cells) == ((0, 16), (0, 2))  # the two int64s' bytes
        assert out.cpu().tolist() == [7, 9]
        del mask
    assert RaceDetector().check(device.trace) is None

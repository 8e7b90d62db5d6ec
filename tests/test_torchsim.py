"""The simulated CUDA under plain torch code: streams, events, pinned copies, implicit syncs, and
footprints the race checker reads."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from overlapcheck.backends.sim.device import SimDevice  # noqa: E402
from overlapcheck.backends.sim.toy_model import ToyModel  # noqa: E402
from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402
from overlapcheck.core.config import SchedulerConfig  # noqa: E402
from overlapcheck.core.trace import HOST  # noqa: E402
from overlapcheck.invariants.races import Race, RaceDetector  # noqa: E402


def _device() -> SimDevice:
    cfg = SchedulerConfig()
    return SimDevice(cfg, ToyModel(cfg.vocab_size, cfg.eos_token_id))


def _program(wait: bool, sync_before_read: bool) -> tuple[SimDevice, list[int]]:
    """The overlap pattern: the scheduler stream copies indices in, the engine stream gathers and
    writes through them, copies a row out; the host reads it."""
    device = _device()
    with SimulatedCuda(device, ("engine", "scheduler")), torch.inference_mode():
        engine, scheduler = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.set_stream(scheduler)
        pool = torch.zeros(4, 8, dtype=torch.int32, device="cuda")
        rows = torch.tensor([5, 6, 7], dtype=torch.int64, pin_memory=True)
        idx = rows.to("cuda", non_blocking=True)
        with torch.cuda.stream(engine):
            if wait:
                engine.wait_stream(scheduler)
            pool[2, idx] = pool[1][idx] + 7
            out = pool[2].to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record(engine)
        if sync_before_read:
            done.synchronize()
        values = out.tolist()
        if not sync_before_read:
            done.synchronize()
    return device, values


def _race(device: SimDevice) -> Race | None:
    return RaceDetector().check(device.trace)


def test_ordered_streams_and_a_synced_read_are_clean_and_correct() -> None:
    device, values = _program(wait=True, sync_before_read=True)
    assert _race(device) is None
    assert values == [0, 0, 0, 0, 0, 7, 7, 7]


def test_a_missing_wait_stream_is_a_race_on_the_indexed_cells_only() -> None:
    device, _ = _program(wait=False, sync_before_read=True)
    race = _race(device)
    assert race is not None and race.kind == "RAW"
    first, second = device.trace.ops[race.first], device.trace.ops[race.second]
    assert (first.agent, second.agent) == ("scheduler", "engine")
    # the gather reads pool[1, 5:8] only: cells 13..15, not the whole pool
    assert set(race.cells) <= {13, 14, 15} or first.kind == "h2d"


def test_reading_a_pinned_buffer_before_its_copy_landed_sees_what_it_held_then() -> None:
    device, values = _program(wait=True, sync_before_read=False)
    assert values == [-1] * 8  # poison: the D2H had not run at that simulated instant
    race = _race(device)
    assert race is not None
    assert device.trace.ops[race.second].agent == HOST
    assert device.trace.ops[race.first].kind == "d2h"


def test_item_of_a_device_value_is_an_implicit_sync_on_the_current_stream() -> None:
    device = _device()
    with SimulatedCuda(device, ("engine",)), torch.inference_mode():
        stream = torch.cuda.Stream()
        torch.cuda.set_stream(stream)
        x = torch.arange(10, dtype=torch.int64, device="cuda")
        total = int(x.sum().item())
        flag = bool((x > 3).any())
    assert total == 45 and flag
    waits = [op for op in device.trace.ops if op.kind == "host_wait"]
    assert len(waits) == 2 and all("implicit sync" in op.label for op in waits)
    assert device.now() > 0


def test_a_composite_runs_as_its_parts_as_on_a_gpu() -> None:
    """Inference mode hands the mode `repeat_interleave` whole (the autograd key that splits a
    `CompositeImplicitAutograd` op is skipped); on a GPU its parts run: a count of the output's
    size from device values (an implicit sync) and an `index_select`, each a kernel."""
    device = _device()
    with SimulatedCuda(device, ("engine",)), torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        values = torch.tensor([10, 20, 30], device="cuda")
        repeated = values.repeat_interleave(torch.tensor([1, 0, 2], device="cuda"))
        assert repeated.tolist() == [10, 30, 30]
    labels = [op.label for op in device.trace.ops]
    assert any(label.startswith("index_select") for label in labels)
    waits = [op for op in device.trace.ops if op.kind == "host_wait"]
    assert any("repeat_interleave (data-dependent shape)" in op.label for op in waits)
    # the count (`repeat_interleave.Tensor`) and the gather, where the whole op was one kernel
    kernels = [op.label.split(" @")[0] for op in device.trace.ops if op.kind == "kernel"]
    assert kernels[-2:] == ["repeat_interleave", "index_select"]


def test_views_at_offsets_are_cells_of_one_buffer() -> None:
    device = _device()
    cuda = SimulatedCuda(device, ("a", "b"))
    with cuda, torch.inference_mode():
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            pool = torch.zeros(3, 6, dtype=torch.int32, device="cuda")
        b.wait_stream(a)
        with torch.cuda.stream(a):
            pool[1, 4:].fill_(1)
        with torch.cuda.stream(b):
            pool[1, :3].fill_(2)  # disjoint from a's write: no race
    assert _race(device) is None
    with cuda, torch.inference_mode(), torch.cuda.stream(b):  # a later block of the same run
        pool[1, 3:].fill_(3)  # overlaps a's cells 10..11
    race = _race(device)
    assert race is not None and race.kind == "WAW" and set(race.cells) == {10, 11}


def test_an_index_taking_a_dimension_whole_touches_the_cells_of_its_columns() -> None:
    """`t[:, idx]` is `aten.index` with None for the dimension taken whole (not a new one):
    its read, and the same assignment's write, are the picked columns of every row."""
    device = _device()
    with SimulatedCuda(device, ("a",)), torch.inference_mode():
        t = torch.arange(12, device="cuda").reshape(3, 4)
        idx = torch.tensor([0, 2], device="cuda")
        picked = t[:, idx]
        t[:, idx] = torch.zeros(3, 2, dtype=torch.int64, device="cuda")
        assert picked.tolist() == [[0, 2], [4, 6], [8, 10]]
    ops = device.trace.ops
    pool = next(op.accesses[0].buffer for op in ops if op.label.startswith("arange"))
    touched = {
        (op.label.split()[0], a.mode): [int(c) for c in a.cells]
        for op in ops
        if op.label.startswith(("index ", "index_put_ "))
        for a in op.accesses
        if a.buffer == pool
    }
    columns = [0, 2, 4, 6, 8, 10]
    assert touched == {("index", "r"): columns, ("index_put_", "w"): columns}


# -- the caching allocators ----------------------------------------------------------------------


def _staged_batches(record: bool, sync: bool) -> tuple[SimDevice, list[list[int]]]:
    """Each round, the scheduler stream stages two indices that the engine stream gathers
    through; the host drops them once it has launched the gather (as an overlap scheduler drops
    a batch's inputs), then stages the next round's: the device allocator may give the next
    round's indices the same block. `record`: the indices are `record_stream`ed on the engine
    stream; `sync`: the host waits for each round before the next."""
    device = _device()
    with SimulatedCuda(device, ("engine", "scheduler")), torch.inference_mode():
        engine, scheduler = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.set_stream(scheduler)
        pool = torch.arange(100, 132, dtype=torch.int32, device="cuda")
        outs = []
        for step in range(3):
            host = torch.tensor([step, step + 8], dtype=torch.int64, pin_memory=True)
            idx = host.to("cuda", non_blocking=True)
            with torch.cuda.stream(engine):
                engine.wait_stream(scheduler)
                for _ in range(3):  # the engine is busy a while before it reads the indices
                    pool.add_(0)
                gathered = pool[idx]
                if record:
                    idx.record_stream(engine)
                outs.append(gathered.to("cpu", non_blocking=True))
                done = torch.cuda.Event()
                done.record(engine)
            del idx, gathered
            if sync:
                done.synchronize()
        torch.cuda.synchronize()
    return device, [out.tolist() for out in outs]


def _blocks(device: SimDevice, mode: str) -> list[str]:
    """The device block each H2D wrote (`mode` "w") or the pinned one it read ("r")."""
    ops = [op for op in device.trace.ops if op.kind == "h2d"]
    return [a.buffer for op in ops for a in op.accesses if a.mode == mode]


EXPECTED = [[100, 108], [101, 109], [102, 110]]


def test_a_block_freed_while_another_stream_reads_it_is_reused_at_once_a_race() -> None:
    device, values = _staged_batches(record=False, sync=False)
    race = _race(device)
    assert race is not None and race.kind == "WAR"
    first, second = device.trace.ops[race.first], device.trace.ops[race.second]
    assert (first.agent, first.label.split()[0]) == ("engine", "index")
    assert (second.agent, second.kind) == ("scheduler", "h2d")
    gathers = _blocks(device, "w")
    assert len(set(gathers)) == 1  # one block for all three rounds' indices
    assert values != EXPECTED  # and a gather read the next round's indices


@pytest.mark.parametrize("sync", [False, True], ids=["no-wait", "host-waits"])
def test_record_stream_keeps_the_block_until_the_reading_stream_is_done(sync: bool) -> None:
    device, values = _staged_batches(record=True, sync=sync)
    assert _race(device) is None
    assert values == EXPECTED
    gathers = _blocks(device, "w")
    if sync:  # the host saw each round done: the block comes back, its event queried
        assert len(set(gathers)) == 1
        assert any(op.kind == "host_query" and "(free)" in op.label for op in device.trace.ops)
    else:  # the engine may still read it at every allocation: a new block each round
        assert len(set(gathers)) == 3


def _staged_copies(sync: bool, overwrite: bool) -> tuple[SimDevice, list[int]]:
    """Each round stages a value in a fresh pinned tensor and copies it to the device without
    blocking; the host drops the pinned tensor (or, `overwrite`, writes it again) at once."""
    device = _device()
    with SimulatedCuda(device, ("engine",)), torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        out = torch.zeros(3, dtype=torch.int64, device="cuda")
        for step in range(3):
            host = torch.empty(1, dtype=torch.int64, pin_memory=True)
            host.fill_(10 + step)
            out[step : step + 1].copy_(host, non_blocking=True)
            if overwrite:
                host.fill_(-5)
            del host
            if sync:
                torch.cuda.synchronize()
        values = out.cpu().tolist()
    return device, values


@pytest.mark.parametrize("sync", [False, True], ids=["no-wait", "host-waits"])
def test_a_pinned_block_is_reused_only_after_its_copy_ran(sync: bool) -> None:
    device, values = _staged_copies(sync, overwrite=False)
    assert _race(device) is None
    assert values == [10, 11, 12]
    staged = _blocks(device, "r")
    assert len(set(staged)) == (1 if sync else 3)


def test_a_pinned_output_read_after_its_event_is_reused_for_the_next_output_cleanly() -> None:
    # an overlap loop's result buffer: D2H into fresh pinned memory, event, host reads, drops it
    device = _device()
    got = []
    with SimulatedCuda(device, ("engine",)), torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        for step in range(3):
            tokens = torch.full((2,), 7 + step, dtype=torch.int32, device="cuda")
            out = tokens.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            got.append(out.tolist())
            del out
    assert _race(device) is None
    assert got == [[7, 7], [8, 8], [9, 9]]
    written = [a.buffer for op in device.trace.ops if op.kind == "d2h" for a in op.accesses]
    assert len({b for b in written if b.startswith("host:")}) == 1


def test_overwriting_a_pinned_buffer_before_its_copy_ran_is_a_race() -> None:
    device, values = _staged_copies(sync=False, overwrite=True)
    race = _race(device)
    assert race is not None and device.trace.ops[race.second].agent == HOST
    assert values == [-5, -5, -5]  # each copy read the buffer after the host's second write


SCRIPT = """
import sys
sys.path.insert(0, {path!r})
from tests.test_torchsim import _program
device, _ = _program(wait=False, sync_before_read=False)
print(device.trace.digest())
"""


def test_the_same_program_gives_the_same_trace_in_another_process() -> None:
    import overlapcheck

    root = str(__import__("pathlib").Path(overlapcheck.__file__).resolve().parent)
    code = SCRIPT.format(path=root)
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    ).stdout.strip()
    here = _program(wait=False, sync_before_read=False)[0].trace.digest()
    assert there == here and len(here) == 32


def test_plain_blocks_nest_and_leave_torch_as_it_was() -> None:
    """A block inside another changes nothing; the outer one takes the modes off, turns
    inference mode on, and puts both back as they were."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from overlapcheck.backends.torchsim.guards import plain

    seen: list[str] = []

    class Seeing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seeing():
        with plain():
            assert torch.is_inference_mode_enabled()
            with plain():
                torch.ones(2).add_(1)
            torch.ones(2).add_(1)
            assert torch.is_inference_mode_enabled()
        assert not seen
        assert not torch.is_inference_mode_enabled()
        torch.ones(2).add_(1)
    assert seen and torch._C._is_torch_function_enabled()

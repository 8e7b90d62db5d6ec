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

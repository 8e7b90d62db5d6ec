"""`no-uninit-read`: a forward or a device-to-host copy that reads device memory nothing wrote
fires, naming the allocation and the read; the same program with the memory written is silent."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

torch = pytest.importorskip("torch")

from overlapcheck.backends.sim.device import SimDevice  # noqa: E402
from overlapcheck.backends.sim.timing import Cost  # noqa: E402
from overlapcheck.backends.sim.toy_model import ToyModel  # noqa: E402
from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402
from overlapcheck.core.config import SchedulerConfig  # noqa: E402
from overlapcheck.invariants.base import InvariantViolated, Violation  # noqa: E402
from overlapcheck.invariants.registry import INVARIANTS  # noqa: E402
from overlapcheck.invariants.uninit import NoUninitRead  # noqa: E402

Alloc = Callable[[torch.Tensor], torch.Tensor]


# The scheduler's side of the fragment, as a file of its own outside overlapcheck (findings name
# the scheduler's files, not the checker's): per-batch input ids made with `make` (like a pool of
# 4), rows 0..1 written by a copy, and the engine stream's forward reading rows 0..read_rows-1
# (or copying them to the host).
PROGRAM = """
import torch


def program(cuda, make, launch, read_rows, copy_out):
    engine, scheduler = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.set_stream(scheduler)
    pool = torch.zeros(4, dtype=torch.int32, device="cuda")
    ids = make(pool)
    ids[:2] = torch.tensor([3, 5], dtype=torch.int32, pin_memory=True).to(
        "cuda", non_blocking=True
    )
    engine.wait_stream(scheduler)
    with torch.cuda.stream(engine):
        if copy_out:
            ids[:read_rows].to("cpu", non_blocking=True)
        else:
            launch(ids[:read_rows], pool)
"""
MAKE_LINE = PROGRAM.splitlines().index("    ids = make(pool)") + 1


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., None]:
    path = tmp_path_factory.mktemp("user") / "prog.py"
    path.write_text(PROGRAM)
    namespace: dict[str, Any] = {}
    exec(compile(PROGRAM, str(path), "exec"), namespace)
    return cast(Callable[..., None], namespace["program"])


def _fragment(
    program: Callable[..., None], make: Alloc, read_rows: int = 4, copy_out: bool = False
) -> SimDevice:
    cfg = SchedulerConfig()
    device = SimDevice(cfg, ToyModel(cfg.vocab_size, cfg.eos_token_id))
    cuda = SimulatedCuda(device, ("engine", "scheduler"))

    def launch(ids: torch.Tensor, pool: torch.Tensor) -> None:
        cuda.launch(
            "forward",
            "D1",
            [(ids, None, "r"), (pool, None, "w")],
            Cost(1e-5, 0.0),
            lambda: lambda: None,
            batch=1,
            uids=(7,),
        )

    with cuda, torch.inference_mode():
        program(cuda, make, launch, read_rows, copy_out)
        cuda.drain()
    return device


def _check(device: SimDevice) -> Violation | None:
    check = NoUninitRead()
    check.run = SimpleNamespace(trace=device.trace, step=1, now=lambda: 0.0)  # type: ignore[assignment]
    try:
        check.finish()
    except InvariantViolated as e:
        return e.violation
    return None


def test_a_forward_reading_empty_like_memory_fires_naming_the_allocation_and_the_read(
    program: Callable[..., None],
) -> None:
    violation = _check(_fragment(program, torch.empty_like))
    assert violation is not None and violation.invariant == "no-uninit-read"
    assert violation.uids == (7,)
    details = violation.details
    assert details["cells"] == [2, 3]  # rows 2..3: never written; 0..1 were copied into
    assert details["read"]["label"] == "D1" and details["read"]["agent"] == "engine"
    allocation = details["allocation"]
    assert allocation["op"] == "empty_like"
    assert (allocation["file"], allocation["line"]) == ("prog.py", MAKE_LINE)
    assert allocation["function"] == "program"
    assert f"empty_like @prog.py:{MAKE_LINE} program" in violation.message
    allocated, read = violation.locations  # structured, the allocation first
    assert (allocated.role, allocated.what, allocated.line) == (
        "allocated",
        "empty_like",
        MAKE_LINE,
    )
    assert allocated.file.endswith("prog.py") and allocated.function == "program"
    assert (read.role, read.agent, read.function) == ("read", "engine", "program")


@pytest.mark.parametrize(
    "make",
    [torch.zeros_like, lambda t: torch.full_like(t, 9), lambda t: torch.empty_like(t).fill_(0)],
    ids=["zeros_like", "full_like", "empty_like+fill_"],
)
def test_the_same_fragment_with_the_memory_written_is_silent(
    program: Callable[..., None], make: Alloc
) -> None:
    assert _check(_fragment(program, make)) is None


def test_reading_only_the_written_part_of_empty_memory_is_silent(
    program: Callable[..., None],
) -> None:
    assert _check(_fragment(program, torch.empty_like, read_rows=2)) is None


def test_a_device_to_host_copy_of_empty_memory_fires_and_of_zeros_does_not(
    program: Callable[..., None],
) -> None:
    violation = _check(_fragment(program, torch.empty_like, copy_out=True))
    assert violation is not None and violation.details["cells"] == [2, 3]
    assert "device-to-host copy" in violation.message
    assert _check(_fragment(program, torch.zeros_like, copy_out=True)) is None


def test_a_block_reused_by_the_caching_allocator_is_never_written_again() -> None:
    """The reused block held the old tensor's values: garbage for the new `empty` one."""
    cfg = SchedulerConfig()
    device = SimDevice(cfg, ToyModel(cfg.vocab_size, cfg.eos_token_id))
    cuda = SimulatedCuda(device, ("engine",))
    with cuda, torch.inference_mode():
        torch.cuda.set_stream(torch.cuda.Stream())
        old = torch.ones(8, dtype=torch.int32, device="cuda")
        del old
        new = torch.empty(8, dtype=torch.int32, device="cuda")
        new.to("cpu")
        cuda.drain()
    assert cuda.interceptor.device_memory.reused == 1
    violation = _check(device)
    assert violation is not None and violation.details["allocation"]["op"] == "empty"


def test_registry_key_is_the_id() -> None:
    assert INVARIANTS["no-uninit-read"]().id == "no-uninit-read"

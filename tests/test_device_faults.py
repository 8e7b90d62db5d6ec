"""A torch op of the program's that fails under the simulated CUDA is the program's crash, never
a bug of overlapcheck's: one that fails by itself at its call (an index out of range) is
`no-crash` at the program's line; one that fails only when it runs, on what memory held then (a
copy not yet landed), is reported by its cause (`no-race`) first, else as a device fault at its
launch. An exception of overlapcheck's own inside the dispatch stays ours."""

from __future__ import annotations

import importlib.util
import traceback
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from overlapcheck.backends.sim.backend import SimBackend  # noqa: E402
from overlapcheck.backends.torchsim import dispatch  # noqa: E402
from overlapcheck.core.config import SchedulerConfig  # noqa: E402
from overlapcheck.core.errors import mark_program_error  # noqa: E402
from overlapcheck.core.scenario import Scenario  # noqa: E402
from overlapcheck.harness.crash import CheckerBug, RemoteCrash, crash_violation  # noqa: E402
from overlapcheck.harness.runner import run_scenario  # noqa: E402
from overlapcheck.invariants.registry import INVARIANTS  # noqa: E402

# The scheduler, as a file of its own outside overlapcheck (its frames are the program's): one
# step runs one of its programs (by `kind`) under the simulated CUDA and ends the run.
SCHEDULER = """
import torch

from overlapcheck.backends.torchsim.session import SimulatedCuda


def out_of_range(cuda):
    pool = torch.zeros(4, device="cuda")
    index = torch.tensor([9], device="cuda")
    pool[index] = 1.0  # OUT OF RANGE


def unordered(cuda, wait):
    engine, scheduler = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.set_stream(scheduler)
    pool = torch.zeros(4, device="cuda")
    index = torch.full((1,), 1000, device="cuda")  # a stale value, out of the pool's range
    scheduler.synchronize()
    index.copy_(torch.tensor([1]).pin_memory(), non_blocking=True)
    if wait:
        engine.wait_stream(scheduler)
    with torch.cuda.stream(engine):
        pool[index] = 2.0  # READ BEFORE LANDED


def mixed_devices(cuda, moved):
    lengths = torch.zeros(4, dtype=torch.int64, device="cuda")
    extra = torch.ones(4, dtype=torch.int64)
    if moved:
        extra = extra.to("cuda")
    lengths += extra  # MIXED DEVICES


def host_index(cuda, moved):
    pool = torch.arange(8, device="cuda")
    index = torch.tensor(3)  # 0-dim, but `index_select`'s CUDA wrapper checks every tensor
    if moved:
        index = index.to("cuda")
    return pool.index_select(0, index)  # HOST INDEX


def host_lookup(cuda):
    table = torch.zeros(4, 2, device="cuda")
    # a composite on a GPU: the `index_select` it calls refuses the host index
    return torch.nn.functional.embedding(torch.tensor([1, 2]), table)  # HOST LOOKUP


class Scheduler:
    def __init__(self, config, device, source, sink, kind):
        self.cuda = SimulatedCuda(device, ("engine", "scheduler"))
        self.kind = kind

    def step(self):
        with self.cuda, torch.inference_mode():
            if self.kind == "out-of-range":
                out_of_range(self.cuda)
            elif self.kind in ("mixed", "moved"):
                mixed_devices(self.cuda, moved=self.kind == "moved")
            elif self.kind in ("host-index", "device-index"):
                host_index(self.cuda, moved=self.kind == "device-index")
            elif self.kind == "host-lookup":
                host_lookup(self.cuda)
            elif self.kind == "no-stand-in":
                torch.cuda.get_rng_state()
            else:
                unordered(self.cuda, wait=self.kind == "ordered")
            self.cuda.drain()
        return False
"""


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("user") / "faulty_scheduler.py"
    path.write_text(SCHEDULER)
    spec = importlib.util.spec_from_file_location("faulty_scheduler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCHEDULER.splitlines(), 1) if marker in text)


def _run(scheduler: tuple[Any, Path], kind: str, skip: tuple[str, ...] = ()) -> Any:
    module = scheduler[0]

    def factory(config: Any, device: Any, source: Any, sink: Any) -> Any:
        return module.Scheduler(config, device, source, sink, kind)

    scenario = Scenario("fault", SchedulerConfig(), ())
    checks = [i for i in INVARIANTS if i not in skip] if skip else None
    return run_scenario(scenario, SimBackend(), checks, scheduler=factory, keep_going=True)


def test_an_op_that_fails_at_its_call_is_the_programs_crash_at_its_line(
    scheduler: tuple[Any, Path],
) -> None:
    result = _run(scheduler, "out-of-range")
    (crash,) = [v for v in result.violations if v.invariant == "no-crash"]
    assert "IndexError" in crash.message and "out of bounds" in crash.message
    (where,) = crash.locations
    assert (where.file, where.line) == ("faulty_scheduler.py", _line("OUT OF RANGE"))


def test_an_error_of_overlapcheck_inside_the_dispatch_stays_ours(
    scheduler: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same call, now failing in the interceptor though torch runs it fine: a bug of ours."""
    real = dispatch.Interceptor._kernel

    def broken(self: Any, func: Any, *rest: Any, **kw: Any) -> Any:
        if "index_put" in str(func):
            raise IndexError("a bug in the interceptor")
        return real(self, func, *rest, **kw)

    monkeypatch.setattr(dispatch.Interceptor, "_kernel", broken)
    with pytest.raises(CheckerBug, match="a bug in the interceptor"):
        _run(scheduler, "ordered")


def test_a_kernel_that_reads_a_copy_not_yet_landed_is_reported_by_its_race(
    scheduler: tuple[Any, Path],
) -> None:
    result = _run(scheduler, "unordered")
    assert result.violations and result.violations[0].invariant in ("no-race", "no-uninit-read")
    assert all(v.invariant != "no-crash" for v in result.violations[:1])


def test_without_the_race_checks_it_is_a_device_fault_at_its_launch(
    scheduler: tuple[Any, Path],
) -> None:
    result = _run(scheduler, "unordered", skip=("no-race", "no-uninit-read"))
    (crash,) = [v for v in result.violations if v.invariant == "no-crash"]
    assert "failed on the device (engine)" in crash.message and "IndexError" in crash.message
    assert crash.details["type"] == "IndexError"
    (where,) = crash.locations
    assert (where.file, where.line) == ("faulty_scheduler.py", _line("READ BEFORE LANDED"))
    assert (where.role, where.agent) == ("launch", "engine")


def test_ordered_the_same_program_is_clean(scheduler: tuple[Any, Path]) -> None:
    result = _run(scheduler, "ordered")
    assert not [v for v in result.violations if v.invariant in ("no-crash", "no-race")]


def test_a_ranks_program_error_keeps_its_blame_across_the_process(
    scheduler: tuple[Any, Path],
) -> None:
    """A rank's worker sends its exception as frames; marked as the program's there, the frames
    of overlapcheck's it passed through are skipped here too (unmarked, they make it ours)."""
    ours = str(Path(dispatch.__file__).resolve())
    frames = traceback.StackSummary.from_list(
        [
            traceback.FrameSummary(str(scheduler[1]), _line("OUT OF RANGE"), "out_of_range"),
            traceback.FrameSummary(ours, 1, "__torch_dispatch__"),
        ]
    )
    crash = RemoteCrash("IndexError", "index 9 is out of bounds", frames, "")
    assert crash_violation(crash, 3, 0.0) is None
    mark_program_error(crash)
    found = crash_violation(crash, 3, 0.0)
    assert found is not None and found.invariant == "no-crash"
    assert (found.locations[0].file, found.locations[0].line) == (
        "faulty_scheduler.py",
        _line("OUT OF RANGE"),
    )


def test_a_host_tensor_among_device_tensors_is_the_programs_crash_as_on_a_gpu(
    scheduler: tuple[Any, Path],
) -> None:
    """CUDA's kernels refuse a host tensor of one or more dimensions beside device tensors (the
    host, where the simulation computes, would not): the program's crash at its line; moved to
    the device first, clean."""
    result = _run(scheduler, "mixed")
    (crash,) = [v for v in result.violations if v.invariant == "no-crash"]
    assert "Expected all tensors to be on the same device" in crash.message
    (where,) = crash.locations
    assert (where.file, where.line) == ("faulty_scheduler.py", _line("MIXED DEVICES"))
    result = _run(scheduler, "moved")
    assert not [v for v in result.violations if v.invariant == "no-crash"]


def test_a_cuda_api_the_simulation_lacks_is_ours_not_the_programs(
    scheduler: tuple[Any, Path],
) -> None:
    with pytest.raises(CheckerBug, match="no stand-in for a CUDA API"):
        _run(scheduler, "no-stand-in")


def test_an_op_whose_cuda_wrapper_checks_devices_refuses_even_a_0_dim_host_tensor(
    scheduler: tuple[Any, Path],
) -> None:
    """`index_select` has a CUDA kernel of its own and no `device_check: NoCheck` in torch's op
    table: its wrapper refuses a host index of any dimension, where the host would run it."""
    result = _run(scheduler, "host-index")
    (crash,) = [v for v in result.violations if v.invariant == "no-crash"]
    assert "got index is on cpu" in crash.message and "wrapper_CUDA_index_select" in crash.message
    (where,) = crash.locations
    assert (where.file, where.line) == ("faulty_scheduler.py", _line("HOST INDEX"))
    result = _run(scheduler, "device-index")
    assert not [v for v in result.violations if v.invariant == "no-crash"]


def test_a_composite_whose_part_refuses_a_host_tensor_is_the_programs_crash_at_its_call(
    scheduler: tuple[Any, Path],
) -> None:
    result = _run(scheduler, "host-lookup")
    (crash,) = [v for v in result.violations if v.invariant == "no-crash"]
    assert "got index is on cpu" in crash.message
    (where,) = crash.locations
    assert (where.file, where.line) == ("faulty_scheduler.py", _line("HOST LOOKUP"))

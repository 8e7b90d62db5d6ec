"""Which ops a GPU refuses with a host tensor among device tensors, as torch's own op table says:
an op with a CUDA kernel of its own checks its positional and `out` tensors' devices unless its
entry says `device_check: NoCheck` (TensorIterator's ops, the index ops that move their host
indices, copies). The simulated CUDA computes on the host, where nothing checks: it asks the
table, and where the table is missing it checks nothing (a GPU error missed, never a false one)."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import mixed_device_cases  # noqa: E402
from test_torchsim_allocator import _device  # noqa: E402

from overlapcheck.backends.torchsim import device_checks  # noqa: E402
from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402

aten = torch.ops.aten


@pytest.fixture
def simulated() -> Iterator[None]:
    with SimulatedCuda(_device(), ("main",)), torch.inference_mode():
        yield


def _pool() -> torch.Tensor:
    return torch.arange(6, dtype=torch.float32, device="cuda")


HOST_INDEX = torch.tensor([0, 2])
# What CUDA refuses: the op, the argument its wrapper names.
REFUSED: dict[str, tuple[Callable[[], Any], str]] = {
    "index_select": (lambda: _pool().index_select(0, HOST_INDEX), "index"),
    "index_select, 0-dim": (lambda: _pool().index_select(0, torch.tensor(1)), "index"),
    "gather": (lambda: _pool().gather(0, HOST_INDEX), "index"),
    "scatter_": (lambda: _pool().scatter_(0, HOST_INDEX, _pool()[:2]), "index"),
    "index_add_ of host values": (
        lambda: _pool().index_add_(0, HOST_INDEX.cuda(), torch.ones(2)),
        "source",
    ),
    "index_copy_": (lambda: _pool().index_copy_(0, HOST_INDEX, _pool()[:2]), "index"),
    "masked_select": (lambda: _pool().masked_select(torch.ones(6, dtype=torch.bool)), "mask"),
    "take": (lambda: torch.take(_pool(), HOST_INDEX), "index"),
    "mm": (lambda: torch.mm(_pool().reshape(2, 3), torch.ones(3, 1)), "mat2"),
    "searchsorted": (lambda: torch.searchsorted(_pool(), torch.tensor([2.5])), "self"),
}
# Refused by the CUDA kernels themselves, or by a structured kernel's `out=`: the message.
REFUSED_BY_KERNEL: dict[str, tuple[Callable[[], Any], str]] = {
    "masked_fill_ with a 0-dim host mask": (
        lambda: _pool().masked_fill_(torch.tensor(True), 0.0),
        "expected self and mask to be on the same device",
    ),
    "index_fill_ at a host index": (
        lambda: _pool().index_fill_(0, torch.tensor(1), 0.0),
        "found at least two devices",
    ),
    "setitem of host values": (
        lambda: _pool().__setitem__(HOST_INDEX, torch.ones(2)),
        "found at least two devices",
    ),
    "index_put_ accumulating host values": (
        lambda: _pool().index_put_((HOST_INDEX.cuda(),), torch.ones(2), accumulate=True),
        "for value tensor",
    ),
    "cumsum into a host out": (
        lambda: torch.cumsum(_pool(), 0, out=torch.zeros(6)),
        "Expected out tensor to have device cuda:0, but got cpu instead",
    ),
    "uniform_ with a host generator": (
        lambda: _pool().uniform_(generator=torch.Generator()),
        "Expected a 'cuda' device type for generator but found 'cpu'",
    ),
    "rand on the device with a host generator": (
        lambda: torch.rand(3, device="cuda", generator=torch.Generator()),
        "Expected a 'cuda' device type for generator",
    ),
}
# What CUDA runs: ops marked `NoCheck` (indexing moves host indices; TensorIterator takes a 0-dim
# host scalar), composites, and copies.
ALLOWED: dict[str, Callable[[], Any]] = {
    "indexing by host indices": lambda: _pool()[HOST_INDEX],
    "index_put_ at host indices": lambda: _pool().index_put_((HOST_INDEX,), torch.tensor(1.0)),
    "setitem at a host index": lambda: _pool().__setitem__(HOST_INDEX, 7.0),
    "index_fill_ at host indices": lambda: _pool().index_fill_(0, HOST_INDEX.cuda(), 1.0),
    "add_ of a 0-dim host scalar": lambda: _pool().add_(torch.tensor(2.0)),
    "masked_fill_ with a host value": lambda: _pool().masked_fill_(
        torch.ones(6, dtype=torch.bool, device="cuda"), torch.tensor(0.0)
    ),
    "copy_ from the host": lambda: _pool().copy_(torch.ones(6)),
    "setitem of a 0-dim host value": lambda: _pool().__setitem__(HOST_INDEX, torch.tensor(1.0)),
    "uniform_ without a generator": lambda: _pool().uniform_(),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_op_whose_wrapper_checks_devices_refuses_a_host_tensor(
    simulated: None, name: str
) -> None:
    call, argument = REFUSED[name]
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as err:
        call()
    assert f"but got {argument} is on cpu" in str(err.value)


@pytest.mark.parametrize("name", sorted(REFUSED_BY_KERNEL))
def test_a_kernel_or_out_or_generator_check_refuses_as_cuda(simulated: None, name: str) -> None:
    call, message = REFUSED_BY_KERNEL[name]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_an_op_cuda_runs_with_a_host_tensor_runs(simulated: None, name: str) -> None:
    ALLOWED[name]()


def test_the_checked_arguments_are_the_positional_and_out_tensors_in_the_wrappers_order() -> None:
    assert device_checks.checked_arguments(aten.index_select.default) == (
        (0, "self"),
        (2, "index"),
    )
    # `out` first, as the generated wrapper checks it first
    assert device_checks.checked_arguments(aten.argmax.out) == ((3, "out"), (0, "self"))
    assert device_checks.checked_arguments(aten.cat.default) == ((0, "tensors"),)
    for unchecked in (
        aten.index.Tensor,
        aten.index_put_.default,
        aten.add.Tensor,
        aten.copy_.default,
    ):
        assert device_checks.checked_arguments(unchecked) == ()


def test_without_torchs_op_table_nothing_is_refused(
    simulated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = device_checks._Tables(frozenset(), frozenset(), frozenset())
    monkeypatch.setattr(device_checks, "_tables", lambda: empty)
    cached = (device_checks.checked_arguments, device_checks._structured_outs)
    for function in cached:
        function.cache_clear()
    try:
        assert _pool().index_select(0, HOST_INDEX).tolist() == [0.0, 2.0]
    finally:
        for function in cached:
            function.cache_clear()


def _gpu_outcomes() -> dict[str, str]:
    recorded = json.loads((Path(__file__).parent / "data" / "mixed_devices_h200.json").read_text())
    outcomes: dict[str, str] = recorded["outcomes"]
    return outcomes


def test_the_simulation_refuses_what_a_gpu_refused_and_runs_what_it_ran() -> None:
    """The outcomes of `mixed_device_cases` on an H200, against the simulation's: no call the GPU
    ran is refused (a false alarm), every call the GPU refused is refused (composites too:
    `embedding` refuses a host index in the `index_select` it calls, `stack` in its `cat`)."""
    gpu = _gpu_outcomes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # index_reduce's beta notice
        with SimulatedCuda(_device(), ("main",)), torch.inference_mode():
            simulated = mixed_device_cases.run("cuda")
    assert set(simulated) == set(gpu)
    false_alarms = [name for name, seen in simulated.items() if seen != "ok" and gpu[name] == "ok"]
    assert false_alarms == []
    missed = [name for name, seen in simulated.items() if seen == "ok" and gpu[name] != "ok"]
    assert missed == []
    for name, seen in simulated.items():  # the same error, as the GPU words it
        if seen != "ok":
            assert seen.split(":")[0] == gpu[name].split(":")[0] == "RuntimeError", name
            assert seen.split(" (")[0] == gpu[name].split(" (")[0], name


@pytest.mark.cuda
def test_a_gpu_refuses_and_runs_what_it_did_when_recorded() -> None:
    """On a GPU: the recorded outcomes still hold (a torch upgrade that changes one shows here)."""
    outcomes = mixed_device_cases.run("cuda")
    gpu = _gpu_outcomes()
    assert {n: o == "ok" for n, o in outcomes.items()} == {n: o == "ok" for n, o in gpu.items()}

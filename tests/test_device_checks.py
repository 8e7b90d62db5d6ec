"""Which ops a GPU refuses with a host tensor among device tensors, as torch's own op table says:
an op with a CUDA kernel of its own checks its positional and `out` tensors' devices unless its
entry says `device_check: NoCheck` (TensorIterator's ops, the index ops that move their host
indices, copies). The simulated CUDA computes on the host, where nothing checks: it asks the
table, and where the table is missing it checks nothing (a GPU error missed, never a false one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

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
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_op_whose_wrapper_checks_devices_refuses_a_host_tensor(
    simulated: None, name: str
) -> None:
    call, argument = REFUSED[name]
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as err:
        call()
    assert f"for argument {argument} in method wrapper_CUDA_" in str(err.value)


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
    monkeypatch.setattr(device_checks, "_checked_ops", lambda: frozenset())
    device_checks.checked_arguments.cache_clear()
    try:
        assert _pool().index_select(0, HOST_INDEX).tolist() == [0.0, 2.0]
    finally:
        device_checks.checked_arguments.cache_clear()

"""Torch's Python bindings that guard the device before they dispatch (`contiguous`, `nonzero`)
work on simulated device tensors as on a GPU, instead of failing in the program's frame (which
would be a crash blamed on the program for a gap of the simulation's); `as_tensor` of a tensor
is that tensor, as in PyTorch. The scan over every argument-free tensor method and one-tensor
torch function keeps any other such binding from coming back unseen (a torch upgrade)."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from test_torchsim_allocator import _device  # noqa: E402

from overlapcheck.backends.torchsim.session import _NO_CUDA, SimulatedCuda  # noqa: E402

# Methods that make no sense here or change torch's state (autograd, storage, other devices).
_SKIP = {
    "backward", "register_hook", "retain_grad", "requires_grad_", "share_memory_", "storage",
    "untyped_storage", "resize_", "set_", "pin_memory", "numpy", "cpu", "record_stream",
    "data_ptr", "tolist", "new", "to_sparse", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr",
    "to_sparse_bsc", "to_mkldnn", "module_load", "ipu", "xpu", "mtia", "hpu", "mps", "is_shared",
    "storage_type", "dim_order", "_to_dense",
}  # fmt: skip


@pytest.fixture
def simulated() -> Iterator[None]:
    with SimulatedCuda(_device(), ("main",)), torch.inference_mode():
        yield


def _transposed() -> torch.Tensor:
    return torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="cuda").t()


@pytest.mark.usefixtures("simulated")
def test_no_binding_asks_for_the_cuda_runtime() -> None:
    failing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        failing += _failing()
    assert failing == []


def _failing() -> list[str]:
    failing = []
    for name in sorted(dir(torch.Tensor)):
        if name.startswith("_") or name in _SKIP or not callable(getattr(torch.Tensor, name)):
            continue
        try:
            getattr(_transposed(), name)()
        except Exception as err:  # most need arguments: only the device's failure counts
            if any(s in str(err) for s in _NO_CUDA):
                failing.append(f"Tensor.{name}")
    for name in sorted(dir(torch)):
        f = getattr(torch, name)
        if name.startswith("_") or not isinstance(f, types.BuiltinFunctionType):
            continue
        try:
            f(_transposed())
        except Exception as err:
            if any(s in str(err) for s in _NO_CUDA):
                failing.append(f"torch.{name}")
    return failing


@pytest.mark.usefixtures("simulated")
def test_contiguous_copies_a_strided_tensor_and_returns_a_contiguous_one_itself() -> None:
    strided = _transposed()
    made = strided.contiguous()
    assert made.is_contiguous() and made.device.type == "cuda"
    assert made.tolist() == [[0.0, 2.0], [1.0, 0.0]]
    assert made.contiguous() is made


@pytest.mark.usefixtures("simulated")
def test_nonzero_in_each_form_as_on_the_host() -> None:
    values = [[0, 3, 0], [4, 0, 5]]
    device, host = torch.tensor(values, device="cuda"), torch.tensor(values)
    assert torch.nonzero(device).tolist() == torch.nonzero(host).tolist()
    assert device.nonzero().device.type == "cuda"
    assert [t.tolist() for t in device.nonzero(as_tuple=True)] == [
        t.tolist() for t in host.nonzero(as_tuple=True)
    ]
    assert [t.tolist() for t in torch.nonzero(device[0, 1], as_tuple=True)] == [[0]]
    assert torch.nonzero(host).tolist() == [[0, 1], [1, 0], [1, 2]]  # the host's own, untouched


@pytest.mark.usefixtures("simulated")
def test_as_tensor_of_a_tensor_is_the_tensor_where_it_fits() -> None:
    device = torch.arange(4, device="cuda")
    assert torch.as_tensor(device) is device
    assert torch.as_tensor(device, device="cuda") is device
    converted = torch.as_tensor(device, dtype=torch.float32)
    assert converted is not device and converted.device.type == "cuda"
    host = torch.arange(3)
    moved = torch.as_tensor(host, device="cuda")
    assert moved.device.type == "cuda" and moved.tolist() == [0, 1, 2]
    assert torch.as_tensor([1, 2], device="cuda").tolist() == [1, 2]


@pytest.mark.usefixtures("simulated")
def test_cuda_apis_a_scheduler_calls_have_stand_ins() -> None:
    with torch.cuda.device(0):
        assert not torch.cuda.is_current_stream_capturing()
    torch.cuda.nvtx.range_push("schedule")
    torch.cuda.nvtx.range_pop()
    streams = torch.cuda.current_stream(), torch.cuda.Stream()
    assert streams[0].cuda_stream != streams[1].cuda_stream


def test_a_cuda_api_without_a_stand_in_is_a_gap_of_ours_not_the_programs_crash() -> None:
    from overlapcheck.backends.torchsim.tensor import SimulatedCudaError
    from overlapcheck.harness.crash import crash_violation

    cuda = SimulatedCuda(_device(), ("main",))
    with pytest.raises(SimulatedCudaError, match="a gap of overlapcheck's") as raised, cuda:
        torch.cuda.get_rng_state()  # the program's own line
    assert crash_violation(raised.value, 0, 0.0) is None  # ours: never a `no-crash` finding
    # anything else passes through as it was
    with pytest.raises(ValueError, match="the program's own"), cuda:
        raise ValueError("the program's own")


@pytest.mark.usefixtures("simulated")
def test_a_stream_is_a_context_manager_as_torch_stream_is() -> None:
    outer, inner = torch.cuda.current_stream(), torch.cuda.Stream()
    with inner as entered:
        assert entered is inner and torch.cuda.current_stream() is inner
        made = torch.zeros(2, device="cuda")
    assert torch.cuda.current_stream() is outer
    assert made.tolist() == [0.0, 0.0]

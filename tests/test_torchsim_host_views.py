"""What a host op on pinned memory reads: a view takes none of its values (slicing a buffer a copy
is still filling is no race), a factory from its metadata neither, while `tolist()` and `numpy()`,
whose reads happen below the dispatcher, read what they convert."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_torchsim_allocator import _device, _no_race  # noqa: E402

from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402
from overlapcheck.invariants.base import Violation  # noqa: E402


def _race_while_copying(
    touch: Callable[[Any], Any], inference: bool = True
) -> tuple[Violation | None, list[Any]]:
    """A non-blocking copy into a pinned buffer, `touch(buffer)` on the host before the event
    that ends the copy is waited for, then the values read after the wait: the race found (or
    None) and what the host saw. In inference mode, or under `no_grad` only."""
    device = _device()
    grad_mode = torch.inference_mode() if inference else torch.no_grad()
    with SimulatedCuda(device, ("main",)), grad_mode:
        torch.cuda.set_stream(torch.cuda.Stream())
        source = torch.arange(16, dtype=torch.int32, device="cuda")
        host = torch.empty(16, dtype=torch.int32, pin_memory=True)
        host.copy_(source, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        touched = touch(host)
        done.synchronize()
        seen = host[2:6].tolist()
        del touched
    return _no_race(device), seen


@pytest.mark.parametrize(
    "touch",
    [
        lambda t: t[2:6],
        lambda t: t[3],
        lambda t: t.view(4, 4).unsqueeze(0),
        lambda t: t.detach(),
        lambda t: torch.empty_like(t),
        lambda t: torch.zeros_like(t),
    ],
    ids=["slice", "select", "view-unsqueeze", "detach", "empty_like", "zeros_like"],
)
def test_a_view_or_a_factory_of_a_buffer_being_filled_reads_nothing(
    touch: Callable[[Any], Any],
) -> None:
    found, seen = _race_while_copying(touch)
    assert found is None, found.message if found else ""
    assert seen == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "touch",
    [
        lambda t: t[2:6].tolist(),
        lambda t: t.numpy().copy(),
        lambda t: t[1:3].clone(),
        lambda t: t.sum(),
    ],
    ids=["tolist", "numpy", "clone", "sum"],
)
@pytest.mark.parametrize("inference", [True, False], ids=["inference-mode", "no-grad"])
def test_a_read_of_a_buffer_being_filled_is_a_race(
    touch: Callable[[Any], Any], inference: bool
) -> None:
    """Outside inference mode too: there torch skips the `resolve_conj` it calls before
    `tolist()` and `numpy()` read below the dispatcher, the one sign of their read."""
    found, _ = _race_while_copying(touch, inference)
    assert found is not None
    assert found.details["kind"] == "RAW"
    assert found.details["second"]["agent"] == "host"


def test_pinning_a_pinned_tensor_gives_the_tensor_itself() -> None:
    """PyTorch's `pin_memory()` returns a tensor already pinned as it is: a write through either
    name is a write of the same memory (a copy would split them, and the program's reads)."""
    device = _device()
    with SimulatedCuda(device, ("main",)), torch.inference_mode():
        pinned = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        again = pinned.pin_memory()
        again[1] = 7
        assert again.data_ptr() == pinned.data_ptr()
        assert pinned.tolist() == [0, 7, 0, 0]
        pageable = torch.zeros(4, dtype=torch.int32)
        assert pageable.pin_memory().data_ptr() != pageable.data_ptr()
        assert pageable.pin_memory().is_pinned()

"""PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`, CSAN) as a source of violations.

CSAN watches every torch kernel launch and raises when two accesses to one tensor (keyed by data
pointer) on two streams are not ordered by events or synchronisation. We catch its error inside
the device call that triggered it and re-raise it as the scheduler's `InvariantError`, so the
runner reports it like any other violation (id `no-race`, message prefixed `CUDA sanitizer`).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from typing import Any

from overlapcheck.core.errors import InvariantError


class Sanitizer:
    def __init__(self) -> None:
        from torch.cuda import _gpu_trace as gpu_trace
        from torch.cuda import _sanitizer as csan

        self._csan = csan
        self._trace = gpu_trace
        self.findings: list[str] = []
        # NOTE: importing CSAN registers its event handler for every CUDA event, allocation and
        # synchronisation of the process, enabled or not, and `disable()` leaves it there. That
        # host work outlives a sanitized run and moves the timing of every later run in the
        # process (GPU replays after a sanitized test stopped reproducing: 0 of 20). The handler
        # stays attached only while CSAN is on.
        if not csan.cuda_sanitizer.enabled:
            self._detach()

    def enable(self) -> None:
        if not self._csan.cuda_sanitizer.enabled:
            self._attach()
            self._csan.enable_cuda_sanitizer()

    def disable(self) -> None:
        if self._csan.cuda_sanitizer.enabled:
            self._csan.cuda_sanitizer.disable()
        self._detach()

    def _hooks(self) -> list[tuple[Any, Any]]:
        """(registry, CSAN's callback) pairs, found by name: the callbacks are the handler's
        `_handle_<event>` methods, the registries `<Event>Callbacks` in `torch.cuda._gpu_trace`."""
        handler = self._csan.cuda_sanitizer.dispatch.event_handler
        pairs = []
        for name, registry in vars(self._trace).items():
            if not name.endswith("Callbacks") or not hasattr(registry, "callback_list"):
                continue
            event = re.sub(r"(?<!^)([A-Z])", r"_\1", name.removesuffix("Callbacks")).lower()
            callback = getattr(handler, f"_handle_{event}", None)
            if callback is not None:
                pairs.append((registry, callback))
        return pairs

    def _detach(self) -> None:
        for registry, callback in self._hooks():
            while callback in registry.callback_list:
                registry.callback_list.remove(callback)

    def _attach(self) -> None:
        for registry, callback in self._hooks():
            if callback not in registry.callback_list:
                registry.callback_list.append(callback)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Turn a CSAN error raised inside the block into an InvariantError."""
        report = io.StringIO()  # CSAN prints full stack traces; keep them off the user's terminal
        try:
            with contextlib.redirect_stderr(report):
                yield
        except self._csan.CUDASanitizerErrors as err:
            lines = [describe(e) for e in err.errors]
            self.findings += lines
            raise InvariantError("no-race", "CUDA sanitizer: " + "; ".join(lines)) from None


def describe(error: object) -> str:
    """One line for one CSAN finding: the two accesses and their streams."""
    cur = getattr(error, "current_access", None)
    prev = getattr(error, "previous_access", None)
    if cur is None or prev is None:
        return str(error).strip().splitlines()[0]

    def access(a: object) -> str:
        op = str(getattr(a, "operator", "?")).split("(")[0]
        kind = str(getattr(a, "type", "?")).lower()
        return f"{kind} by {op} on stream {getattr(a, 'stream', '?')}"

    return (
        f"unsynchronized access to tensor {getattr(error, 'data_ptr', '?')}: "
        f"{access(cur)} after {access(prev)}"
    )

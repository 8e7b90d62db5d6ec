"""PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`, CSAN) as a source of violations.

CSAN watches every torch kernel launch and raises when two accesses to one tensor (keyed by data
pointer) on two streams are not ordered by events or synchronisation. We catch its error inside
the device call that triggered it and re-raise it as the scheduler's `InvariantError`, so the
runner reports it like any other violation (id `no-race`, message prefixed `CUDA sanitizer`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

from overlapcheck.core.errors import InvariantError


class Sanitizer:
    def __init__(self) -> None:
        from torch.cuda import _sanitizer as csan

        self._csan = csan
        self.findings: list[str] = []

    def enable(self) -> None:
        if not self._csan.cuda_sanitizer.enabled:
            self._csan.enable_cuda_sanitizer()

    def disable(self) -> None:
        if self._csan.cuda_sanitizer.enabled:
            self._csan.cuda_sanitizer.disable()

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

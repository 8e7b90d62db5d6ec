"""Gates on a CUDA device (`backends/gates.py`): the held stream runs a one-warp Triton kernel
that spins on a flag in device memory, bounded by the GPU's global timer; a one-element fill sets
the flag, queued on the opener's stream right after it, or from the host on a stream of its own.
The spin writes what it saw and how long it waited, which the host reads after the run: in device
memory, or, given a record file (`backends/gate_record.py`), in that file's pages, mapped into the
device, where a run the device stopped still leaves it readable."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

from overlapcheck.backends import gate_record
from overlapcheck.backends.gates import OPENED, RELEASED


@triton.jit
def _spin_kernel(flag, status, waited, bound_ns):  # type: ignore[no-untyped-def]
    start = globaltimer()
    seen = tl.load(flag, volatile=True)
    elapsed = globaltimer() - start
    while (seen == 0) & (elapsed < bound_ns):
        seen = tl.load(flag, volatile=True)
        elapsed = globaltimer() - start
    tl.store(status, tl.where(seen == 0, 3, seen))  # 3: TIMED_OUT
    tl.store(waited, elapsed)


class SpinGates:
    kind = "Triton spin on a device flag"

    def __init__(
        self,
        count: int,
        streams: Mapping[str, torch.cuda.Stream],
        bound: float,
        record: tuple[Path, int] | None = None,
    ) -> None:
        """`record`: (file, repeat) to keep the gates' record in that file's mapped pages."""
        self.count, self.streams, self.bound = count, streams, bound
        self.bound_ns = max(1, int(bound * 1e9))
        device = torch.device("cuda")
        # One more slot than gates: a warm-up gate, opened before it waits.
        self.flags = torch.zeros(count + 1, dtype=torch.int32, device=device)
        self.side = torch.cuda.Stream()
        self.mapped = None if record is None else _mapped_record(*record, count)
        if self.mapped is not None:
            self.status = self.mapped[gate_record.states(count)]
            self.waited = self.mapped[gate_record.waits(count)]
            # pages a later repeat's record may map again: registered once at a time
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.mapped.data_ptr())
            try:
                self._warm_up()
                return
            except ValueError:  # Triton would not take the host pages' address: device memory
                self.mapped = None
                assert record is not None  # (mapped only from a record)
                gate_record.withdraw(record[0], count)
        self.status = torch.zeros(count + 1, dtype=torch.int32, device=device)
        self.waited = torch.zeros(count + 1, dtype=torch.int64, device=device)
        self._warm_up()

    def _warm_up(self) -> None:
        # Both kernels run once now: a module loaded lazily while a spin runs may have to wait
        # for it, and the spin would then wait out its bound.
        self._fill(self.count, OPENED, torch.cuda.current_stream())
        self._spin(self.count, torch.cuda.current_stream())
        torch.cuda.synchronize()

    def _spin(self, gate: int, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            flag, status, waited = self.flags[gate:], self.status[gate:], self.waited[gate:]
            _spin_kernel[(1,)](flag, status, waited, self.bound_ns, num_warps=1)

    def _fill(self, gate: int, value: int, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            self.flags[gate : gate + 1].fill_(value)

    def hold(self, gate: int, stream: str) -> None:
        self._spin(gate, self.streams[stream])

    def open(self, gate: int, stream: str | None) -> None:
        self._fill(gate, OPENED, self.side if stream is None else self.streams[stream])

    def release(self, gate: int) -> None:
        self._fill(gate, RELEASED, self.side)

    def results(self) -> list[tuple[int, float]]:
        torch.cuda.synchronize()
        seen = self.status[: self.count].tolist()
        waited = self.waited[: self.count].tolist()
        return [(int(s), int(w) / 1e9) for s, w in zip(seen, waited, strict=True)]


def _mapped_record(path: Path, repeat: int, count: int) -> torch.Tensor | None:
    """The record file's pages as a host tensor the device writes through (registered with CUDA:
    pinned, and mapped at the same address under unified addressing), or None where CUDA will not
    map them (the record then stays in device memory, unreadable after a device error)."""
    if not gate_record.on_shared_memory(path.parent):
        # (a failed registration would leave its error for torch's next check)
        gate_record.withdraw(path, count)
        return None
    gate_record.start(path, count, repeat)
    nbytes = gate_record.size(count)
    mapped = torch.from_file(str(path), shared=True, size=nbytes // 8, dtype=torch.int64)
    # flags 1 (cudaHostRegisterPortable), as torch pins shared memory: mapped too under
    # unified addressing, at the same address
    if torch.cuda.cudart().cudaHostRegister(mapped.data_ptr(), nbytes, 1) != 0:
        gate_record.withdraw(path, count)
        return None
    if not mapped.is_pinned():
        gate_record.withdraw(path, count)
        return None
    return mapped

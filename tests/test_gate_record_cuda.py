"""The gates' record in mapped host pages on a real GPU (`backends/gpu/spin_gates.py`): what a
spin wrote is read back after the device stopped the process that ran it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from overlapcheck.backends import gate_record  # noqa: E402
from overlapcheck.backends.gates import OPENED, TIMED_OUT  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture
def shm() -> Iterator[Path]:
    """A folder in shared memory, where CUDA can map a record file's pages."""
    where = gate_record.shared_dir()
    if where is None:
        pytest.skip("no writable tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        yield Path(tmp)


# A held spin opened from the host, then an index out of bounds: the device's assert stops the
# process before it could read anything back.
_STOPPED = """
import sys, torch
from pathlib import Path
from overlapcheck.backends.gpu.spin_gates import SpinGates
held = torch.cuda.Stream()
gates = SpinGates(1, {"engine": held}, 2.0, record=(Path(sys.argv[1]), 5))
assert gates.mapped is not None, "the record stayed in device memory"
gates.hold(0, "engine")
gates.open(0, None)
with torch.cuda.stream(held):
    table = torch.zeros(4, device="cuda")
    table[torch.tensor([9], device="cuda")] = 1.0
torch.cuda.synchronize()
print("not stopped")
"""


def test_a_stopped_process_leaves_its_gates_record_readable(shm: Path) -> None:
    path = shm / "gates"
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "not stopped" not in done.stdout, done.stdout + done.stderr
    record = gate_record.read(path, 1, 5)
    assert record is not None, done.stderr
    assert record[0][0] == OPENED and 0 <= record[0][1] < 2.0, record


def test_a_run_reads_its_record_from_the_mapped_pages(shm: Path, tmp_path: Path) -> None:
    from overlapcheck.backends.gpu.spin_gates import SpinGates

    held = torch.cuda.Stream()
    gates = SpinGates(2, {"engine": held}, 0.05, record=(shm / "gates", 0))
    assert gates.mapped is not None
    gates.hold(0, "engine")
    gates.open(0, None)
    gates.hold(1, "engine")  # never opened: waits out its bound
    got = gates.results()
    assert [state for state, _ in got] == [OPENED, TIMED_OUT]
    assert gate_record.read(shm / "gates", 2, 0) == got
    # a record file off shared memory is never offered to CUDA: device memory, no error left
    elsewhere = SpinGates(1, {"engine": held}, 0.05, record=(tmp_path / "gates", 1))
    if not gate_record.on_shared_memory(tmp_path):
        assert elsewhere.mapped is None
    elsewhere.hold(0, "engine")
    elsewhere.open(0, None)
    assert [state for state, _ in elsewhere.results()] == [OPENED]

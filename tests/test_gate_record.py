"""The gates' record file (`backends/gate_record.py`): what a repeat's spins left, read with no
CUDA call, and only as the repeat it belongs to."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from overlapcheck.backends import gate_record
from overlapcheck.backends.gates import CLOSED, OPENED, TIMED_OUT


def _write(path: Path, states: list[int], waited_ns: list[int]) -> None:
    """As the spins would: each gate's state and wait in its slot."""
    values = np.frombuffer(path.read_bytes(), dtype=np.int64).copy()
    n = len(states)
    values[gate_record.states(n)][:n] = states
    values[gate_record.waits(n)][:n] = waited_ns
    path.write_bytes(values.tobytes())


def test_a_fresh_record_has_every_gate_not_reached(tmp_path: Path) -> None:
    path = tmp_path / "gates"
    gate_record.start(path, 3, 7)
    got = gate_record.read(path, 3, 7)
    assert got == [(CLOSED, 0.0)] * 3
    assert not gate_record.reached(got)


def test_what_the_spins_wrote_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "gates"
    gate_record.start(path, 2, 0)
    _write(path, [OPENED, TIMED_OUT], [2_000_000, 200_000_000])
    got = gate_record.read(path, 2, 0)
    assert got == [(OPENED, 0.002), (TIMED_OUT, 0.2)]
    assert gate_record.reached(got)


def test_another_repeats_or_a_broken_record_is_none(tmp_path: Path) -> None:
    path = tmp_path / "gates"
    assert gate_record.read(path, 1, 0) is None  # never written
    gate_record.start(path, 1, 4)
    assert gate_record.read(path, 1, 5) is None  # repeat 4's, not 5's
    assert gate_record.read(path, 2, 4) is None  # laid out for another count of gates
    path.write_bytes(path.read_bytes()[:-8])
    assert gate_record.read(path, 1, 4) is None  # cut short


def test_a_withdrawn_record_reads_as_none(tmp_path: Path) -> None:
    """Where CUDA would not map the file, its gates are not known: not 'not reached', and not
    an earlier repeat's."""
    path = tmp_path / "gates"
    gate_record.start(path, 1, 2)
    gate_record.withdraw(path, 1)
    assert gate_record.read(path, 1, 3) is None and gate_record.read(path, 1, 2) is None


def test_only_tmpfs_counts_as_shared_memory(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "overlay / overlay rw 0 0\n"
        "tmpfs /dev/shm tmpfs rw,nosuid 0 0\n"
        "/dev/sda1 /dev/shm/disk ext4 rw 0 0\n"
    )
    assert gate_record.on_shared_memory("/dev/shm", mounts)
    assert gate_record.on_shared_memory("/dev/shm/overlapcheck-x/plan.json", mounts)
    assert not gate_record.on_shared_memory("/dev/shm/disk/plan.json", mounts)  # longest wins
    assert not gate_record.on_shared_memory("/tmp/plan.json", mounts)
    assert not gate_record.on_shared_memory("/dev/shmx", mounts)
    assert not gate_record.on_shared_memory("/tmp", tmp_path / "no-such-file")

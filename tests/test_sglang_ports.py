"""The port SGLang's process group binds is drawn from the OS's entropy, not from the global
`random` every build seeds with the run's seed: two processes building at once (test or search
workers) drew the same ports before, and one failed with EADDRINUSE."""

from __future__ import annotations

import random
import socket

import pytest

pytest.importorskip("torch")

from overlapcheck.adapters.sglang.build import free_port


def test_the_port_is_free_and_not_fixed_by_the_global_seed() -> None:
    drawn = []
    for _ in range(5):
        random.seed(0)  # what each SGLang build does with the run's seed
        port = free_port()
        assert port is not None and 22_000 <= port < 32_768
        drawn.append(port)
    assert len(set(drawn)) > 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0", drawn[-1]))  # free: it binds


def test_no_free_port_in_the_range_lets_sglang_pick() -> None:
    assert free_port(low=30_000, high=29_999) is None

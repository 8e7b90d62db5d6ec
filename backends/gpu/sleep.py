"""Calibrating `torch.cuda._sleep`: the delay injection counts cycles, plans count seconds."""

from __future__ import annotations

import torch


def sleep_cycles_per_second() -> float:
    """How many `torch.cuda._sleep` cycles make a second on this GPU (measured once)."""
    torch.cuda._sleep(1_000)  # warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (float(start.elapsed_time(end)) / 1e3)

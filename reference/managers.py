"""What preemption works on: the scheduler's config and device, and the managers whose state a
preemption moves (a victim's pages, its slot, its place among the running requests)."""

from __future__ import annotations

from typing import NamedTuple

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.reference.cache.manager import CacheManager
from overlapcheck.reference.decode import DecodeManager
from overlapcheck.reference.table import TableManager


class Managers(NamedTuple):
    config: SchedulerConfig
    device: Device
    cache: CacheManager
    table: TableManager
    decode: DecodeManager

"""Schedulers for the rank tests (`tests/test_ranks.py`): the reference with its decode batch
built by iterating a `set` of request objects (ordered by their addresses, so each rank orders
it its own way), and the same with `sorted(...)` by uid (every rank alike)."""

from __future__ import annotations

from typing import cast

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import MessageSink, MessageSource
from overlapcheck.reference.decode import DecodeManager
from overlapcheck.reference.req import Req
from overlapcheck.reference.scheduler import Scheduler


class SetDecode(DecodeManager):
    """Running requests kept in a set; the decode batch iterates it."""

    members: set[Req]
    ordered: bool

    @property  # type: ignore[override]
    def running(self) -> list[Req]:
        if self.ordered:
            return sorted(self.members, key=lambda r: r.uid)
        return list(self.members)  # the bug: the order of addresses

    def add(self, req: Req) -> None:
        self.members.add(req)

    def remove(self, req: Req) -> None:
        self.members.discard(req)


def _make(ordered: bool) -> type[Scheduler]:
    class SetScheduler(Scheduler):
        def __init__(
            self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
        ) -> None:
            super().__init__(config, device, source, sink)
            # The managers share the one decode manager: turn it into a set-keeping one.
            self.decode.__class__ = SetDecode
            decode = cast(SetDecode, self.decode)
            decode.members, decode.ordered = set(), ordered

    return SetScheduler


set_order = _make(ordered=False)
sorted_order = _make(ordered=True)

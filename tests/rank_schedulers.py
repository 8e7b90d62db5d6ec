"""Schedulers for the rank tests (`tests/test_ranks.py`): the reference with its decode batch
built by iterating a `set` of request objects (ordered by their addresses, so each rank orders
it its own way), one iterating a `set` of request-id strings (ordered by the process's string-hash
seed: each rank's process its own way), and each with `sorted(...)` (every rank alike)."""

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


class StringSetDecode(DecodeManager):
    """Running requests named by request-id strings (as vLLM and SGLang name them) in a set;
    the decode batch iterates it. Strings hash by the process's `PYTHONHASHSEED`: alike for
    every rank of one process, each its own way in real ranks' processes."""

    ids: set[str]
    by_id: dict[str, Req]
    ordered: bool

    @property  # type: ignore[override]
    def running(self) -> list[Req]:
        names = sorted(self.ids) if self.ordered else self.ids  # the bug: the set's order
        return [self.by_id[name] for name in names]

    def add(self, req: Req) -> None:
        name = f"req-{req.uid}"
        self.ids.add(name)
        self.by_id[name] = req

    def remove(self, req: Req) -> None:
        self.ids.discard(f"req-{req.uid}")


def _make_strings(ordered: bool) -> type[Scheduler]:
    class StringSetScheduler(Scheduler):
        def __init__(
            self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
        ) -> None:
            super().__init__(config, device, source, sink)
            self.decode.__class__ = StringSetDecode
            decode = cast(StringSetDecode, self.decode)
            decode.ids, decode.by_id, decode.ordered = set(), {}, ordered

    return StringSetScheduler


string_set_order = _make_strings(ordered=False)
string_sorted_order = _make_strings(ordered=True)

"""A scheduler whose runs differ from one to the next: it misbehaves (a token after the finished
one) in exactly one run. The file named by OVERLAPCHECK_TEST_ONCE holds how many builds to let
pass first (the search's probe is one), and the misbehaving run removes it. What an order by
object addresses, a clock or a global random source does to a search. Named by path by
tests/test_nondeterministic_search.py."""

from __future__ import annotations

import os
from pathlib import Path

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.messages import OutMsg, TokenMsg
from overlapcheck.core.protocol import MessageSink, MessageSource
from overlapcheck.reference.scheduler import Scheduler


def make(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> Scheduler:
    once = Path(os.environ.get("OVERLAPCHECK_TEST_ONCE", "/nonexistent"))
    if not once.is_file():
        return Scheduler(config, device, source, sink)
    wait = int(once.read_text() or 0)
    if wait > 0:
        once.write_text(str(wait - 1))
        return Scheduler(config, device, source, sink)
    leaked = []

    def leaky(msg: OutMsg) -> None:
        sink(msg)
        if isinstance(msg, TokenMsg) and msg.finished and not leaked:
            leaked.append(msg)
            once.unlink()
            sink(TokenMsg(msg.uid, msg.token, False))

    return Scheduler(config, device, source, leaky)

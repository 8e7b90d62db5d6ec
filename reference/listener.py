"""Hooks through which invariants watch the scheduler (read-only by contract)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlapcheck.core.messages import InMsg, OutMsg

if TYPE_CHECKING:
    from overlapcheck.reference.req import Req
    from overlapcheck.reference.scheduler import Launched, Scheduler


class SchedulerListener:
    """No-op base; override what you need. Listeners must not change the scheduler."""

    def on_receive(self, sched: Scheduler, msg: InMsg) -> None:
        return None

    def on_admit(self, sched: Scheduler, req: Req) -> None:
        return None

    def on_launch(self, sched: Scheduler, launched: Launched) -> None:
        return None

    def on_processed(self, sched: Scheduler, launched: Launched) -> None:
        return None

    def on_release(self, sched: Scheduler, req: Req) -> None:
        return None

    def on_message(self, sched: Scheduler, msg: OutMsg) -> None:
        return None

    def on_step_end(self, sched: Scheduler) -> None:
        return None

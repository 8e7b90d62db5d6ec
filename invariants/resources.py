"""Invariants over slots, pages and progress."""

from __future__ import annotations

from overlapcheck.core.errors import InvariantError
from overlapcheck.invariants.base import Invariant
from overlapcheck.reference.req import Req, ReqState
from overlapcheck.reference.scheduler import Scheduler


class SlotNotInFlight(Invariant):
    """A slot is never handed out while an in-flight batch holds a request using it."""

    id = "slot-not-in-flight"

    def on_admit(self, sched: Scheduler, req: Req) -> None:
        inflight = sched.inflight
        if inflight is not None:
            for other in inflight.reqs:
                if other is not req and other.slot == req.slot:
                    self.fail(
                        f"slot {req.slot} handed to request {req.uid} while in-flight batch "
                        f"{inflight.batch.label} still uses it for request {other.uid}",
                        (req.uid, other.uid),
                        batch=inflight.batch.batch_id,
                    )
        for other in sched.reqs.values():
            if other is not req and other.state is not ReqState.PENDING and other.slot == req.slot:
                self.fail(
                    f"slot {req.slot} handed to request {req.uid} "
                    f"while request {other.uid} holds it",
                    (req.uid, other.uid),
                )


class PagesConserved(Invariant):
    """free + cached + held by live requests = all pages; no page twice (checked every step)."""

    id = "pages-conserved"

    def on_step_end(self, sched: Scheduler) -> None:
        try:
            sched.check_integrity()
        except InvariantError as err:  # the scheduler's own books name the broken invariant
            self.fail_as(err.invariant, err.detail)

    def finish(self) -> None:
        self.on_step_end(self.run.scheduler)


class Liveness(Invariant):
    """Every admitted request finishes; once idle the scheduler holds nothing. (The step bound and
    deadlocks are enforced by the runner, which reports them under this id.)"""

    id = "liveness"

    def finish(self) -> None:
        sched = self.run.scheduler
        stuck = sorted(uid for uid, req in sched.reqs.items() if not req.done)
        if stuck:
            self.fail(f"requests {stuck} never finished", tuple(stuck))
        held = sorted(sched.reqs)
        if held:
            self.fail(f"idle scheduler still holds requests {held}", tuple(held))
        if sched.table.num_free != sched.config.num_slots:
            self.fail(
                f"idle scheduler holds slots "
                f"{sorted(set(range(sched.config.num_slots)) - set(sched.table.free_slots()))}"
            )
        cache = sched.cache
        if cache.allocator.num_free + cache.prefix.num_cached_pages != sched.config.num_pages:
            self.fail("idle scheduler holds pages outside the free list and the cache")

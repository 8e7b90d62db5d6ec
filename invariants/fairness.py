"""Opt-in fairness: how far a queue policy lets later arrivals get ahead of a waiting request.

Not in the default set: reordering the queue is allowed (it is what cache-aware policies are for),
so this is a property to measure and bound per policy, not a safety invariant.
"""

from __future__ import annotations

from overlapcheck.core.messages import InMsg, UserMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.reference.req import Req
from overlapcheck.reference.scheduler import Scheduler


class BoundedWait(Invariant):
    """No request is overtaken by more than `k` later arrivals.

    B overtakes A when B arrived after A (in the order the scheduler received them) and is admitted
    in a pass after which A still waits. Requests admitted in the same pass as A did not make it
    wait and do not count. Under `fcfs` nobody is ever overtaken: admission stops at the head.
    """

    id = "bounded-wait"

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"bounded-wait needs K >= 0, got {k}")
        self.k = k
        self._arrival: dict[int, int] = {}  # uid -> receive order of its live request
        self._received = 0
        self.overtakers: dict[int, list[int]] = {}  # uid -> later arrivals admitted before it
        self.passes_later: dict[int, list[int]] = {}  # uid -> how many passes later each arrived

    @property
    def max_overtaken(self) -> int:
        return max((len(v) for v in self.overtakers.values()), default=0)

    def on_receive(self, sched: Scheduler, msg: InMsg) -> None:
        # A uid that is still live is rejected as a duplicate; it keeps its first arrival.
        if isinstance(msg, UserMsg) and msg.uid not in sched.reqs:
            self._arrival[msg.uid] = self._received
            self._received += 1
            self.overtakers[msg.uid] = []
            self.passes_later[msg.uid] = []

    def on_admit(self, sched: Scheduler, req: Req) -> None:
        mine = self._arrival[req.uid]
        for waiting in sched.prefill.pending:  # this pass's admissions have left it already
            if self._arrival[waiting.uid] > mine:
                continue
            by = self.overtakers[waiting.uid]
            by.append(req.uid)
            self.passes_later[waiting.uid].append(req.arrival_step - waiting.arrival_step)
            if len(by) > self.k:
                self.fail(
                    f"overtaken by {len(by)} later arrivals (uids {by}), bound {self.k}, "
                    f"policy {sched.config.policy}",
                    (waiting.uid, *by),
                    bound=self.k,
                    overtakers=list(by),
                )

"""Opt-in fairness: how far a queue policy lets later arrivals get ahead of a waiting request.

Not in the default set: reordering the queue is allowed (it is what cache-aware policies are for),
so this is a property to measure and bound per policy, not a safety invariant.
"""

from __future__ import annotations

from overlapcheck.core.messages import InMsg, UserMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request


class BoundedWait(Invariant):
    """No request is overtaken by more than `k` later arrivals.

    B overtakes A when B arrived after A (in the order the scheduler received them) and is admitted
    in a pass after which A still waits. Requests admitted in the same pass as A did not make it
    wait and do not count. Under `fcfs` nobody is ever overtaken: admission stops at the head.
    Judged from the trace: a request is admitted in the iteration that launches its first forward.
    """

    id = "bounded-wait"

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"bounded-wait needs K >= 0, got {k}")
        self.k = k
        self._waiting: list[Request] = []  # accepted, no forward yet, in arrival order
        self._seen_ops = 0
        self.overtakers: dict[int, list[int]] = {}  # uid -> later arrivals admitted before it
        self.passes_later: dict[int, list[int]] = {}  # uid -> how many passes later each arrived

    @property
    def max_overtaken(self) -> int:
        return max((len(v) for v in self.overtakers.values()), default=0)

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        if isinstance(msg, UserMsg) and req is not None and req.rejection is None:
            self._waiting.append(req)
            self.overtakers[req.uid] = []
            self.passes_later[req.uid] = []

    def on_step_end(self) -> None:
        ops = self.run.trace.ops
        launched: set[int] = set()
        for op in ops[self._seen_ops :]:
            if op.kind == "forward":
                launched.update(op.uids)
        self._seen_ops = len(ops)
        admitted = [r for r in self._waiting if r.uid in launched]
        still = [r for r in self._waiting if r.uid not in launched and r.live]
        self._waiting = still
        for waiting in still:
            later = [r for r in admitted if r.index > waiting.index]
            if not later:
                continue
            by = self.overtakers[waiting.uid]
            by.extend(r.uid for r in later)
            self.passes_later[waiting.uid].extend(
                r.received_step - waiting.received_step for r in later
            )
            if len(by) > self.k:
                self.fail(
                    f"overtaken by {len(by)} later arrivals (uids {by}), bound {self.k}, "
                    f"policy {self.run.config.policy}",
                    (waiting.uid, *by),
                    bound=self.k,
                    overtakers=list(by),
                )

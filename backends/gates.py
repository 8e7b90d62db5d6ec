"""Gates: a device replay forces a race's order instead of hoping that the timing produces it.

A race is two operations that the scheduler left unordered. In the counterexample's run the one
issued later (the *opener*) ran before the one issued earlier (the *held* op) was done. A gate
holds the held op on its stream until the opener has run: the stream waits on a flag that the
opener's side sets right after the opener (its stream, or the host). Gates belong to the replay,
not to the scheduler: they are not in the trace, so `no-race` and happens-before over the real
run's footprints are what they would be without them.

Where the scheduler under test orders the two the other way (the fix), the gate can never open:
the opener runs after the held op, or the host waits for the held op before it issues the opener.
The keeper sees that coming instead of hanging: it follows which agents and events are ordered
after the held op (stream order, event record -> wait) and releases the gate when the opener is
issued on one of them or when the host is about to block on one of them: "fix holds: the racy
order cannot happen". A gate that neither opens nor is released waits out its bound and says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from overlapcheck.backends.delays import Key, OpKeys
from overlapcheck.core.trace import HOST, Op, Trace

# A gate's flag, and what a held op saw when it went on.
CLOSED, OPENED, RELEASED, TIMED_OUT = 0, 1, 2, 3
DEFAULT_BOUND = 1.0  # seconds a held op waits at most: steps of the engines here take milliseconds


@dataclass(frozen=True, slots=True)
class Gate:
    held: Key  # (iteration, agent, kind, ordinal): the op that must come second
    held_label: str
    opener: Key  # the op that must come first, issued after `held`
    opener_label: str
    race: str  # "WAW on token_pool"

    def line(self) -> str:
        return (
            f"{_where(self.held)} `{self.held_label}` waits for {_where(self.opener)} "
            f"`{self.opener_label}` ({self.race})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "held": list(self.held),
            "held_label": self.held_label,
            "opener": list(self.opener),
            "opener_label": self.opener_label,
            "race": self.race,
        }


def _where(key: Key) -> str:
    step, agent, _, _ = key
    return f"step {step} {'host' if agent == HOST else agent + ' stream'}"


class GateDriver(Protocol):
    """The mechanism under the keeper: how a stream waits and how a flag is set."""

    kind: str  # what a report names
    bound: float  # seconds a held op waits at most

    def hold(self, gate: int, stream: str) -> None:
        """Make `stream`'s next work wait until the gate's flag is set, or the bound passes."""
        ...

    def open(self, gate: int, stream: str | None) -> None:
        """Set the flag right after the work issued so far on `stream` (None: the host, now)."""
        ...

    def release(self, gate: int) -> None:
        """Let the held op go without its opener (from the host, now)."""
        ...

    def results(self) -> list[tuple[int, float]]:
        """Per gate, once the device has finished: what its held op saw (CLOSED if it never
        waited) and how long it waited, in seconds."""
        ...


@dataclass(frozen=True, slots=True)
class GateOutcome:
    gate: Gate
    state: str  # forced | cannot happen | timed out | not reached
    waited: float  # seconds the held op waited
    detail: str
    kind: str

    @property
    def forced(self) -> bool:
        return self.state == "forced"

    def line(self) -> str:
        if self.state == "forced":
            return (
                f"forced: `{self.gate.opener_label}` ran before `{self.gate.held_label}` "
                f"(held {self.waited * 1e3:.2f} ms; {self.kind})"
            )
        if self.state in ("cannot happen", "timed out"):
            return f"fix holds: the racy order cannot happen ({self.detail})"
        return f"not reached: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "waited_ms": round(self.waited * 1e3, 3),
            "detail": self.detail,
            "kind": self.kind,
        }


@dataclass
class _Watch:
    """What one gate's keeper knows: set once the held op is issued."""

    held_seq: int | None = None
    signalled: bool = False  # opened or released: the flag is (being) set
    after: set[str] = field(default_factory=set)  # agents ordered after the held op
    events: set[int] = field(default_factory=set)  # events recorded after it
    reason: str = ""  # why it was released


class GateKeeper:
    """Installs a replay's gates in a run as the device issues its operations.

    The device calls `before`/`after` around each stream op's work and after each host op with a
    footprint, `recorded`/`waited` for events, and `host_blocks` before the host blocks.
    """

    def __init__(self, gates: Sequence[Gate], driver: GateDriver, trace: Trace) -> None:
        self.gates = list(gates)
        self.driver = driver
        self.keys = OpKeys(trace)
        self.watches = [_Watch() for _ in self.gates]
        self._held = {g.held: i for i, g in enumerate(self.gates)}
        self._opener = {g.opener: i for i, g in enumerate(self.gates)}

    def _pending(self) -> list[tuple[int, _Watch]]:
        return [
            (i, w) for i, w in enumerate(self.watches) if w.held_seq is not None and not w.signalled
        ]

    def before(self, op: Op) -> None:
        """`op`'s work is about to be issued on its stream."""
        i = self._held.get(self.keys.of(op.seq))
        if i is None:
            return
        watch = self.watches[i]
        watch.held_seq, watch.after = op.seq, {op.agent}
        self.driver.hold(i, op.agent)

    def after(self, op: Op) -> None:
        """`op`'s work is issued (a stream op) or done (a host op)."""
        i = self._opener.get(self.keys.of(op.seq))
        if i is None or self.watches[i].signalled:
            return
        watch = self.watches[i]
        if watch.held_seq is not None and op.agent in watch.after:
            held = self.gates[i].held_label
            self._release(i, f"`{op.label}` is ordered after `{held}` on the {op.agent} stream")
            return
        watch.signalled = True
        self.driver.open(i, None if op.agent == HOST else op.agent)

    def recorded(self, stream: str, event: int) -> None:
        for _, watch in self._pending():
            if stream in watch.after:
                watch.events.add(event)

    def waited(self, stream: str, event: int) -> None:
        for _, watch in self._pending():
            if event in watch.events:
                watch.after.add(stream)

    def host_blocks(self, event: int | None) -> None:
        """The host is about to wait for `event` (None: for everything)."""
        for i, watch in self._pending():
            gate = self.gates[i]
            if event is None:
                self._release(i, f"the run ended before `{gate.opener_label}`")
            elif event in watch.events:
                self._release(
                    i,
                    f"the host waits on e{event}, which follows `{gate.held_label}`, "
                    f"before `{gate.opener_label}`",
                )

    def _release(self, i: int, reason: str) -> None:
        watch = self.watches[i]
        watch.signalled, watch.reason = True, reason
        self.driver.release(i)

    def outcomes(self) -> list[GateOutcome]:
        """What each gate did in the run; call once the device has finished."""
        results = self.driver.results()
        bound = self.driver.bound
        out = []
        for gate, watch, (seen, waited) in zip(self.gates, self.watches, results, strict=True):
            kind = self.driver.kind
            if watch.held_seq is None:
                out.append(
                    GateOutcome(gate, "not reached", 0.0, f"`{gate.held_label}` not issued", kind)
                )
            elif seen == OPENED:
                out.append(GateOutcome(gate, "forced", waited, "", kind))
            elif seen == RELEASED:
                out.append(GateOutcome(gate, "cannot happen", waited, watch.reason, kind))
            elif seen == TIMED_OUT:
                detail = f"`{gate.opener_label}` did not come within the gate's bound, {bound:g} s"
                out.append(GateOutcome(gate, "timed out", waited, detail, kind))
            else:
                out.append(GateOutcome(gate, "not reached", waited, "the held op never ran", kind))
        return out


HOST_BOUND = 0.05  # seconds: on the CPU engine nothing can open a gate, so a long wait says no more


class HostGates:
    """Gates where stream work runs when it is issued (the CPU engine): the held op waits on the
    host itself, up to the bound. The host is the only thread, so nothing can open the gate
    meanwhile: on the CPU engine the racy order cannot happen, and every gate waits out its
    bound (a gate opened before its held op is issued passes at once)."""

    kind = "host wait (streams run at issue)"

    def __init__(self, count: int, bound: float = HOST_BOUND) -> None:
        self.bound = bound
        self.flags = [threading.Event() for _ in range(count)]
        self.values = [CLOSED] * count
        self.seen = [(CLOSED, 0.0)] * count

    def hold(self, gate: int, stream: str) -> None:
        start = time.perf_counter()
        opened = self.flags[gate].wait(self.bound)
        self.seen[gate] = (self.values[gate] if opened else TIMED_OUT, time.perf_counter() - start)

    def open(self, gate: int, stream: str | None) -> None:
        self._set(gate, OPENED)

    def release(self, gate: int) -> None:
        self._set(gate, RELEASED)

    def _set(self, gate: int, value: int) -> None:
        self.values[gate] = value
        self.flags[gate].set()

    def results(self) -> list[tuple[int, float]]:
        return list(self.seen)

"""All invariants by id."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.messages import AbortSilent, ExactLength, NoPostEos
from overlapcheck.invariants.no_race import NoRace
from overlapcheck.invariants.oracle import Oracle
from overlapcheck.invariants.resources import Liveness, PagesConserved, SlotNotInFlight

# Order matters only for which of two violations in one step is reported: races first.
INVARIANTS: dict[str, Callable[[], Invariant]] = {
    "no-race": NoRace,
    "no-post-eos": NoPostEos,
    "exact-length": ExactLength,
    "oracle": Oracle,
    "slot-not-in-flight": SlotNotInFlight,
    "pages-conserved": PagesConserved,
    "abort-silent": AbortSilent,
    "liveness": Liveness,
}


def make_invariants(ids: Iterable[str] | None = None) -> list[Invariant]:
    chosen = list(INVARIANTS) if ids is None else list(ids)
    unknown = [i for i in chosen if i not in INVARIANTS]
    if unknown:
        raise KeyError(f"unknown invariant {', '.join(unknown)} (known: {', '.join(INVARIANTS)})")
    return [INVARIANTS[i]() for i in chosen]

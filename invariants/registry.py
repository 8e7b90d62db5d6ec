"""All invariants by id."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.fairness import BoundedWait
from overlapcheck.invariants.hidden_sync import NoHiddenSync
from overlapcheck.invariants.kv_provenance import KvProvenance
from overlapcheck.invariants.messages import AbortSilent, ExactLength, NoPostEos
from overlapcheck.invariants.no_race import NoRace
from overlapcheck.invariants.oracle import Oracle
from overlapcheck.invariants.placeholders import Placeholders
from overlapcheck.invariants.progress import Progress
from overlapcheck.invariants.rank_consistent import RankConsistent
from overlapcheck.invariants.resources import Liveness, PagesConserved, SlotNotInFlight
from overlapcheck.invariants.uninit import NoUninitRead
from overlapcheck.invariants.work_bound import WorkBound

# Order matters only for which of two violations in one step is reported: races first.
INVARIANTS: dict[str, Callable[[], Invariant]] = {
    # A slot reused under an in-flight forward is also a race; the slot check names it better.
    "slot-not-in-flight": SlotNotInFlight,
    "no-race": NoRace,
    # before `oracle`: the garbage read, not the wrong token after it
    "no-uninit-read": NoUninitRead,
    # before `kv-provenance`: a stale resolution shows at its issue, the wrong read after it ran
    "placeholder": Placeholders,
    "kv-provenance": KvProvenance,  # before `oracle`: the wrong read, not the wrong token after it
    "no-post-eos": NoPostEos,
    "exact-length": ExactLength,
    "oracle": Oracle,
    "pages-conserved": PagesConserved,
    "abort-silent": AbortSilent,
    "liveness": Liveness,
    "progress": Progress,
    "work-bound": WorkBound,
    "no-hidden-sync": NoHiddenSync,
    "rank-consistent": RankConsistent,  # only where a run has several ranks (core/ranks.py)
}


def _bounded_wait(arg: str) -> Invariant:
    try:
        k = int(arg)
    except ValueError:
        raise ValueError(f"bounded-wait=K needs an integer K >= 0, got {arg!r}") from None
    return BoundedWait(k)


# Opt-in checks take an argument (`ID=ARG`) and are never in the default set: they state properties
# that some valid configurations break on purpose (a cache-aware policy's fairness).
OPT_IN: dict[str, Callable[[str], Invariant]] = {
    "bounded-wait": _bounded_wait,
}


def make_invariant(spec: str) -> Invariant:
    """One invariant from `ID` (a default one) or `ID=ARG` (an opt-in one). Raises ValueError."""
    name, has_arg, arg = spec.partition("=")
    if name in INVARIANTS and not has_arg:
        return INVARIANTS[name]()
    if name in OPT_IN:
        if not has_arg:
            raise ValueError(f"{name} needs an argument: {name}=ARG")
        return OPT_IN[name](arg)
    if name in INVARIANTS:
        raise ValueError(f"{name} takes no argument")
    known = ", ".join([*INVARIANTS, *(f"{k}=ARG" for k in OPT_IN)])
    raise ValueError(f"unknown invariant {spec!r} (known: {known})")


# Findings that end a run rather than invariants a run checks: a search may look past them
# (`explore --skip no-crash`), a run or a replay always reports them.
RUN_ENDING = ("no-crash", "no-hang")


def check_specs(
    skip: Iterable[str] = (), extra: Iterable[str] = (), among: Iterable[str] | None = None
) -> list[str]:
    """The invariant specs a run checks: the defaults (or those of them in `among`) less `skip`,
    in the registry's order (which of two violations at one step is reported first), plus the
    opt-in ones in `extra`."""
    skipped, chosen = set(skip), set(INVARIANTS if among is None else among)
    return [i for i in INVARIANTS if i in chosen and i not in skipped] + list(extra)


def make_invariants(ids: Iterable[str] | None = None) -> list[Invariant]:
    """The default set for None; otherwise exactly `ids` (each `ID` or `ID=ARG`)."""
    chosen = list(INVARIANTS) if ids is None else list(ids)
    return [make_invariant(i) for i in chosen]

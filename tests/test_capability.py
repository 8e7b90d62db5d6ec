"""`provides` answers as `isinstance` does for the runtime-checkable protocols, and never reads the
object's `__dict__` (which slows every later attribute access of the object: core/capability.py);
nor does a run, of the scheduler under test or of the simulated device."""

from __future__ import annotations

import gc
import inspect
from typing import Protocol, runtime_checkable

import pytest

from overlapcheck.backends.base import KeepsKvShadow
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.capability import members, provides
from overlapcheck.core.protocol import HasBooks, SchedulerUnderTest
from overlapcheck.core.speculative import TakesDrafter
from overlapcheck.harness.runner import run_scenario
from overlapcheck.invariants.placeholders import PlaceholderLog
from overlapcheck.scenarios.named import named_scenario


@runtime_checkable
class _Both(Protocol):
    size: int

    def grow(self) -> None: ...


@runtime_checkable
class _More(_Both, Protocol):
    def shrink(self) -> None: ...


class _Grows:
    def __init__(self) -> None:
        self.size = 0

    def grow(self) -> None: ...


class _GrowsAndShrinks(_Grows):
    def shrink(self) -> None: ...


class _NoSize:
    def grow(self) -> None: ...


class _SizeNone(_Grows):
    def __init__(self) -> None:
        self.size = None  # type: ignore[assignment]


class _GrowNone(_Grows):
    grow = None  # type: ignore[assignment]


PROTOCOLS = (
    _Both,
    _More,
    HasBooks,
    SchedulerUnderTest,
    TakesDrafter,
    PlaceholderLog,
    KeepsKvShadow,
)
OBJECTS = (_Grows(), _GrowsAndShrinks(), _NoSize(), _SizeNone(), _GrowNone(), object(), 3)


def test_members_include_data_members_methods_and_those_of_protocol_bases() -> None:
    assert dict(members(_More)) == {"size": False, "grow": True, "shrink": True}
    assert dict(members(HasBooks)) == {"books": True}
    assert dict(members(PlaceholderLog)) == {"placeholder_inputs": False}


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_provides_answers_as_isinstance_does(protocol: type) -> None:
    for obj in OBJECTS:
        assert provides(obj, protocol) == isinstance(obj, protocol), (obj, protocol)


def _inline(obj: object) -> bool:
    """Whether `obj`'s attributes are still inline values (CPython 3.11 and 3.12): the collector
    then sees each of them; once its `__dict__` was read, it sees one dict (and the type)."""
    found = gc.get_referents(obj)
    return not (len(found) <= 2 and any(type(r) is dict for r in found))


class _Logs:
    def __init__(self) -> None:
        self.placeholder_inputs: list[tuple[int, int, int]] = []
        self.a, self.b, self.c = 1, 2, 3

    def books(self) -> None: ...

    def step(self) -> bool:
        return False


def _detector_works() -> bool:
    obj = _Logs()
    inspect.getattr_static(obj, "a")  # what isinstance does on 3.12
    return _inline(_Logs()) and not _inline(obj)


needs_detector = pytest.mark.skipif(
    not _detector_works(), reason="this Python keeps inline values when __dict__ is read"
)


@needs_detector
def test_provides_reads_no_dict() -> None:
    obj = _Logs()
    assert provides(obj, HasBooks) and provides(obj, SchedulerUnderTest)
    assert provides(obj, PlaceholderLog) and not provides(obj, TakesDrafter)
    assert _inline(obj)


@needs_detector
def test_a_run_leaves_the_scheduler_and_the_device_their_inline_attributes() -> None:
    backend = SimBackend()
    result = run_scenario(named_scenario("basic"), backend)  # every invariant, `placeholder` too
    assert result.ok, result.violations
    assert _inline(result.scheduler)
    assert backend.device is not None and _inline(backend.device)

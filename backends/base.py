"""What the harness needs from a backend: a device, and each request's expected output (the
oracle)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from overlapcheck.core.device import Device
from overlapcheck.core.expected import Expected
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.scenario import RequestSpec, Scenario


class Backend(Protocol):
    """Where a run's device comes from. What differs between backends is said here, as
    properties, so that nothing above asks for a backend by name."""

    name: str

    @property
    def checks_online(self) -> bool:
        """Whether the checks may run between iterations: on the simulator they cost no device
        time; on a real engine they would stretch the host's iterations and move the timing
        under test, so by default they run after the run over the recorded events."""
        ...

    @property
    def watchdog_by_default(self) -> bool:
        """Whether a step is watched for a hang unless asked otherwise (a real engine's first
        forward compiles for tens of seconds)."""
        ...

    @property
    def small_run_objects(self) -> bool:
        """Whether a run's objects are small Python objects that may go straight to the oldest
        generation at its end (a real engine's hold device memory in cycles, so they stay young
        and die in the next collections: harness/runner.py)."""
        ...

    def prepare(self, scenario: Scenario) -> Scenario:
        """The scenario as this backend runs it (the real engine fits it to its model)."""
        ...

    def make_device(self, scenario: Scenario) -> Device: ...

    def expected(self, spec: RequestSpec, max_tokens: int) -> Expected:
        """The expected output of one request instance (a reused uid gets one of its own)."""
        ...


@runtime_checkable
class KeepsKvShadow(Protocol):
    """A backend whose devices can keep a KV shadow (`core/kv_shadow.py`): what each KV cell
    was computed for, which `kv-provenance` reads. The simulator does; the real engine does not."""

    def make_shadowed_device(self, scenario: Scenario, shadow: KvShadow) -> Device:
        """`make_device`, the device recording into `shadow` as its kernels run."""
        ...

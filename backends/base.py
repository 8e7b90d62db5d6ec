"""What the runner needs from a backend: a device, and a sequential reference per request."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from overlapcheck.backends.kv_shadow import KvShadow
from overlapcheck.core.device import Device
from overlapcheck.core.scenario import RequestSpec, Scenario


class Reference(Protocol):
    """One request's sequential reference: its tokens and how a served token is judged."""

    tokens: list[int]

    def matches(self, position: int, token: int) -> bool:
        """Whether `token`, the request's output number `position` (from 0), is right."""
        ...


class Backend(Protocol):
    name: str

    def prepare(self, scenario: Scenario) -> Scenario:
        """The scenario as this backend runs it (the real engine fits it to its model)."""
        ...

    def make_device(self, scenario: Scenario) -> Device: ...

    def reference(self, spec: RequestSpec, max_tokens: int) -> Reference:
        """The reference for one request instance (a reused uid gets a reference of its own)."""
        ...


@runtime_checkable
class KeepsKvShadow(Protocol):
    """A backend whose devices can keep a KV shadow (`backends/kv_shadow.py`): what each KV cell
    was computed for, which `kv-provenance` reads. The simulator does; the real engine does not."""

    def make_shadowed_device(self, scenario: Scenario, shadow: KvShadow) -> Device:
        """`make_device`, the device recording into `shadow` as its kernels run."""
        ...


class ExactReference:
    """A reference judged token by token for equality."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def matches(self, position: int, token: int) -> bool:
        return position < len(self.tokens) and self.tokens[position] == token

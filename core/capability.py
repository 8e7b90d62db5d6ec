"""Whether an object provides a protocol's members, asked without `isinstance`'s side effect.

On CPython 3.12, `isinstance(obj, P)` for a runtime-checkable protocol `P` looks each member up
with `inspect.getattr_static`, which reads `obj.__dict__`. Reading it moves the object's
attributes out of the inline values that the interpreter's specialised attribute loads and stores
use, so every later `self.x` of that object takes the dictionary path, for the object's whole
life. Asked of the simulated device (`placeholder`'s device log), it cost every all-invariants run
18.5 M of its 920 M instructions; asked of the scheduler under test, it slowed every step of it.
`provides` asks the same question through ordinary attribute lookups, which leave the object as
it was. (3.11's `isinstance` used `hasattr` and had no such effect; 3.13 keeps inline values.)
"""

from __future__ import annotations

import functools
import inspect
from typing import Generic, Protocol

_MISSING = object()


@functools.cache
def members(protocol: type) -> tuple[tuple[str, bool], ...]:
    """The protocol's members (its protocol bases' too), each with whether it is a method."""
    found: dict[str, bool] = {}
    for base in reversed(protocol.__mro__):
        if base in (object, Protocol, Generic) or not getattr(base, "_is_protocol", False):
            continue
        for name in inspect.get_annotations(base):
            found[name] = False
        for name, value in vars(base).items():
            if not name.startswith("_"):
                found[name] = callable(value)
    return tuple(found.items())


def provides(obj: object, protocol: type) -> bool:
    """`isinstance(obj, protocol)` for a runtime-checkable protocol: every member is there, and
    no method is None; without reading `obj.__dict__` (see above)."""
    for name, method in members(protocol):
        value = getattr(obj, name, _MISSING)
        if value is _MISSING or (method and value is None):
            return False
    return True

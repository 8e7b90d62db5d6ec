"""The small draws every workload strategy shares (`strategies.py`, `pressure.py`)."""

from __future__ import annotations

from hypothesis import strategies as st

from overlapcheck.core.units import US

__all__ = ["EOS", "US", "often", "rarely", "tokens"]

EOS = 2
tokens = st.integers(3, 999)


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in `one_in` draws; shrinks to False. The workload kinds that the named
    faults do not need stay rare, so the search keeps finding those as fast as before, while each
    kind still shows up in hundreds of examples of a run."""
    return draw(st.integers(0, one_in - 1)) == one_in - 1


def often(draw: st.DrawFn, eighths: int) -> bool:
    """True in about `eighths` eighths of the draws; shrinks to False."""
    return draw(st.integers(0, 7)) >= 8 - eighths

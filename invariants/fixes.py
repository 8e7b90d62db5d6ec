"""A fix to try for a finding, derived from its kind and its locations alone (never from which
scheduler it is): what reports tell upstream to try first. A suggestion, not a verdict: the
replay after the change says whether it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from overlapcheck.core.sites import Location
from overlapcheck.invariants.base import Violation


def _at(v: Violation, role: str) -> Location | None:
    return next((loc for loc in v.locations if loc.role == role), None)


def _line(loc: Location | None) -> str:
    return "" if loc is None else f" (`{loc.file}:{loc.line}`, in `{loc.function}`)"


def _race(v: Violation, term: Callable[[str], str]) -> str:
    reused, freed = _at(v, "reused"), _at(v, "freed")
    first = v.details.get("first", {})
    second = v.details.get("second", {})
    old = first.get("agent", "the other stream")
    if reused is not None:
        use = v.locations[0]
        return (
            f"The block was handed to a new tensor on {reused.agent} while {old} could still use "
            f"the freed one. Keep it until {old} is done: call `record_stream` with {old}'s "
            f"stream on the tensor after its use there{_line(use)}, so that the caching "
            f"allocator waits for {old} before reusing it; or make {reused.agent} wait for "
            f"{old} (`wait_stream`) before the allocation{_line(reused)}"
            + ("" if freed is None else f", or drop the tensor later{_line(freed)}")
            + "."
        )
    new = second.get("agent", "the second agent")
    later = v.locations[0] if v.locations else None
    if new == "host":
        return (
            f"The host uses the cells before {old}'s work on them is known to have run: wait on "
            f"an event recorded on {old} after that work (`synchronize`) before the access"
            f"{_line(later)}."
        )
    if old == "host":
        return (
            f"{new} runs its operation without an order after the host's access: record an "
            f"event after the host's work and make {new} wait on it (`wait_event`), or keep the "
            f"host from rewriting the cells until {new}'s operation ran{_line(later)}."
        )
    return (
        f"Nothing orders {new}'s operation after {old}'s: make {new} wait for {old} "
        f"(`wait_stream`, or `wait_event` on an event recorded after {old}'s operation) before "
        f"the operation{_line(later)}."
    )


def _slot(v: Violation, term: Callable[[str], str]) -> str:
    slot = term("slot")
    freed = _at(v, "freed")
    return (
        f"The {slot} goes back to the free list while a launched batch still uses it. Defer the "
        f"free{_line(freed)} until that batch's result has been processed (the host waited on "
        f"its copy-done event), and order the next request's writes into the row after the "
        f"batch's stream (`wait_stream`) when the batch writes the row after copy-done."
    )


_FIXES: Mapping[str, Callable[[Violation, Callable[[str], str]], str]] = {
    "no-race": _race,
    "slot-not-in-flight": _slot,
    "pages-conserved": lambda v, term: (
        f"A {term('page')} is given back twice, or while a request or the prefix cache still "
        "holds it: make every path that ends a request (finish, abort, both at once with a "
        "batch in flight) free its pages exactly once, after the last batch that uses them."
    ),
    "abort-silent": lambda v, term: (
        f"An abort that finds the {term('request')}'s batch in flight must also drop that "
        "batch's result: mark the request aborted, skip it when the batch is processed (no "
        "message), and free its resources once, after that batch."
    ),
    "exact-length": lambda v, term: (
        "Judge a request finished by the tokens the host has received (`max_tokens` of them, "
        "or EOS), not by the rounds launched: under overlap the next round is launched before "
        "this one's result is processed."
    ),
    "no-post-eos": lambda v, term: (
        "Skip the results of requests that finished already: a round launched before the "
        "finish was processed still returns a token for them."
    ),
    "oracle": lambda v, term: (
        "The tokens differ from the request run alone: the request read a context another "
        f"one overwrote. Look for a {term('slot')}, {term('page')} or buffer reused while a "
        "launched batch still reads it (run with `no-race` and `slot-not-in-flight` on)."
    ),
    "kv-provenance": lambda v, term: (
        f"A forward read KV cells computed for another context: a {term('page')} was reused, "
        "or its page-table row rewritten, while a launched batch still reads it."
    ),
    "device-contract": lambda v, term: (
        "The call broke the device seam's contract (`core/device.py`): do what the contract "
        "asks before it, at the line named."
    ),
    "no-crash": lambda v, term: (
        "Fix the exception at the line named, or, where that line only met a state an earlier "
        "decision made (an allocation a check admitted, say), that decision: the call path "
        "above leads to it."
    ),
    "liveness": lambda v, term: (
        "A request never finishes or resources stay held: check that admission can always "
        "make progress and that every path that ends a request gives back what it holds."
    ),
}


def fix_to_try(v: Violation, vocabulary: Mapping[str, str] | None = None) -> str:
    """One paragraph: what to change, in the engine's words where `vocabulary` has them."""
    words = vocabulary or {}

    def term(word: str) -> str:
        return words.get(word, word)

    found = _FIXES.get(v.invariant)
    if found is None:
        return "Look at the lines named: the check states what must hold there."
    return found(v, term)

"""Named known bugs. Each re-enables one upstream behaviour at one guarded spot of the scheduler,
so that users can watch the checker find it and watch the fix hold.

A fault's docstring-like `summary` says what it is; `origin` where it came from; `breaks` which
invariants are expected to catch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    summary: str
    origin: str
    breaks: tuple[str, ...]


FINISH_BY_CAN_DECODE = "finish-by-can-decode"
REPLY_AFTER_FINISH = "reply-after-finish"
FREE_SLOT_EARLY = "free-slot-early"
ABORT_INFLIGHT_PREFILL = "abort-inflight-prefill"
CHUNK_SAMPLE_OVERWRITE = "chunk-sample-overwrite"
STAGING_BUFFER_REUSE = "staging-buffer-reuse"
COPY_DONE_WRONG_STREAM = "copy-done-wrong-stream"

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            FINISH_BY_CAN_DECODE,
            "A request is judged finished when it cannot decode any more. `can_decode` counts the "
            "rounds launched, and in the overlap loop the next round is launched before this one "
            "is "
            "processed, so a length-limited request stops one token short.",
            "mini-sglang scheduler: finish check through `req.can_decode` under overlap scheduling",
            ("exact-length",),
        ),
        Fault(
            REPLY_AFTER_FINISH,
            "A request that finished (EOS) in round N is already in the launched round N+1; that "
            "round's result is not dropped, so a token message follows the finished one.",
            "mini-sglang overlap loop: results of finished requests processed like any other",
            ("no-post-eos",),
        ),
        Fault(
            FREE_SLOT_EARLY,
            "The slot and pages of a finished request are freed while the in-flight round N+1 "
            "still reads and writes its `token_pool`/`page_table` row and KV pages; a new request "
            "can take "
            "them at once.",
            "overlap scheduling: resources freed at finish rather than after the in-flight batch",
            ("slot-not-in-flight", "no-race", "oracle"),
        ),
        Fault(
            ABORT_INFLIGHT_PREFILL,
            "An abort that arrives while the request's prefill is in flight caches (releases) the "
            "request at once; processing the prefill's result releases it again.",
            "mini-sglang abort handling with an in-flight prefill",
            ("pages-conserved",),
        ),
        Fault(
            CHUNK_SAMPLE_OVERWRITE,
            "A non-final prefill chunk writes its throw-away sample into `token_pool[slot, end]`, "
            "which is the next chunk's first prompt token, instead of a dummy cell.",
            "mini-sglang ef4367f (chunked prefill sample position)",
            ("no-race", "oracle"),
        ),
        Fault(
            STAGING_BUFFER_REUSE,
            "Metadata planning rewrites the pinned staging buffer without waiting for the previous "
            "asynchronous H2D copy out of it to run, so a batch can get its successor's metadata.",
            "mini-sglang #103 / issue #58 (FlashInfer plan with a reused pinned buffer)",
            ("no-race", "oracle"),
        ),
        Fault(
            COPY_DONE_WRONG_STREAM,
            "The copy-done event is recorded on the scheduler stream instead of the engine stream, "
            "so waiting on it does not wait for the forward and its D2H copy of the sampled "
            "tokens.",
            "mini-sglang 46255ef",
            ("no-race", "oracle"),
        ),
    )
}


class UnknownFaultError(ValueError):
    pass


def parse_faults(names: Iterable[str]) -> frozenset[str]:
    """Validate fault names; the error lists the known ones."""
    chosen = frozenset(names)
    unknown = sorted(chosen - FAULTS.keys())
    if unknown:
        raise UnknownFaultError(
            f"unknown fault {', '.join(unknown)} (known: {', '.join(sorted(FAULTS))})"
        )
    return chosen

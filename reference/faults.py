"""Named known bugs. Each re-enables one upstream behaviour at one guarded spot of the scheduler,
so that users can watch the checker find it and watch the fix hold.

A fault's docstring-like `summary` says what upstream did, in which situation, and what the user
saw; `origin` where in mini-sglang's history it came from; `breaks` which invariants catch it
(first the one a search usually reports).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from overlapcheck.core.config import PreemptionKind, PreemptPolicy


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
# Preemption (reference/preemption.py); each needs the config `PREEMPTION_FAULT_CONFIG` names.
RETRACT_SKIPS_INFLIGHT = "retract-skips-inflight"
PREEMPT_RESET_EARLY = "preempt-reset-early"
PREEMPT_CASCADE = "preempt-cascade"
SWAP_FREE_BEFORE_OFFLOAD = "swap-free-before-offload"

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            FINISH_BY_CAN_DECODE,
            "A request is judged finished by `not req.can_decode`, which counts the rounds "
            "launched, not the results received. Under overlap the last round is already launched "
            "when the one before it is processed, so token max_tokens-1 is marked finished; the "
            "last round's result is still processed and replied, marked finished again. The user "
            "gets all max_tokens tokens, the last two with `finished` (offline outputs, which keep "
            "every token but a finished EOS, looked right). The normal loop processes each round "
            "before launching the next, and is exact.",
            "mini-sglang e7d4f65 to 20fcd7f, scheduler.py `_process_last_data`: `finished = not "
            "req.can_decode` (the engine's `complete_one` advances `device_len` at launch), and "
            "every non-chunked result replied; `finished_reqs` only skips the second free",
            ("exact-length", "no-post-eos"),
        ),
        Fault(
            REPLY_AFTER_FINISH,
            "A request that finished at EOS in round N is already in the launched round N+1; that "
            "round's result is processed like any other, so a token message with `finished=False` "
            "(the length is not reached) follows the finished one. Upstream's detokenizer then "
            "re-created state for the uid and never freed it. The normal loop has no round N+1.",
            "mini-sglang e7d4f65 (the `if req in self.finished_reqs: continue` of `_process_last_"
            "data` removed; every result appended to the reply) to 20fcd7f",
            ("no-post-eos",),
        ),
        Fault(
            FREE_SLOT_EARLY,
            "A request that finished at EOS in round N has its slot freed and its pages cached or "
            "freed at once, while the launched round N+1 still reads and writes its "
            "`token_pool`/`page_table` row and KV pages; a request arriving next takes the slot "
            "(and pages) while that round is in flight. The user sees nothing unless the race "
            "lands: then the newcomer's tokens are wrong. The normal loop has no round N+1.",
            "mini-sglang e7d4f65 to 20fcd7f: `_free_req_resources` called on the first finished "
            "result (before, resources of requests in the ongoing batch were kept until it was "
            "processed)",
            ("slot-not-in-flight", "no-race", "oracle"),
        ),
        Fault(
            ABORT_INFLIGHT_PREFILL,
            "An abort arrives while the request's last prefill batch (a prompt prefilled in one "
            "batch, or its final chunk) is in flight: the request is already running, so the "
            "abort frees it at once, caching its prompt in the prefix cache. Processing the "
            "prefill's result caches it again: its pages end up both free and in the tree (with "
            "a prefix match, a lock count goes below zero), and the prefill's token is still "
            "sent after the abort. An abort during a non-final chunk is harmless (that chunk's "
            "result is skipped), and the normal loop has processed the prefill before any abort.",
            "mini-sglang 578df98 (#16, abort: `decode_manager.abort_req` then "
            "`_free_req_resources`) with c7f800d (#86, `_process_last_data` caches a prefilled "
            "request: `cache_req(req, finished=False)`), to 20fcd7f",
            ("pages-conserved", "abort-silent"),
        ),
        Fault(
            CHUNK_SAMPLE_OVERWRITE,
            "A non-final prefill chunk writes its throw-away sample into `token_pool[slot, end]`, "
            "the next chunk's first prompt token, instead of a dummy cell. Under overlap the next "
            "chunk's prompt is copied in on the scheduler stream while the chunk's forward still "
            "runs on the engine stream; when the sample lands last, the next chunk reads it as a "
            "prompt token and the user gets wrong tokens. The normal loop waits for each forward.",
            "mini-sglang ef4367f (`dummy_write_2d_pos`: a chunked request's sample goes to a dummy "
            "position)",
            ("no-race", "oracle"),
        ),
        Fault(
            STAGING_BUFFER_REUSE,
            "Metadata planning rewrites the pinned staging buffer without waiting for the previous "
            "asynchronous H2D copy out of it to run, so a batch can get its successor's metadata "
            "and the user gets wrong tokens. Only the overlap loop plans a batch while the "
            "previous copy may be pending.",
            "mini-sglang issue #58 (worked around by OVERLAP_EXTRA_SYNC, 46255ef), fixed in #103 "
            "(20fcd7f: FlashInfer `plan` waits on an event recorded after the previous plan)",
            ("no-race", "oracle"),
        ),
        Fault(
            COPY_DONE_WRONG_STREAM,
            "The copy-done event is recorded on the scheduler stream instead of the engine stream, "
            "so waiting on it does not wait for the forward and its D2H copy of the sampled "
            "tokens: the host reads what the buffer held before (-1), and the user gets wrong "
            "tokens, in either loop. A latent hazard upstream rather than a bug users hit: "
            "`copy_done_event.record()` took the current stream, and `forward_batch` asserted that "
            "the engine stream was current, so the event was right by context; the fault records "
            "it on the stream current outside that context.",
            "mini-sglang 46255ef (engine.py: `copy_done_event.record()` became "
            "`record(self.stream)`, in the commit that worked around issue #58)",
            ("no-race", "oracle"),
        ),
        Fault(
            RETRACT_SKIPS_INFLIGHT,
            "A decoding request is retracted (SGLang-style, pages on demand ran out) while its "
            "last round is in flight. That round's result is not sent, but it is kept in the "
            "request's outputs, so the recompute's prefill folds it in and decoding resumes after "
            "it: the user's stream skips that token. The fix drops the result and samples the "
            "position again after the recompute. Needs the overlap loop (the normal loop has "
            "nothing in flight at a retract).",
            "SGLang #39743 (a request retracted before its pending overlap result is processed: "
            "the resumed output skips tokens)",
            ("oracle", "exact-length"),
        ),
        Fault(
            PREEMPT_RESET_EARLY,
            "A request is preempted (vLLM-style, on allocation failure) while its last round is "
            "in flight, and the count of outputs its recompute folds in is taken at preemption, "
            "before that in-flight output is drained. The output is then processed and sent, and "
            "the recompute samples its position again: the user gets a token twice. The fix "
            "takes the count when the request is admitted again, after the drain.",
            "vLLM #48245, #47900, #38624 (a preempted request's in-flight output drained against "
            "reset counters: duplicated tokens, a placeholder count below zero)",
            ("oracle", "exact-length"),
        ),
        Fault(
            PREEMPT_CASCADE,
            "With pages on demand, admission checks only the pages of the newcomer's own "
            "prefill, not the next page each running decode needs. The decode then runs out, "
            "and SGLang-style retraction takes the last-admitted request: the newcomer, whose "
            "prefill is still in flight, so retracting it frees nothing now and drops its result. "
            "Its pages come back after processing, it is admitted again at once, and the cycle "
            "repeats: preemptions cascade and nobody gains a token until the step bound. The fix "
            "keeps every admitted request's next page free at admission.",
            "vLLM #49674, #49675 (preemption that frees nothing and cascades with zero progress)",
            ("progress",),
        ),
        Fault(
            SWAP_FREE_BEFORE_OFFLOAD,
            "A request preempted by swap has its KV offloaded on the transfer stream, and its "
            "pages go back once its in-flight batch is processed, without ordering the engine "
            "stream after the offload. The transfer stream is not ordered with compute, so the "
            "next forward that takes those pages can write them while the offload still reads "
            "them: the request swaps back in with another request's KV, and the user gets wrong "
            "tokens. The fix makes the engine stream wait for the offload's event first.",
            "vLLM #45357, #33377 (KV blocks freed while a newer step or a KV transfer still uses "
            "them)",
            ("no-race", "kv-provenance", "oracle"),
        ),
    )
}


class Needs(NamedTuple):
    """The configuration a preemption fault needs to be reachable (explore pins it)."""

    preemption: PreemptionKind
    preempt_policy: PreemptPolicy


PREEMPTION_FAULT_CONFIG: dict[str, Needs] = {
    RETRACT_SKIPS_INFLIGHT: Needs("recompute", "retract-decode"),
    PREEMPT_RESET_EARLY: Needs("recompute", "allocation-failure"),
    PREEMPT_CASCADE: Needs("recompute", "retract-decode"),
    SWAP_FREE_BEFORE_OFFLOAD: Needs("swap", "allocation-failure"),
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

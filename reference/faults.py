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
from overlapcheck.core.errors import UserError


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    summary: str
    origin: str
    breaks: tuple[str, ...]
    speculative: bool = False  # only reachable with draft_tokens > 0
    ranks: bool = False  # only reachable with num_ranks > 1 (`--ranks N`)


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
# Speculative decoding under overlap (draft_tokens > 0; reference/speculative.py)
STALE_PLACEHOLDER = "stale-placeholder"
FREE_ROW_IN_VERIFY = "free-row-in-verify"
RESOLVE_UNORDERED = "resolve-unordered"
READS_DONE_EARLY = "reads-done-early"
PLACEHOLDER_UNDERFLOW = "placeholder-underflow"
PREEMPT_PLACEHOLDER_RESET = "preempt-placeholder-reset"
# Ranks (num_ranks > 1; core/ranks.py)
LOCAL_EXTEND_FLAG = "local-extend-flag"

SPEC_FAULTS = (
    Fault(
        STALE_PLACEHOLDER,
        "A request keeps the placeholder of its last speculative step after that step's result "
        "was processed. When the request sat out the batch before its next step (a prefill batch "
        "ran in between), that step still resolves its start from the previous batch's results, "
        "which are another batch's: it reads and writes the wrong positions and the user gets "
        "wrong tokens. When the request was in the previous batch the placeholder happens to "
        "resolve right.",
        "vLLM #46899 (stale `-1` spec placeholders of a request not scheduled in the next round "
        "reached `scheduled_spec_decode_tokens`), #40768 and #43434 (a request with placeholders "
        "that was not in the previous worker batch skipped the overwrite: `-1` in `input_ids`)",
        ("placeholder", "kv-provenance", "oracle"),
        speculative=True,
    ),
    Fault(
        FREE_ROW_IN_VERIFY,
        "A request that reaches EOS or max_tokens inside a multi-token step has its slot and "
        "pages freed as soon as that result is processed, while its next verify step (launched "
        "under overlap before the result was known) still reads and writes its row and KV "
        "pages; a request admitted next takes the slot. The normal loop has no next step in "
        "flight.",
        "SGLang #18744, fixed by #18803 (spec v2 overlap: `release_kv_cache` returned a finished "
        "request's `req_pool_idx` while the draft-extend forward still read its `req_to_token` "
        "row; a recycled index had the row overwritten from the other stream)",
        ("slot-not-in-flight", "no-race", "oracle"),
        speculative=True,
    ),
    Fault(
        RESOLVE_UNORDERED,
        "The placeholder resolution of a step is enqueued on the engine stream before the engine "
        "stream waits for the scheduler stream, so the resolved shift and the step's metadata "
        "copy (which carries the placeholder) write the same metadata cells from two streams, "
        "unordered. When the copy lands last the forward runs on an unresolved placeholder: "
        "wrong positions, wrong tokens. Only the overlap loop launches steps with placeholders.",
        "SGLang #35748 (spec v2 overlap: the future map of next-step inputs written from the "
        "schedule stream and the forward stream without ordering; see also #28034, plan-stream "
        "work with no ordering against its producers)",
        ("no-race", "placeholder", "oracle"),
        speculative=True,
    ),
    Fault(
        READS_DONE_EARLY,
        "The event that says a verify forward has read its drafts is recorded on the engine "
        "stream before that forward instead of after it, so the scheduler stream copies the next "
        "step's drafts into the draft rows while the forward may still read them. Outputs stay "
        "right (a wrong draft is only rejected), but the write-after-read race is there, and "
        "acceptance drops; only the race check sees it. Only the overlap loop copies the next "
        "drafts while a forward runs.",
        "SGLang #37988, fixed in #31686 (the write-after-read 'read done' event was recorded "
        "before the CUDA graph replay that still re-read the `req_to_token` rows, so "
        "scheduler-side writes overwrote them mid-replay)",
        ("no-race",),
        speculative=True,
    ),
    Fault(
        PLACEHOLDER_UNDERFLOW,
        "The count of a request's unresolved steps is decremented by the results of its "
        "non-final prefill chunks too, which never reserved one, so after a chunked prompt it is "
        "negative. The next verify step in flight then counts as resolved: under overlap the "
        "step after it starts where the host last knew, one step behind, re-verifying positions "
        "whose tokens already came back: the user gets repeated tokens whenever a draft was "
        "accepted. Needs a prompt in two chunks or more.",
        "vLLM #57562 (AsyncScheduler `num_output_placeholders` driven below zero with chunked "
        "prefill under concurrency; its assertion killed the engine core), cf. #50692",
        ("oracle", "kv-provenance"),
        speculative=True,
    ),
    Fault(
        PREEMPT_PLACEHOLDER_RESET,
        "A request is preempted (pages on demand ran out) while its verify step is in flight, "
        "and its speculative books (the steps whose results it still waits for, its last step) "
        "are reset at preemption. The step's result still comes back and is drained against "
        "the reset books: the count goes below zero. Admitted again after the recompute, the "
        "request's next step in flight then counts as resolved, so the step after it starts "
        "where the host last knew, one step behind: the user gets repeated tokens whenever a "
        "draft was accepted. The fix resets the books once the launched steps were drained. "
        "Needs the overlap loop (the normal loop has nothing in flight at a preemption).",
        "vLLM #48245 (`num_output_placeholders` preemption underflow: a decode step reserved "
        "`1 + spec tokens` placeholders, `_preempt_request` rolled the request back, the stale "
        "in-flight output drained against the reset counters; an assertion killed the engine "
        "core), reworking #47900; cf. #49620 (the discard budget in placeholder units)",
        ("oracle", "kv-provenance", "exact-length"),
        speculative=True,
    ),
)

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
            ("exact-length",),
        ),
        Fault(
            REPLY_AFTER_FINISH,
            "A request that finished at EOS in round N is already in the launched round N+1; that "
            "round's result is processed like any other, so a token message with `finished=False` "
            "(the length is not reached) follows the finished one. Upstream's detokenizer then "
            "re-created state for the uid and never freed it; a request that takes the uid at "
            "once gets that token as its first. The normal loop has no round N+1.",
            "mini-sglang e7d4f65 (the `if req in self.finished_reqs: continue` of `_process_last_"
            "data` removed; every result appended to the reply) to 20fcd7f",
            ("no-post-eos", "oracle"),
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
        *SPEC_FAULTS,
        Fault(
            LOCAL_EXTEND_FLAG,
            "Each rank decides from its own share of the batch (the sequences data-parallel "
            "attention gives it) whether the batch extends: the flag that chooses the ranks' "
            "collectives, and in SGLang whether to disable overlap for two consecutive prefill "
            "batches. A rank whose share is empty (fewer sequences than ranks) counts the batch "
            "as idle while the others count it as extend, so the ranks' collectives and stream "
            "operations no longer pair: a hang. The fix all-gathers the flag: every rank judges "
            "the whole batch. With one rank its share is the whole batch, so only several ranks "
            "(`--ranks N`) reach it; `decisions()` exposes the flag.",
            "SGLang's `is_disable_overlap_for_batch` (scheduler.py; "
            "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP): DP-attention ranks decided from their "
            "local `forward_mode.is_extend()` and deadlocked on divergent stream operations; "
            "fixed by using the all-gathered `is_extend_in_batch` under `require_mlp_sync`",
            ("rank-consistent",),
            ranks=True,
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
    PREEMPT_PLACEHOLDER_RESET: Needs("recompute", "allocation-failure"),
}


class UnknownFaultError(UserError, ValueError):
    """A fault name that `faults` does not list."""


def parse_faults(names: Iterable[str]) -> frozenset[str]:
    """Validate fault names; the error lists the known ones."""
    chosen = frozenset(names)
    unknown = sorted(chosen - FAULTS.keys())
    if unknown:
        raise UnknownFaultError(
            f"unknown fault {', '.join(unknown)} (known: {', '.join(sorted(FAULTS))})"
        )
    return chosen

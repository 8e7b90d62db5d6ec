"""SGLang 0.5.23 trees with bugs of its upstream history put back: each `Bug` is the minimal reverse
of an upstream fix whose fixed code 0.5.23 still holds, as (file, old, new) text edits (the file
relative to `sglang/srt`), applied on top of `BASE`, finding 1's patch of docs/sglang.md (without
it a search stops at that finding first). `unpack` writes one such tree; docs/sglang.md ("Upstream
history") says what `explore` found on each and how fast."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_snapshot import unpack as unpack_snapshot

Edit = tuple[str, str, str]
SCHEDULER = "managers/scheduler.py"
RESULTS = "managers/scheduler_components/batch_result_processor.py"
TREE = "mem_cache/unified_radix_cache.py"

# Finding 1 (docs/sglang.md): an ignore_eos request clamped to its KV budget keeps the reserve
# PrefillAdder wants, or it is never admitted; and a page's rounding, or once retracted it is
# never admitted again (its prompt and outputs, prefilled again, take pages rounded up).
BASE: list[Edit] = [
    (
        SCHEDULER,
        "from sglang.srt.managers.schedule_policy import (\n",
        "from sglang.srt.managers.schedule_policy import (\n    IGNORE_EOS_RESERVE_TOKENS,\n",
    ),
    (
        SCHEDULER,
        "        req.sampling_params.max_new_tokens = max(0, max_new_tokens)\n",
        "        elif req.sampling_params.ignore_eos:\n"
        "            max_new_tokens = max(\n"
        "                0, max_new_tokens - IGNORE_EOS_RESERVE_TOKENS - (self.page_size - 1)\n"
        "            )\n"
        "        req.sampling_params.max_new_tokens = max(0, max_new_tokens)\n",
    ),
]


@dataclass(frozen=True)
class Bug:
    """One upstream bug put back: where its fix is (`upstream`), what it breaks, the edits."""

    name: str
    upstream: str
    what: str
    edits: tuple[Edit, ...]


BUGS = {
    bug.name: bug
    for bug in (
        Bug(
            "war-barrier",
            "sgl-project/sglang#18744 (its proposed fix #18803; the WAR barrier landed instead)",
            "result processing on the schedule stream rewrites req_to_token rows a forward still "
            "reads: the schedule stream no longer waits for the forward's shared reads",
            (
                (
                    SCHEDULER,
                    "        if not self._war_barrier_enabled:\n            return\n",
                    "        return\n",
                ),
            ),
        ),
        Bug(
            "retract-overlap",
            "sgl-project/sglang#1860 (Fix retraction + overlap)",
            "the overlap loop commits the in-flight decode token of a request retracted since",
            (
                (
                    RESULTS,
                    "                req.finished() or req.is_retracted\n            ):\n"
                    "                # NOTE: This (req.finished() or req.is_retracted)",
                    "                req.finished()\n            ):\n"
                    "                # NOTE: This (req.finished() or req.is_retracted)",
                ),
            ),
        ),
        Bug(
            "finished-overlap",
            "sgl-project/sglang#1738 (Faster overlap mode scheduler: skip a request finished "
            "while its next decode was in flight)",
            "the overlap loop commits the decode token of a request that finished (or was "
            "aborted) while that decode was in flight, and releases its KV again",
            (
                (
                    RESULTS,
                    "                req.finished() or req.is_retracted\n            ):\n"
                    "                # NOTE: This (req.finished() or req.is_retracted)",
                    "                req.is_retracted\n            ):\n"
                    "                # NOTE: This (req.finished() or req.is_retracted)",
                ),
            ),
        ),
        Bug(
            "chunk-count",
            "sgl-project/sglang-jax#971 (re-increment the chunk count of a request chunked "
            "again; SGLang's `is_chunked += 1` of sgl-project/sglang#1858's rework)",
            "a request prefilled in three chunks or more: its middle chunk's result is taken "
            "for the last one",
            (
                (
                    SCHEDULER,
                    "            self.chunked_req = adder.new_chunked_req\n\n"
                    "        if self.chunked_req is not None:\n"
                    "            self.chunked_req.inflight_middle_chunks += 1\n",
                    "            self.chunked_req = adder.new_chunked_req\n"
                    "            self.chunked_req.inflight_middle_chunks += 1\n",
                ),
            ),
        ),
        Bug(
            "chunked-abort-leak",
            "sgl-project/sglang#1674 and #2238 (Fix memory leak during abort); "
            "sgl-project/sglang-jax#984",
            "an abort of the request being chunked drops it without giving its KV row back",
            (
                (
                    SCHEDULER,
                    "        self._release_aborted_request(req)\n"
                    "        release_kv_cache(req, self.tree_cache, checkpoint=False)\n\n"
                    "        self.chunked_req = None\n",
                    "        self._release_aborted_request(req)\n\n"
                    "        self.chunked_req = None\n",
                ),
            ),
        ),
        Bug(
            "radix-repoint",
            "the repoint of a request's row at the tree's KV after its insert (SGLang's radix "
            "cache since sgl-project/sglang#418; the bug sgl-project/mini-sglang#142 fixes)",
            "a request whose computed prefix was in the tree already keeps reading its own "
            "copies of that KV, which the insert freed as duplicates",
            (
                (
                    TREE,
                    "        self.req_to_token_pool.write(\n"
                    "            (req.kv.req_pool_idx, slice(req.kv.cache_protected_len, "
                    "len(new_indices))),\n"
                    "            new_indices[req.kv.cache_protected_len :],\n"
                    "        )\n",
                    "",
                ),
            ),
        ),
    )
}


def unpack(into: Path, edits: Sequence[Edit] = ()) -> Path:
    """The 0.5.23 snapshot unpacked into `into` with `BASE` and `edits` applied (each anchor must
    occur once). Returns the folder holding the `sglang` package."""
    root = unpack_snapshot(into)
    for name, old, new in (*BASE, *edits):
        path = root / "sglang/srt" / name
        text = path.read_text()
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new))
    return root

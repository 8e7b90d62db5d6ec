"""Prompt lookup: drafts from an n-gram match in the request's own context (no draft model).

As vLLM's and SGLang's n-gram drafters do: find the latest earlier occurrence of the context's last
n tokens (the longest n first) and propose what followed it. A match close to the end continues
into the proposal itself, so a periodic context proposes its period over and over.
"""

from __future__ import annotations

from collections.abc import Sequence

from overlapcheck.core.speculative import DraftQuery

MAX_NGRAM = 3


def prompt_lookup(context: Sequence[int], count: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to `count` draft tokens to follow `context` (none when no n-gram of it recurs)."""
    size = len(context)
    if count <= 0 or size < 2:
        return []
    tokens = list(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = tokens[size - n :]
        for i in range(size - n - 1, -1, -1):
            if tokens[i : i + n] == suffix:
                out: list[int] = []
                pos = i + n
                while len(out) < count:
                    out.append(tokens[pos] if pos < size else out[pos - size])
                    pos += 1
                return out
    return []


class PromptLookup:
    """The reference scheduler's drafter: prompt lookup over what the host knows and assumes,
    proposing the unknown tokens too and dropping them."""

    def draft(self, query: DraftQuery) -> list[int]:
        context = [*query.known, *query.assumed]
        return prompt_lookup(context, query.wanted + query.skip)[query.skip :]

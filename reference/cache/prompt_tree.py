"""A radix tree over plain token sequences: no pages, no locks, no eviction.

The in-batch prefix check of the queue policies builds one per scheduling pass over the prompts of
the waiting requests, to see which of them share a prefix that the cache does not hold yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class _Node:
    key: tuple[int, ...]  # tokens on the edge into this node
    children: dict[int, _Node] = field(default_factory=dict)  # by the first token of their edge


def _common(key: tuple[int, ...], tokens: Sequence[int], pos: int) -> int:
    n, limit = 0, min(len(key), len(tokens) - pos)
    while n < limit and key[n] == tokens[pos + n]:
        n += 1
    return n


class PromptTree:
    def __init__(self) -> None:
        self.root = _Node(())

    def shared(self, tokens: Sequence[int]) -> int:
        """The longest prefix that `tokens` shares with any sequence inserted so far."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common(child.key, tokens, pos)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def insert(self, tokens: Sequence[int]) -> None:
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                node.children[tokens[pos]] = _Node(tuple(tokens[pos:]))
                return
            n = _common(child.key, tokens, pos)
            if n < len(child.key):  # split the edge where `tokens` leaves it
                upper = _Node(child.key[:n], {child.key[n]: child})
                child.key = child.key[n:]
                node.children[upper.key[0]] = upper
                child = upper
            node, pos = child, pos + n

"""A radix tree over page-sized token chunks, with lock counts and LRU eviction of unlocked
leaves."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from overlapcheck.core.errors import InvariantError
from overlapcheck.reference.cache.base import CacheHandle, MatchResult, PrefixCache


@dataclass(eq=False, slots=True)
class RadixNode(CacheHandle):
    node_id: int
    key: tuple[int, ...]  # tokens on the edge into this node; a multiple of the page size
    pages: list[int]  # one page per `page_size` tokens of `key`
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0


class RadixCache(PrefixCache):
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.root = RadixNode(node_id=0, key=(), pages=[], parent=None)
        self.root.lock_ref = 1  # the root is never evicted
        self._next_id = 1
        self._clock = 0
        self._cached = 0
        self._evictable = 0
        # `books_pages()` as last checked: dropped by every change of the tree's pages or locks.
        self._books_pages: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    # -- lookups ----------------------------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> MatchResult:
        node, length = self._walk(tokens)
        pages: list[int] = []
        path: list[RadixNode] = []
        walk = node
        while walk.parent is not None:
            path.append(walk)
            walk = walk.parent
        for n in reversed(path):
            pages += n.pages
        ps = self.page_size
        cells = [p * ps + i for p in pages for i in range(ps)]
        return MatchResult(node if node is not self.root else None, length, cells)

    def peek(self, tokens: Sequence[int]) -> int:
        node, covered = self.peek_position(tokens)
        length = covered
        while node.parent is not None:
            node = node.parent
            length += len(node.key)
        return length

    def peek_position(self, tokens: Sequence[int]) -> tuple[RadixNode, int]:
        """Where the match of `tokens` ends, with no side effect: the deepest node it enters and
        how many tokens of that node's edge it covers (all of them when it ends at the node; a
        match that ends inside an edge is where `match` would split it)."""
        ps = self.page_size
        usable = len(tokens) // ps * ps
        node, pos = self.root, 0
        while pos < usable:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            matched = self._common_pages(child.key, tokens, pos, usable)
            if matched < len(child.key):
                return child, matched
            node, pos = child, pos + matched
        return node, len(node.key)

    def _walk(self, tokens: Sequence[int]) -> tuple[RadixNode, int]:
        """Follow `tokens` down the tree, splitting the last edge at the divergence point."""
        ps = self.page_size
        usable = len(tokens) // ps * ps
        self._clock += 1
        node, pos = self.root, 0
        node.last_access = self._clock
        while pos < usable:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            matched = self._common_pages(child.key, tokens, pos, usable)
            if matched < len(child.key):
                child = self._split(child, matched)
            child.last_access = self._clock
            node, pos = child, pos + matched
            if matched < len(child.key):
                break
        return node, pos

    def _common_pages(
        self, key: tuple[int, ...], tokens: Sequence[int], pos: int, usable: int
    ) -> int:
        ps = self.page_size
        n = 0
        while (
            n < len(key)
            and pos + n < usable
            and key[n : n + ps] == tuple(tokens[pos + n : pos + n + ps])
        ):
            n += ps
        return n

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut the edge into `node` after `at` tokens; returns the new upper node."""
        self._books_pages = None
        parent = node.parent
        assert parent is not None
        upper = RadixNode(
            node_id=self._new_id(),
            key=node.key[:at],
            pages=node.pages[: at // self.page_size],
            parent=parent,
            lock_ref=node.lock_ref,
            last_access=node.last_access,
        )
        parent.children[upper.key[: self.page_size]] = upper
        node.key = node.key[at:]
        node.pages = node.pages[at // self.page_size :]
        node.parent = upper
        upper.children[node.key[: self.page_size]] = node
        return upper

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- locking ----------------------------------------------------------------------------------

    def lock(self, handle: CacheHandle | None) -> None:
        node = self._node(handle)
        self._books_pages = None
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: CacheHandle | None) -> None:
        node = self._node(handle)
        self._books_pages = None
        while node is not None and node is not self.root:
            if node.lock_ref <= 0:
                raise InvariantError("pages-conserved", "unlock of an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.pages)
            node = node.parent

    @staticmethod
    def _node(handle: CacheHandle | None) -> RadixNode | None:
        if handle is not None and not isinstance(handle, RadixNode):
            raise TypeError("radix cache got a handle it did not make")
        return handle

    # -- insertion and eviction ---------------------------------------------------------------

    def insert(self, tokens: Sequence[int], cells: Sequence[int]) -> int:
        ps = self.page_size
        usable = len(tokens) // ps * ps
        self._books_pages = None
        node, pos = self._walk(tokens[:usable])
        if pos < usable:
            leaf = RadixNode(
                node_id=self._new_id(),
                key=tuple(tokens[pos:usable]),
                pages=[cells[i] // ps for i in range(pos, usable, ps)],
                parent=node,
                last_access=self._clock,
            )
            node.children[leaf.key[:ps]] = leaf
            self._cached += len(leaf.pages)
            self._evictable += len(leaf.pages)
        return pos

    def evict(self, num_pages: int) -> list[int]:
        self._books_pages = None
        heap = [(n.last_access, n.node_id, n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[: self.page_size]]
            freed += leaf.pages
            self._cached -= len(leaf.pages)
            self._evictable -= len(leaf.pages)
            if self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed

    def _evictable_leaf(self, node: RadixNode) -> bool:
        return node is not self.root and not node.children and node.lock_ref == 0

    def _nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children[k] for k in sorted(node.children))
        return out

    # -- accounting -------------------------------------------------------------------------------

    @property
    def num_cached_pages(self) -> int:
        return self._cached

    @property
    def num_evictable_pages(self) -> int:
        return self._evictable

    def cached_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def locked_pages(self) -> list[int]:
        return [p for n in self._nodes() if n.lock_ref > 0 for p in n.pages]

    def books_pages(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Checked and listed again only after the tree changed (the books ask every iteration;
        the same tuples then also compare by identity)."""
        if self._books_pages is None:
            self.check_integrity()
            self._books_pages = tuple(self.cached_pages()), tuple(self.locked_pages())
        return self._books_pages

    def check_integrity(self) -> None:
        seen: set[int] = set()
        cached = evictable = 0
        for node in self._nodes():
            if node is self.root:
                continue
            if node.lock_ref < 0:
                raise InvariantError("pages-conserved", f"node {node.node_id} lock count < 0")
            if len(node.key) != len(node.pages) * self.page_size or not node.key:
                raise InvariantError("pages-conserved", f"node {node.node_id} key/pages size")
            parent = node.parent
            assert parent is not None
            if parent is not self.root and parent.lock_ref < node.lock_ref:
                raise InvariantError("pages-conserved", f"node {node.node_id} locked above parent")
            if parent.children.get(node.key[: self.page_size]) is not node:
                raise InvariantError("pages-conserved", f"node {node.node_id} misfiled")
            for page in node.pages:
                if page in seen:
                    raise InvariantError("pages-conserved", f"page {page} cached twice")
                seen.add(page)
            cached += len(node.pages)
            evictable += len(node.pages) if node.lock_ref == 0 else 0
        if cached != self._cached or evictable != self._evictable:
            raise InvariantError(
                "pages-conserved",
                f"counted {cached} cached/{evictable} evictable pages, "
                f"books say {self._cached}/{self._evictable}",
            )

"""The paged allocator and the radix prefix cache, on their own."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapcheck.core.errors import InvariantError
from overlapcheck.reference.cache.allocator import PageAllocator
from overlapcheck.reference.cache.base import CacheHandle
from overlapcheck.reference.cache.radix import RadixCache
from overlapcheck.reference.cache.snapshots import PageSnapshots


def cells(pages: list[int], page_size: int) -> list[int]:
    return [p * page_size + i for p in pages for i in range(page_size)]


def test_allocator_hands_out_lowest_first_and_catches_double_free() -> None:
    alloc = PageAllocator(4)
    assert [alloc.allocate() for _ in range(3)] == [0, 1, 2]
    alloc.free([1])
    assert alloc.allocate() == 1
    with pytest.raises(InvariantError, match="page 3 freed twice"):
        alloc.free([3])


def test_radix_match_insert_split_and_lock() -> None:
    tree = RadixCache(page_size=2)
    assert tree.insert((1, 2, 3, 4, 5, 6), cells([7, 8, 9], 2)) == 0
    assert tree.num_cached_pages == 3 and tree.num_evictable_pages == 3
    match = tree.match((1, 2, 3, 4, 9, 9, 9))  # diverges inside the second edge page: splits
    assert match.length == 4 and match.cells == cells([7, 8], 2)
    tree.lock(match.handle)
    assert tree.num_evictable_pages == 1
    tree.check_integrity()
    # A duplicate insert keeps the tree's pages and reports the prefix that was there.
    assert tree.insert((1, 2, 3, 4, 11, 12), cells([7, 8, 3], 2)) == 4
    assert tree.num_cached_pages == 4
    assert sorted(tree.evict(10)) == [3, 9]  # only unlocked leaves go
    tree.unlock(match.handle)
    assert sorted(tree.evict(10)) == [7, 8]
    assert tree.num_cached_pages == 0
    tree.check_integrity()


def test_radix_evicts_least_recently_used_leaf_first() -> None:
    tree = RadixCache(page_size=1)
    tree.insert((1, 2), [10, 11])
    tree.insert((5, 6), [20, 21])
    tree.match((1, 2))  # touch the first
    assert tree.evict(1) == [20, 21]


def test_radix_only_caches_whole_pages_and_never_matches_partial_ones() -> None:
    tree = RadixCache(page_size=4)
    tree.insert((1, 2, 3, 4, 5, 6), cells([0], 4) + [4, 5])
    assert tree.num_cached_pages == 1
    assert tree.match((1, 2, 3, 4, 5, 6)).length == 4
    assert tree.match((1, 2, 3)).length == 0


def test_radix_integrity_check_really_checks() -> None:
    tree = RadixCache(page_size=1)
    tree.insert((1, 2, 3), [4, 5, 6])
    node = next(iter(tree.root.children.values()))
    node.pages[1] = 4  # the same page twice
    with pytest.raises(InvariantError, match="page 4 cached twice"):
        tree.check_integrity()
    node.pages[1] = 5
    node.lock_ref = -1
    with pytest.raises(InvariantError, match="lock count < 0"):
        tree.check_integrity()
    node.lock_ref = 0
    tree._evictable += 1  # books that disagree with the tree
    with pytest.raises(InvariantError, match="books say"):
        tree.check_integrity()


def test_unlock_of_an_unlocked_node_is_an_error() -> None:
    tree = RadixCache(page_size=1)
    tree.insert((1,), [0])
    with pytest.raises(InvariantError, match="unlock"):
        tree.unlock(tree.match((1,)).handle)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_books_snapshots_are_what_the_allocator_and_the_tree_hold_after_any_change(
    data: st.DataObject,
) -> None:
    """`free_snapshot` and `books_pages` are kept between calls: after every kind of change
    (allocate, free, insert, a match that splits, lock, unlock, evict) they are taken again."""
    page_size = data.draw(st.sampled_from((1, 2)))
    alloc, tree = PageAllocator(24), RadixCache(page_size)
    handles: list[CacheHandle | None] = []
    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=8)
    kept: list[tuple[Sequence[int], tuple[int, ...]]] = []  # each snapshot, and a copy
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(("insert", "match", "unlock", "evict", "alloc", "free")))
        if op == "insert":
            seq = tuple(data.draw(tokens))
            usable = len(seq) // page_size * page_size
            pages = [alloc.allocate() for _ in range(min(usable // page_size, alloc.num_free))]
            usable = len(pages) * page_size
            already = tree.insert(seq[:usable], cells(pages, page_size))
            alloc.free(pages[: already // page_size])  # duplicates of what was cached
        elif op == "match":
            handle = tree.match(tuple(data.draw(tokens))).handle
            tree.lock(handle)
            handles.append(handle)
        elif op == "unlock" and handles:
            tree.unlock(handles.pop(data.draw(st.integers(0, len(handles) - 1))))
        elif op == "evict":
            alloc.free(tree.evict(data.draw(st.integers(1, 4))))
        elif op == "alloc" and alloc.num_free:
            alloc.allocate()
        elif op == "free":
            taken = sorted(set(range(24)) - set(alloc.free_pages()) - set(tree.cached_pages()))
            alloc.free(taken[: data.draw(st.integers(0, 2))])
        last = alloc._snapshots.last
        snapshot = alloc.free_snapshot()
        assert tuple(snapshot) == tuple(alloc.free_pages())
        made_from = alloc.snapshot_from  # None, or the last snapshot (itself if unchanged)
        assert made_from is None or made_from is last
        if made_from is not None:  # what `DerivedBooks.free_from` promises
            assert tuple(snapshot[: len(made_from)]) == tuple(made_from[: len(snapshot)])
        kept.append((snapshot, tuple(snapshot)))
        assert tree.books_pages() == (tuple(tree.cached_pages()), tuple(tree.locked_pages()))
    # An earlier snapshot never changes as the free list does (they share storage).
    assert all(tuple(snapshot) == copy for snapshot, copy in kept)


def test_the_tree_is_checked_again_after_a_split() -> None:
    """A match that splits an edge changes the tree's structure (not its page lists): the
    books' next `books_pages` checks its integrity again."""
    tree = RadixCache(page_size=1)
    tree.insert((1, 2, 3), [4, 5, 6])
    tree.books_pages()
    tree.match((1, 2, 9))  # splits the edge after (1, 2)
    upper = next(iter(tree.root.children.values()))
    assert upper.key == (1, 2)
    upper.lock_ref = -1
    with pytest.raises(InvariantError, match="lock count < 0"):
        tree.books_pages()


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_page_snapshots_stay_what_the_list_was_while_it_grows_shrinks_and_is_replaced(
    data: st.DataObject,
) -> None:
    """`PageSnapshots` share one array between snapshots: each is the list as it was when
    taken, however the list changes afterwards (appends past the array's room, pops, a reset
    and a new list), says truly what it was made from, and cannot be written through."""
    # a request's pages (appends), a free list (pops), or a list that does both in turn
    mode = data.draw(st.sampled_from(("grows", "shrinks", "both")))
    pages = list(range(40, 0, -1))
    snaps = PageSnapshots()
    kept: list[tuple[Sequence[int], tuple[int, ...]]] = []
    for _ in range(data.draw(st.integers(1, 40))):
        change = data.draw(st.sampled_from(("same", "change", "reset")))
        if change == "reset":
            pages = data.draw(st.lists(st.integers(0, 99), max_size=40))
            snaps.reset()
        grows = mode == "grows" or (mode == "both" and data.draw(st.booleans()))
        if change == "change" and grows:
            pages += data.draw(st.lists(st.integers(0, 99), min_size=1, max_size=20))
        elif change == "change":
            del pages[len(pages) - data.draw(st.integers(0, len(pages))) :]
        last = snaps.last
        snapshot, made_from = (snaps.after_appends if grows else snaps.after_pops)(pages)
        assert tuple(snapshot) == tuple(pages)
        assert made_from is None or made_from is last
        if change == "same" and last is not None:
            assert snapshot is last is made_from
        kept.append((snapshot, tuple(snapshot)))
        with pytest.raises(TypeError):
            snapshot[0:0] = b""  # type: ignore[index]
    assert all(tuple(snapshot) == copy for snapshot, copy in kept)

"""Queue policies: the order in which the prefill manager offers pending requests for admission.

The pending list stays in arrival order; before each prefill batch the policy returns the order of
this pass, and admission walks it with the usual rule: when the request at the head of that order
does not fit, nobody behind it is admitted in this pass. A policy only reads: it never changes a
request or the cache (lookups go through the cache's side-effect-free `peek`).

Every sort is stable, so ties keep arrival order, and nothing depends on set iteration or `id()`.
`random` draws from the policy's own `random.Random(config.seed)`.

`lpm`, `dfs-weight`, `fcfs`, `lof` and the in-batch prefix check give SGLang's `SchedulePolicy`
order on the same queue and tree (`tests/test_sglang_policy.py` compares them with SGLang 0.5.23's
own code): a request's cache match is that of its whole prompt, the ranking key of `lpm` caps it
at the prompt length minus one, sibling subtrees of equal weight keep the tree's order, and the
deprioritised requests keep arrival order among themselves. docs/policies.md lists what differs
on purpose.

Cache-aware policies (`lpm`, `dfs-weight`, `hrrn`, `lpm-aging`) need the radix tree; with the naive
cache there is nothing to match against and they run as `fcfs` (as SGLang does with its cache off).
`lpm`, `hrrn` and `lpm-aging` also act as `fcfs` when more than `lpm_fallback_queue_len` requests
wait (matching every waiting request each pass costs too much). `dfs-weight` never falls back.

Time waited is counted in scheduling passes (`Scheduler.step_no - Req.arrival_step`), not in host
seconds: on the real engine the host clock is the wall clock, and an order that depended on it would
not replay. One pass prefills at most `max_extend_tokens`, which is what converts `hrrn`'s token
estimate into passes.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from overlapcheck.core.config import POLICIES, ConfigError, PolicyKind, SchedulerConfig
from overlapcheck.reference.cache.base import PrefixCache
from overlapcheck.reference.cache.prompt_tree import PromptTree
from overlapcheck.reference.cache.radix import RadixCache, RadixNode
from overlapcheck.reference.req import Req

__all__ = ["CACHE_AWARE", "POLICIES", "REGISTRY", "QueuePolicy", "make_policy", "register"]


def ranked_match(req: Req, matched: int) -> int:
    """The cached tokens a ranking counts: the whole prompt's match, at most the prompt length minus
    one (the last position is always computed; SGLang's `num_matched_prefix_tokens`)."""
    return min(matched, req.prompt_len - 1)


def waited(req: Req, step: int) -> int:
    return step - req.arrival_step


class QueuePolicy(ABC):
    name: PolicyKind

    @abstractmethod
    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        """`queue` (arrival order) in the order to offer for admission at pass `step`."""


class Fcfs(QueuePolicy):
    name = "fcfs"

    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        return list(queue)


class LongestOutputFirst(QueuePolicy):
    name = "lof"

    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        # The clamped bound, as SGLang sorts by `max_new_tokens` after clamping it on arrival.
        return sorted(queue, key=lambda r: -r.max_output)


class RandomOrder(QueuePolicy):
    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        out = list(queue)
        self.rng.shuffle(out)
        return out


class CacheAware(QueuePolicy):
    """Shared by `lpm`, `hrrn`, `lpm-aging`: the fcfs fallback, cache matches, and in-batch
    prefix deprioritisation; subclasses give the sort key."""

    def __init__(self, config: SchedulerConfig, prefix: PrefixCache) -> None:
        self.config = config
        self.prefix = prefix

    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        if len(queue) > self.config.lpm_fallback_queue_len:
            return list(queue)
        matches = [self.prefix.peek(r.prompt) for r in queue]
        late = self.deprioritised(queue, matches)
        # The deprioritised go last, among themselves in arrival order (as SGLang's `lpm`).
        keys = [
            (True, 0) if d else (False, self.key(r, ranked_match(r, m), step))
            for r, m, d in zip(queue, matches, late, strict=True)
        ]
        ranked = sorted(range(len(queue)), key=keys.__getitem__)
        return [queue[i] for i in ranked]

    @abstractmethod
    def key(self, req: Req, matched: int, step: int) -> Fraction | int:
        """Smaller goes first."""

    def deprioritised(self, queue: Sequence[Req], matches: Sequence[int]) -> list[bool]:
        """Requests that wait for this round because an earlier waiter will cache their prefix.

        A request whose cached match (of the whole prompt, not capped) is short and whose prompt
        shares a long prefix with the prompt of a request considered before it (arrival order)
        goes last: the first computes the shared prefix and caches it, the others reuse it in a
        later round instead of computing it side by side.
        """
        cfg = self.config
        tree = PromptTree()
        out = []
        for req, matched in zip(queue, matches, strict=True):
            late = False
            if matched <= cfg.in_batch_check_threshold:
                late = tree.shared(req.prompt) >= cfg.in_batch_deprioritize_threshold
                if not late:
                    tree.insert(req.prompt)
            out.append(late)
        return out


class LongestPrefixMatch(CacheAware):
    name = "lpm"

    def key(self, req: Req, matched: int, step: int) -> int:
        return -matched


class LpmAging(CacheAware):
    """`lpm` plus `aging_tokens_per_pass` per pass waited: a later arrival can rank above an earlier
    one only by a match longer by more than the aging it lacks, so a cache miss is overtaken only by
    requests that arrived within (longest match / aging) passes after it."""

    name = "lpm-aging"

    def key(self, req: Req, matched: int, step: int) -> int:
        return -(matched + self.config.aging_tokens_per_pass * waited(req, step))


class Hrrn(CacheAware):
    """Highest response ratio next: (waited + estimated prefill) / estimated prefill, both in
    passes; the estimate is the uncached prompt tokens over the per-pass budget. Exact fractions,
    so equal ratios are real ties and keep arrival order."""

    name = "hrrn"

    def key(self, req: Req, matched: int, step: int) -> Fraction:
        uncached = req.prompt_len - matched  # >= 1: the last position is never matched
        estimate = Fraction(uncached, self.config.max_extend_tokens)
        return -(waited(req, step) + estimate) / estimate


class DfsWeight(QueuePolicy):
    """Walk the radix tree depth-first from the root. At each node: its children by descending
    weight (waiting requests whose match of the whole prompt ends at or below them; ties in the
    tree's order of the children, as SGLang's), then the requests whose match ends at the node
    itself. A match that ends inside an edge sits where `match` would split that edge: above the
    child, below its parent."""

    name = "dfs-weight"

    def __init__(self, tree: RadixCache) -> None:
        self.tree = tree

    def order(self, queue: Sequence[Req], step: int) -> list[Req]:
        weight: dict[int, int] = {}  # node id -> waiting requests at or below (or inside its edge)
        own: dict[int, list[int]] = {}  # node id -> requests whose match ends at the node
        inside: dict[int, list[tuple[int, int]]] = {}  # node id -> (edge tokens covered, index)
        for i, req in enumerate(queue):
            node, covered = self.tree.peek_position(req.prompt)
            if covered == len(node.key):
                own.setdefault(node.node_id, []).append(i)
            else:
                inside.setdefault(node.node_id, []).append((-covered, i))
            walk: RadixNode | None = node
            while walk is not None:
                weight[walk.node_id] = weight.get(walk.node_id, 0) + 1
                walk = walk.parent
        out: list[int] = []
        # Iterative, so that a long chain of nested prefixes cannot overflow the stack.
        stack: list[RadixNode | list[int]] = [self.tree.root]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                out += item
                continue
            nid = item.node_id
            stack.append([i for _, i in sorted(inside.get(nid, []))])  # deepest split first
            stack.append(own.get(nid, []))
            children = [c for c in item.children.values() if c.node_id in weight]
            children.sort(key=lambda c: -weight[c.node_id])  # stable: the tree's order
            stack.extend(reversed(children))
        return [queue[i] for i in out]


PolicyFactory = Callable[[SchedulerConfig, PrefixCache], QueuePolicy]


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    factory: PolicyFactory
    cache_aware: bool  # needs the radix tree; runs as fcfs on the naive cache


# The registry: a new policy is its class plus one `register` call.
REGISTRY: dict[str, PolicyEntry] = {}


def register(name: str, factory: PolicyFactory, cache_aware: bool = False) -> None:
    if name in REGISTRY:
        raise ValueError(f"policy {name!r} registered twice")
    REGISTRY[name] = PolicyEntry(factory, cache_aware)


def _tree(prefix: PrefixCache) -> RadixCache:
    assert isinstance(prefix, RadixCache)
    return prefix


register("fcfs", lambda config, prefix: Fcfs())
register("lof", lambda config, prefix: LongestOutputFirst())
register("random", lambda config, prefix: RandomOrder(config.seed))
register("lpm", lambda config, prefix: LongestPrefixMatch(config, _tree(prefix)), True)
register("dfs-weight", lambda config, prefix: DfsWeight(_tree(prefix)), True)
register("hrrn", lambda config, prefix: Hrrn(config, _tree(prefix)), True)
register("lpm-aging", lambda config, prefix: LpmAging(config, _tree(prefix)), True)

CACHE_AWARE: tuple[str, ...] = tuple(n for n, e in REGISTRY.items() if e.cache_aware)


def make_policy(config: SchedulerConfig, prefix: PrefixCache) -> QueuePolicy:
    entry = REGISTRY.get(config.policy)
    if entry is None:
        raise ConfigError(f"policy must be one of {', '.join(REGISTRY)}, got {config.policy!r}")
    if entry.cache_aware and not isinstance(prefix, RadixCache):
        return Fcfs()  # a cache-aware policy on the naive cache: nothing to match, arrival order
    return entry.factory(config, prefix)

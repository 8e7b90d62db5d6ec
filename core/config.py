"""The scheduler's one flat configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from overlapcheck.core.errors import UserError

CacheKind = Literal["radix", "naive"]
LoopKind = Literal["overlap", "normal"]
PolicyKind = Literal["fcfs", "lpm", "dfs-weight", "lof", "random", "hrrn", "lpm-aging"]
# How a scheduler that runs out of KV pages makes room (see docs/preemption.md): "none" (it never
# runs out: pages are reserved at admission), "recompute" (the victim gives its pages back and is
# re-prefilled later from prompt + the tokens it was sent), "swap" (its KV goes to the host on the
# transfer stream and comes back when it runs again).
PreemptionKind = Literal["none", "recompute", "swap"]
PREEMPTION_KINDS: tuple[PreemptionKind, ...] = ("none", "recompute", "swap")
# "reserve": admission takes every page a request may need; "on-demand": the prompt's pages at
# admission, one more as each position needs it (vLLM), so running requests can run out.
PageAllocKind = Literal["reserve", "on-demand"]
PAGE_ALLOC_KINDS: tuple[PageAllocKind, ...] = ("reserve", "on-demand")
# When the reference preempts: vLLM's "allocation-failure" (a running request cannot get its next
# page: the last-admitted one is preempted, its in-flight result kept) or SGLang's
# "retract-decode" (before a decode batch that does not fit: the last-admitted requests are
# retracted, their in-flight results dropped and those positions sampled again).
PreemptPolicy = Literal["allocation-failure", "retract-decode"]
PREEMPT_POLICIES: tuple[PreemptPolicy, ...] = ("allocation-failure", "retract-decode")
CACHE_KINDS: tuple[CacheKind, ...] = ("radix", "naive")
LOOP_KINDS: tuple[LoopKind, ...] = ("overlap", "normal")
# How the pending list is ordered before each prefill batch (see reference/policy.py).
POLICIES: tuple[PolicyKind, ...] = (
    "fcfs",
    "lpm",
    "dfs-weight",
    "lof",
    "random",
    "hrrn",
    "lpm-aging",
)


MAX_DRAFT_TOKENS = 8


class ConfigError(UserError, ValueError):
    """A configuration value that cannot work; the message names the field."""


# What one run can hold: the device buffers are numpy arrays of these sizes (token pool and page
# table: slots x max_seq_len; the KV pool: num_pages x page_size cells), allocated whole when the
# run starts. Past these a typo (1e8 for 1e3) would take the machine's memory, not start a run.
MAX_SEQ_LEN = 65_536
MAX_SLOTS = 4_096
MAX_ROW_CELLS = 1 << 22  # (num_slots + 1) x max_seq_len
MAX_KV_CELLS = 1 << 22  # num_pages x page_size
MAX_VOCAB = 1 << 20
MAX_RANKS = 64  # each rank is a whole scheduler and simulated device in one process


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Sizes of the device pools and the scheduler's switches."""

    num_slots: int = 8
    num_pages: int = 256
    page_size: int = 1
    max_extend_tokens: int = 256
    max_seq_len: int = 256
    vocab_size: int = 1024
    eos_token_id: int = 2
    cache: CacheKind = "radix"
    loop: LoopKind = "overlap"
    faults: frozenset[str] = field(default_factory=frozenset)
    seed: int = 0
    policy: PolicyKind = "fcfs"
    lpm_fallback_queue_len: int = 128  # lpm, hrrn, lpm-aging act as fcfs above this many waiting
    in_batch_check_threshold: int = 32  # cached match <= this: look for sharers (-1: never)
    in_batch_deprioritize_threshold: int = 32  # shares >= this with an earlier waiter: go last
    aging_tokens_per_pass: int = 4  # lpm-aging: key tokens a request gains per pass it waits
    preemption: PreemptionKind = "none"
    page_alloc: PageAllocKind = "reserve"
    preempt_policy: PreemptPolicy = "allocation-failure"
    # Speculative decoding: up to this many drafted tokens per sequence and decode step, verified
    # on the device (see core/speculative.py); 0 turns it off and changes nothing.
    draft_tokens: int = 0
    # CUDA graphs: the decode batch sizes captured (an engine pads a decode batch up to the
    # first that fits, with dummy rows, and replays that graph); empty: no graphs. Schedulers
    # without graphs ignore it (the reference has none).
    cuda_graph_bs: tuple[int, ...] = ()
    # Ranks (tensor or data parallel; core/ranks.py): the harness builds the scheduler once per
    # rank, each with its own `rank`; a scheduler may read both, and most ignore them.
    num_ranks: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        positive = ("num_slots", "num_pages", "page_size", "max_extend_tokens", "max_seq_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        highest = {"max_seq_len": MAX_SEQ_LEN, "num_slots": MAX_SLOTS, "vocab_size": MAX_VOCAB}
        for name, high in highest.items():
            if getattr(self, name) > high:
                raise ConfigError(f"{name} must be <= {high:,}, got {getattr(self, name):,}")
        if (self.num_slots + 1) * self.max_seq_len > MAX_ROW_CELLS:
            raise ConfigError(
                f"(num_slots + 1) x max_seq_len must be <= {MAX_ROW_CELLS:,} token-pool cells, "
                f"got ({self.num_slots} + 1) x {self.max_seq_len}"
            )
        if self.num_pages * self.page_size > MAX_KV_CELLS:
            raise ConfigError(
                f"num_pages x page_size must be <= {MAX_KV_CELLS:,} KV cells, "
                f"got {self.num_pages:,} x {self.page_size:,}"
            )
        if self.vocab_size < 4:
            raise ConfigError(f"vocab_size must be >= 4, got {self.vocab_size}")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ConfigError(f"eos_token_id {self.eos_token_id} is outside the vocabulary")
        if self.cache not in CACHE_KINDS:
            raise ConfigError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {self.cache!r}")
        if self.loop not in LOOP_KINDS:
            raise ConfigError(f"loop must be one of {', '.join(LOOP_KINDS)}, got {self.loop!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        kinds = (
            ("preemption", PREEMPTION_KINDS),
            ("page_alloc", PAGE_ALLOC_KINDS),
            ("preempt_policy", PREEMPT_POLICIES),
        )
        for name, allowed in kinds:
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.page_alloc == "on-demand" and self.preemption == "none":
            raise ConfigError(
                "page_alloc 'on-demand' needs preemption 'recompute' or 'swap': running requests "
                "can run out of pages, and without preemption nobody would give one back"
            )
        lowest = {
            "lpm_fallback_queue_len": 0,
            "in_batch_check_threshold": -1,  # -1 turns the in-batch check off
            "in_batch_deprioritize_threshold": 1,
            "aging_tokens_per_pass": 0,
            "draft_tokens": 0,
        }
        for name, low in lowest.items():
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be >= {low}, got {getattr(self, name)}")

        if not isinstance(self.cuda_graph_bs, tuple) or not all(
            isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_SLOTS
            for b in self.cuda_graph_bs
        ):
            raise ConfigError(
                f"cuda_graph_bs must be batch sizes from 1 to {MAX_SLOTS}, "
                f"got {self.cuda_graph_bs!r}"
            )
        if not 1 <= self.num_ranks <= MAX_RANKS:
            raise ConfigError(f"num_ranks must be in 1..{MAX_RANKS}, got {self.num_ranks}")
        if not 0 <= self.rank < self.num_ranks:
            raise ConfigError(f"rank must be in 0..{self.num_ranks - 1}, got {self.rank}")
        if self.draft_tokens > MAX_DRAFT_TOKENS:
            raise ConfigError(
                f"draft_tokens must be <= {MAX_DRAFT_TOKENS}, got {self.draft_tokens}"
            )

    @property
    def num_cells(self) -> int:
        """KV cells in the pool: one per token position a page can hold."""
        return self.num_pages * self.page_size

    @property
    def dummy_row(self) -> int:
        """The extra `token_pool` row that takes throw-away samples of non-final prefill chunks."""
        return self.num_slots

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

"""SGLang's own queue policies (`SchedulePolicy.calc_priority`) on a queue and a radix tree given
as token sequences: what `tests/test_sglang_policy.py` compares our `reference/policy.py` with.

The tree is SGLang's `RadixCache` without memory pools (`create_simulated`: the values are the
token ids), the requests SGLang's `Req`; the in-batch thresholds and the queue length above which
`lpm` falls back to `fcfs` are SGLang's module constants, set for the call and restored after.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from overlapcheck.adapters.base import Loaded
from overlapcheck.adapters.sglang.model import TOY_SERVER_ARGS, model_dir

POLICY = "sglang.srt.managers.schedule_policy"


@dataclass(frozen=True, slots=True)
class PolicyCase:
    """One ranking: a policy, a cache's contents, a waiting queue (arrival order)."""

    policy: str  # lpm, dfs-weight, fcfs, lof, random
    page_size: int
    cached: tuple[tuple[int, ...], ...]  # sequences inserted into the tree, in this order
    prompts: tuple[tuple[int, ...], ...]  # the queue; request i has uid i
    max_tokens: tuple[int, ...]
    check_threshold: int = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
    deprioritize_threshold: int = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
    fallback_len: int = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX


_published: list[Loaded] = []


def publish(loaded: Loaded, vocab_size: int = 1024) -> None:
    """Publish a server configuration once per process, as `run_scheduler_process` does before a
    scheduler exists: SGLang's policies read it (`get_disagg()`)."""
    if any(p is loaded for p in _published):
        return
    server_args = loaded["sglang.srt.server_args"].ServerArgs(
        model_path=str(model_dir(vocab_size, 0, 8192)),
        device="cpu",
        **TOY_SERVER_ARGS,
    )
    loaded["sglang.srt.runtime_context"].publish(server_args, role="scheduler")
    _published.append(loaded)


@contextlib.contextmanager
def _constants(module: Any, values: dict[str, int]) -> Iterator[None]:
    before = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)


def sglang_order(loaded: Loaded, case: PolicyCase) -> list[int]:
    """The uids of `case.prompts` in the order SGLang's `calc_priority` leaves the queue."""
    publish(loaded)
    module = loaded[POLICY]
    radix = loaded["sglang.srt.mem_cache.radix_cache"]
    insert_params = loaded["sglang.srt.mem_cache.base_prefix_cache"].InsertParams
    tree = radix.RadixCache.create_simulated(page_size=case.page_size)
    for tokens in case.cached:
        tree.insert(insert_params(key=radix.RadixKey(array("q", tokens)), value=None))
    sampling = loaded["sglang.srt.sampling.sampling_params"].SamplingParams
    req_class = loaded["sglang.srt.managers.schedule_batch"].Req
    queue = [
        req_class(str(uid), "", array("q", prompt), sampling(max_new_tokens=max_tokens))
        for uid, (prompt, max_tokens) in enumerate(zip(case.prompts, case.max_tokens, strict=True))
    ]
    constants = {
        "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD": case.check_threshold,
        "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD": case.deprioritize_threshold,
        "WAITING_QUEUE_PREFIX_MATCH_MAX": case.fallback_len,
    }
    with _constants(module, constants):
        policy = module.SchedulePolicy(case.policy, tree, False, False, False)
        policy.calc_priority(queue)
    return [int(r.rid) for r in queue]

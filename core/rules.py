"""Request validation: the reasons a request is rejected instead of queued."""

from __future__ import annotations

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import UserMsg


def max_output(config: SchedulerConfig, msg: UserMsg) -> int:
    """`max_tokens`, clamped so that prompt + output fits in `max_seq_len`."""
    return min(msg.sampling_params.max_tokens, config.max_seq_len - len(msg.input_ids))


def rejection(config: SchedulerConfig, msg: UserMsg, live: bool) -> str | None:
    """Why `msg` can never be served, or None. Checks run before any state changes.

    Reservation-shaped (the pages of prompt + max output against the whole pool) on purpose: it
    names the requests that cannot finish even alone on the device. It reads only the request and
    the sizes, so an on-demand scheduler honours it too; any request it accepts can be served by
    preempting the others.
    """
    prompt = msg.input_ids
    if live:
        return f"uid {msg.uid} is already live"
    if not prompt:
        return "empty prompt"
    bad = next((t for t in prompt if not 0 <= t < config.vocab_size), None)
    if bad is not None:
        return f"token id {bad} outside the vocabulary of {config.vocab_size}"
    if msg.sampling_params.max_tokens < 1:
        return f"max_tokens must be >= 1, got {msg.sampling_params.max_tokens}"
    if len(prompt) + 1 > config.max_seq_len:
        return (
            f"prompt of {len(prompt)} tokens leaves no room for output in max_seq_len "
            f"{config.max_seq_len}"
        )
    pages = config.pages_for(len(prompt) + max_output(config, msg))
    if pages > config.num_pages:
        return f"needs {pages} KV pages, the device has {config.num_pages}"
    return None

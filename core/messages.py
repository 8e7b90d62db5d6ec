"""Messages into and out of the scheduler (the tokenizer / detokenizer side of a server)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample a request's output. The simulator's toy model is greedy whatever these say."""

    max_tokens: int = 16
    ignore_eos: bool = False
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0


@dataclass(frozen=True, slots=True)
class UserMsg:
    """A new request: prompt token ids and sampling parameters."""

    uid: int
    input_ids: tuple[int, ...]
    sampling_params: SamplingParams = SamplingParams()


@dataclass(frozen=True, slots=True)
class AbortMsg:
    """Cancel a request in whatever state it is; an unknown uid is ignored."""

    uid: int


@dataclass(frozen=True, slots=True)
class TokenMsg:
    """One generated token (the detokenize message); `finished` is set on the request's last one."""

    uid: int
    token: int
    finished: bool


@dataclass(frozen=True, slots=True)
class RejectMsg:
    """A request the scheduler will never serve, with the reason."""

    uid: int
    reason: str


InMsg = UserMsg | AbortMsg
OutMsg = TokenMsg | RejectMsg

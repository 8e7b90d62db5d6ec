"""A request's expected output: what the `oracle` judges served tokens against. A backend's oracle
(the model run on the request alone) builds one per request instance."""

from __future__ import annotations

from typing import Protocol


class Expected(Protocol):
    """One request's expected output, from the backend's oracle run on the request alone: its
    tokens, and how a served token is judged against them."""

    tokens: list[int]

    def matches(self, position: int, token: int) -> bool:
        """Whether `token`, the request's output number `position` (from 0), is right."""
        ...


class ExactTokens:
    """An expected output judged token by token for equality."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def matches(self, position: int, token: int) -> bool:
        return position < len(self.tokens) and self.tokens[position] == token

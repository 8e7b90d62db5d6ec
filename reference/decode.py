"""The decode manager: running requests and the decode batch."""

from __future__ import annotations

from overlapcheck.reference.req import Req


class DecodeManager:
    def __init__(self) -> None:
        self.running: list[Req] = []

    def add(self, req: Req) -> None:
        self.running.append(req)

    def remove(self, req: Req) -> None:
        if req in self.running:
            self.running.remove(req)

    def batch(self) -> list[Req]:
        """Every running request that may launch another round, in admission order."""
        return [r for r in self.running if r.can_decode]

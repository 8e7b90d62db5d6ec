"""The front end around an upstream scheduler: what a serving engine's tokenizer and API server do
before and after it.

A front end answers the requests that `core.rules` rejects with a `RejectMsg` and never hands them
over (an engine may drop an over-long prompt silently, or wait forever for pages it can never
have), remembers which uids are live (a uid may come back once its request is over), and turns
the engine's outputs into `TokenMsg`s.
"""

from __future__ import annotations

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import RejectMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import MessageSink
from overlapcheck.core.rules import rejection


class FrontEnd:
    """Admission by the rules, live uids, and token messages out.

    front = FrontEnd(config, sink)
    if front.admit(msg):          # False: a RejectMsg went out
        engine.add_request(...)
    front.token(uid, 17, finished=False)
    """

    def __init__(self, config: SchedulerConfig, sink: MessageSink) -> None:
        self.config = config
        self.sink = sink
        self._live: set[int] = set()

    def admit(self, msg: UserMsg) -> bool:
        """True when the engine should get the request; otherwise the RejectMsg is sent."""
        why = rejection(self.config, msg, live=msg.uid in self._live)
        if why is not None:
            self.sink(RejectMsg(msg.uid, why))
            return False
        self._live.add(msg.uid)
        return True

    def abort(self, uid: int) -> bool:
        """Forget a uid the user aborted; True when it was live."""
        if uid in self._live:
            self._live.discard(uid)
            return True
        return False

    def reject(self, uid: int, reason: str) -> None:
        """The engine refused a request it was given, before any output (its front end answers
        the client with the error): a RejectMsg, and the request is forgotten."""
        self._live.discard(uid)
        self.sink(RejectMsg(uid, reason))

    def token(self, uid: int, token: int, finished: bool) -> None:
        """One output token of a live request (the last one with `finished`)."""
        if finished:
            self._live.discard(uid)
        self.sink(TokenMsg(uid, token, finished))

    def is_live(self, uid: int) -> bool:
        return uid in self._live

    @property
    def live_count(self) -> int:
        return len(self._live)

"""SGLang's transport, stood in for: what its tokenizer manager sends the scheduler over ZeroMQ,
and what the scheduler sends its detokenizer.

In: each admitted `UserMsg` as a `TokenizedGenerateReqInput` (prompt ids, `max_new_tokens` clamped
as the front end allows, EOS honoured unless `ignore_eos`, streamed), each `AbortMsg` as an
`AbortReq`. Out: each `BatchTokenIDOutput` as `TokenMsg`s, one per new output id of each request
(`output_ids` holds what was not sent before), `finished` on the last one of a request whose
`finished_reasons` entry is set.

An abort of a running request is lazy in SGLang (`req.to_finish = FINISH_ABORT()`): the batch
already scheduled still computes, and the abort's reply is the output whose finished reason is
the abort, carrying that batch's ids. That reply is the acknowledgment of the abort, not more
output: for a request the user aborted, it sends nothing. Any other output after the abort is
still sent, for `abort-silent` to judge. A request SGLang aborts itself before any output (its
limits: a prompt longer than its pool allows) is refused: a `RejectMsg` with its error, as its
front end answers the client.

Request ids are fixed-width (`req-000000000007-000000`): SGLang aborts every request whose id
*starts with* the aborted one (`req.rid.startswith(recv_req.rid)`), which is exact for its UUIDs,
and must stay exact for ours ("1" would abort "10"). The second part counts the uid's requests: a
uid sent again after its request finished is a new request with an id of its own, as a client's
is, so that an abort of the new one is not SGLang's for the old one (whose last batch may still
run), nor an output of the old one taken for the new one's (the front end has forgotten the old
id, as SGLang's tokenizer manager forgets a finished request's: its late outputs are dropped).
"""

from __future__ import annotations

from array import array
from typing import Any

from overlapcheck.adapters.base import FrontEnd, Loaded
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import AbortMsg, UserMsg
from overlapcheck.core.rules import max_output

IO = "sglang.srt.managers.io_struct"


def rid_of(uid: int, sent: int = 0) -> str:
    """The id of the uid's request number `sent` (from 0) of the run."""
    return f"req-{uid:012d}-{sent:06d}"


def uid_of(rid: str) -> int:
    return int(str(rid).split("-")[1])


class Transport:
    """Converts messages both ways for one run."""

    def __init__(self, loaded: Loaded, config: SchedulerConfig, front: FrontEnd) -> None:
        self.loaded = loaded
        self.config = config
        self.front = front
        self.aborted: set[int] = set()  # uids the user aborted while live
        self.answered: set[int] = set()  # uids that got output
        self.current: dict[int, str] = {}  # uid -> the id of its latest request

    def inbound(self, msgs: list[UserMsg | AbortMsg]) -> list[Any]:
        io = self.loaded[IO]
        out: list[Any] = []
        for msg in msgs:
            if isinstance(msg, AbortMsg):
                if self.front.abort(msg.uid):
                    self.aborted.add(msg.uid)
                    out.append(io.AbortReq(rid=self.current.get(msg.uid, rid_of(msg.uid))))
                continue
            if not self.front.admit(msg):
                continue
            # a uid is used again once its request ended: what was said of that one is not of
            # this one (its refusal must not read as output after an answer)
            self.aborted.discard(msg.uid)
            self.answered.discard(msg.uid)
            last = self.current.get(msg.uid)
            self.current[msg.uid] = rid_of(msg.uid, 0 if last is None else _sent(last) + 1)
            out.append(self._request(msg))
        return out

    def _request(self, msg: UserMsg) -> Any:
        io = self.loaded[IO]
        sp = msg.sampling_params
        params = self.loaded["sglang.srt.sampling.sampling_params"].SamplingParams(
            max_new_tokens=max_output(self.config, msg),
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else -1,
            ignore_eos=sp.ignore_eos,
        )
        params.normalize(None)
        return io.TokenizedGenerateReqInput(
            rid=self.current[msg.uid],
            input_text="",
            input_ids=array("q", msg.input_ids),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=params,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=True,
        )

    def outbound(self, output: Any) -> None:
        """One message the scheduler sends its detokenizer."""
        if not isinstance(output, self.loaded[IO].BatchTokenIDOutput):
            return
        for rid, ids, reason in zip(
            output.rids, output.output_ids, output.finished_reasons, strict=True
        ):
            uid = uid_of(rid)
            if self.current.get(uid) != rid:
                continue  # an earlier request of a uid sent again: forgotten by the front end
            if reason is not None and reason.get("type") == "abort" and uid in self.aborted:
                continue  # the abort's acknowledgment
            tokens = [int(t) for t in ids]
            if reason is not None and reason.get("type") == "abort" and uid not in self.answered:
                # SGLang refused it (its limits), before any output: the client gets the error
                # (the reply's ids are those of the one-token prompt it ran instead)
                if self.front.is_live(uid):
                    self.front.reject(uid, f"SGLang: {reason.get('message') or 'aborted'}")
                continue
            if reason is not None and not tokens and uid not in self.answered:
                # finished before any output: its clamp to the pool's headroom left it no token
                # (finding 2 of docs/sglang.md at its extreme); the client gets the finish as an
                # error, without which it would wait forever
                if self.front.is_live(uid):
                    self.front.reject(uid, f"SGLang: finished with no output ({reason})")
                continue
            if tokens:
                self.answered.add(uid)
            for i, token in enumerate(tokens):
                self.front.token(uid, token, reason is not None and i == len(tokens) - 1)


def _sent(rid: str) -> int:
    return int(rid.split("-")[2])


class Receiver:
    """Stands in for SGLang's `SchedulerRequestReceiver` (ZeroMQ from the tokenizer manager):
    `recv_requests` is where each iteration of its event loop begins."""

    def __init__(self, pull: Any) -> None:
        self.pull = pull  # () -> list of SGLang requests (the adapter's step boundary)

    def recv_requests(self, local_reqs: list[Any] | None = None) -> list[Any]:
        return [*self.pull(), *(local_reqs or [])]


class Sender:
    """Stands in for the ZeroMQ socket to the detokenizer (and the tokenizer manager)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def send_output(self, output: Any, *args: Any, **kwargs: Any) -> None:
        self.transport.outbound(output)

    def send_pyobj(self, output: Any, *args: Any, **kwargs: Any) -> None:
        self.transport.outbound(output)

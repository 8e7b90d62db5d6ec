"""mini-sglang's own `Scheduler` on a real CUDA device: real streams, PyTorch's real caching
allocator, and the stand-in engine's forward as real kernels (a toy model whose next token is a
polynomial hash of the context it reads through the page table from the KV pool).

    run = CudaRun(config, requests, deliveries, gates)
    outputs = run.run()          # tokens per uid, as mini-sglang sent them
    expected = reference(config, requests)

Gates force a race's order (`backends/gates.py`'s idea, on the device: `SpinGates`): an op is
named as the simulated CUDA names it, `(iteration, stream, "aten_op @file:line function",
ordinal)`, and a dispatch mode, seeing every aten call, runs the held op's spin on its stream just
before it and sets the flag on the opener's stream just after the opener. A gate whose opener is
ordered after the held op (the fix) waits out its bound, then the run goes on.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from overlapcheck.adapters.minisgl.adapter import (
    building,
    fast_compare_key,
    patched,
    upstream_config,
)
from overlapcheck.adapters.minisgl.checkout import load as load_checkout
from overlapcheck.adapters.minisgl.engine import EngineParts, construct, make_engine_class
from overlapcheck.backends.torchsim.dispatch import _program_file
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec

# The toy model: next token = FIRST + (sum_j ctx[j] * BASE**j mod PRIME) mod (vocab - FIRST), the
# same on the device (int64 kernels) and on the host (the reference). Never EOS (below FIRST).
BASE, PRIME, FIRST = 131, 2_147_483_647, 3


def context_hash(context: Sequence[int]) -> int:
    h, power = 0, 1
    for value in context:
        h = (h + value * power) % PRIME
        power = power * BASE % PRIME
    return h


def scripted(requests: Sequence[RequestSpec]) -> dict[int, int]:
    """The scenario's scripted continuations as (context hash -> next token): after its prompt,
    a request says its continuation's tokens (an EOS where the scenario puts one)."""
    out: dict[int, int] = {}
    for spec in requests:
        context = list(spec.prompt)
        for token in spec.continuation:
            out[context_hash(context)] = token
            context.append(token)
    return out


def next_token(context: Sequence[int], vocab: int, script: dict[int, int]) -> int:
    """The toy model on the host, for the reference."""
    h = context_hash(context)
    return script.get(h, FIRST + h % (vocab - FIRST))


def reference(config: SchedulerConfig, requests: Sequence[RequestSpec]) -> dict[int, list[int]]:
    """Each request's tokens, the model run on it alone: greedy, up to `max_tokens` or EOS."""
    script = scripted(requests)
    out: dict[int, list[int]] = {}
    for spec in requests:
        context, tokens = list(spec.prompt), []
        for _ in range(spec.max_tokens):
            tokens.append(next_token(context, config.vocab_size, script))
            context.append(tokens[-1])
            if tokens[-1] == config.eos_token_id and not spec.ignore_eos:
                break
        out[spec.uid] = tokens
    return out


@dataclass(frozen=True)
class Point:
    """An op as the simulated CUDA names it: its iteration, agent, label (`unnumbered`) and
    ordinal among the ops of that label on that agent in that iteration."""

    step: int
    agent: str
    label: str
    ordinal: int

    def to_json(self) -> list[Any]:
        return [self.step, self.agent, self.label, self.ordinal]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> Point:
        return cls(int(raw[0]), str(raw[1]), str(raw[2]), int(raw[3]))


@dataclass(frozen=True)
class CudaGate:
    """Hold `held` on its stream until `opener` ran (the race's order, forced)."""

    held: Point
    opener: Point
    race: str

    def to_json(self) -> dict[str, Any]:
        return {"held": self.held.to_json(), "opener": self.opener.to_json(), "race": self.race}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CudaGate:
        return cls(Point.from_json(raw["held"]), Point.from_json(raw["opener"]), str(raw["race"]))


def _label(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The simulated CUDA's name of an aten call: its op, or h2d/d2h for a copy across."""
    name = func.overloadpacket.__name__
    if name in ("_to_copy", "to", "copy_") and args and isinstance(args[0], torch.Tensor):
        if name == "copy_":
            src, dst_cuda = args[1], bool(args[0].is_cuda)
        else:
            src, dst_cuda = args[0], _target_is_cuda(args[1:], kwargs, args[0])
        if isinstance(src, torch.Tensor) and src.is_cuda != dst_cuda:
            name = "h2d" if dst_cuda else "d2h"
    return f"{name} @{_where()}"


def unnumbered(label: str) -> str:
    """A label without its line number (`index_put_ @scheduler.py _forward`): a gate planned on
    the buggy code finds its op in the fixed code, whose lines moved."""
    return _LINE.sub(" ", label)


_LINE = re.compile(r":\d+ ")


def _target_is_cuda(rest: Sequence[Any], kwargs: dict[str, Any], src: torch.Tensor) -> bool:
    """Where a `to`/`_to_copy` call puts its result: the device it names, else the source's."""
    for value in (kwargs.get("device"), *rest):
        if isinstance(value, torch.Tensor):
            return bool(value.is_cuda)
        if isinstance(value, torch.device | str):
            return torch.device(value).type == "cuda"
    return bool(src.is_cuda)


def _on_device(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a call touches device memory (the simulator's trace names those ops on a
    stream; host work on pinned memory is the host's)."""
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in (*args, *kwargs.values()))


def _where() -> str:
    """The program's innermost frame outside torch, overlapcheck's simulated CUDA and this file,
    as the simulated CUDA's labels name it (`file:line function`)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_filename != __file__:
            name = _program_file(code.co_filename)
            if name is not None:
                return f"{name}:{frame.f_lineno} {code.co_name}"
        frame = frame.f_back
    return "?"


class GateMode(TorchDispatchMode):
    """Counts the gated labels as they are issued and holds or opens the gates there."""

    def __init__(self, gates: Sequence[CudaGate], spins: Any, streams: dict[str, Any]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.gates, self.spins, self.streams = list(gates), spins, streams
        self.step = 0
        self.counts: dict[tuple[int, str, str], int] = {}
        self.labels = {g.held.label for g in gates} | {g.opener.label for g in gates}
        self.held: list[int] = []  # gates whose held op was issued
        self.opened: list[int] = []
        # the scheduler's own calls on the device, named, when asked (`CudaRun.named`)
        self.named: list[tuple[int, str, str]] | None = None
        self.hidden = 0  # inside the toy model's kernels: one opaque kernel in the simulator

    @contextlib.contextmanager
    def model_kernels(self) -> Iterator[None]:
        """The toy model's kernels, unnamed and ungated: the simulator runs the model as one
        kernel that no plan names, so its aten calls must not shift the scheduler's ordinals."""
        self.hidden += 1
        try:
            yield
        finally:
            self.hidden -= 1

    def _agent(self) -> str:
        current = torch.cuda.current_stream()
        return next((n for n, s in self.streams.items() if s == current), "other")

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if self.hidden:
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        label = unnumbered(_label(func, args, kwargs)) if self.labels or self.named else ""
        if self.named is not None and (
            label.startswith(("h2d", "d2h")) or _on_device(args, kwargs)
        ):
            self.named.append((self.step, self._agent(), label))
        point = None
        if label in self.labels:
            agent = self._agent()
            key = (self.step, agent, label)
            point = Point(self.step, agent, label, self.counts.get(key, 0))
            self.counts[key] = point.ordinal + 1
            for i, gate in enumerate(self.gates):
                if gate.held == point:
                    self.held.append(i)
                    self.spins.hold(i, agent)
        out = func(*args, **kwargs)
        if point is not None:
            for i, gate in enumerate(self.gates):
                if gate.opener == point:
                    self.opened.append(i)
                    self.spins.open(i, point.agent)
        return out


@dataclass
class CudaRun:
    """One run of mini-sglang's scheduler on the GPU, messages delivered at the recorded
    iterations (`deliveries`: (iteration, uid, "user" | "abort"))."""

    config: SchedulerConfig
    requests: Sequence[RequestSpec]
    deliveries: Sequence[tuple[int, int, str]]
    gates: Sequence[CudaGate] = ()
    bound: float = 0.2  # seconds a held op waits at most
    max_iterations: int = 400
    record_names: bool = False  # keep the scheduler's named device calls in `mode.named`
    # (file, repeat): the spins' record in that file's pages (`backends/gate_record.py`)
    gate_record: tuple[Path, int] | None = None
    outputs: dict[int, list[int]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)

    def run(
        self, driver: Callable[[int, dict[str, Any], float], Any] | None = None
    ) -> dict[int, list[int]]:
        """Run to the end; `driver(count, streams, bound)` makes the gates' driver (default: the
        Triton spin on a device flag, `backends/gpu/spin_gates.py`)."""
        up = load_checkout()
        with self._patches(up), torch.inference_mode():
            sched = self._make(up)
            streams = {"engine": sched.engine.stream, "scheduler": sched.stream}
            if driver is None:
                from overlapcheck.backends.gpu.spin_gates import SpinGates

                driver = functools.partial(SpinGates, record=self.gate_record)
            self.spins = driver(len(self.gates), streams, self.bound) if self.gates else None
            mode = GateMode(self.gates, self.spins, streams)
            mode.named = [] if self.record_names else None
            sched.engine.model_kernels = mode.model_kernels
            self.mode = mode
            self.step, data = 0, None
            with mode:
                while self.step < self.max_iterations:
                    mode.step = self.step
                    try:
                        data = sched.overlap_loop(data)
                    except _Done:
                        break
                    self.step += 1
            torch.cuda.synchronize()
        return self.outputs

    def gate_results(self) -> list[tuple[int, float]]:
        return self.spins.results() if self.spins is not None else []

    # -- construction ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _patches(self, up: Any) -> Iterator[None]:
        kernel: Any = __import__("minisgl.kernel", fromlist=["fast_compare_key"])
        engine = _engine_class(self.config, up, self.requests)
        with (
            building(up, 0, 1, engine, self.config.eos_token_id),
            patched(kernel, "fast_compare_key", fast_compare_key),
        ):
            yield

    def _make(self, up: Any) -> Any:
        cfg, run = self.config, self
        base = up["minisgl.scheduler"].Scheduler

        class OnCuda(base):  # type: ignore[misc, valid-type]
            def offline_receive_msg(self, blocking: bool = False) -> list[Any]:
                return run._receive(self, blocking)

            def offline_send_result(self, reply: list[Any]) -> None:
                for msg in getattr(reply, "data", reply):  # (as `adapter._send`)
                    run.outputs.setdefault(int(msg.uid), []).append(int(msg.next_token))
                    if msg.finished:
                        run.finished.add(int(msg.uid))

        # one rank, no CUDA graphs (the GPU engine captures none)
        config = upstream_config(up, cfg, 0, 1, ())
        return OnCuda(config)

    def _receive(self, sched: Any, blocking: bool) -> list[Any]:
        due = [d for d in self.deliveries if d[0] == self.step]
        self.deliveries = [d for d in self.deliveries if d[0] != self.step]
        if blocking and not due and not self.deliveries:
            raise _Done
        up = load_checkout()
        by_uid = {spec.uid: spec for spec in self.requests}
        msgs: list[Any] = []
        for _, uid, kind in due:
            if kind == "abort":
                msgs.append(up["minisgl.message"].AbortBackendMsg(uid=uid))
                continue
            spec = by_uid[uid]
            params = construct(  # (its parameters over mini-sglang's history: `construct`)
                up["minisgl.core"].SamplingParams,
                temperature=0.0,
                top_k=-1,
                top_p=1.0,
                ignore_eos=spec.ignore_eos,
                max_tokens=spec.max_tokens,
            )
            ids = torch.tensor(spec.prompt, dtype=torch.int32)
            msgs.append(
                up["minisgl.message"].UserMsg(uid=uid, input_ids=ids, sampling_params=params)
            )
        return msgs


class _Done(Exception):
    """Nothing more will come and the scheduler is idle."""


class _RealCuda:
    """The real device, as the stand-in engine's set-up asks for it (`EngineCuda`): the current
    one, and no contract names (the simulated CUDA's)."""

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def name(self, tensor: torch.Tensor, name: str) -> None:
        return None


def _engine_class(cfg: SchedulerConfig, up: Any, requests: Sequence[RequestSpec]) -> Any:
    """`Engine(config)` on the GPU: the simulated stand-in's set-up (its stream, KV pool, page
    table, attention metadata, sampler and dummy request) on the real device, and the toy model
    as real kernels for its forward."""
    stand_in = make_engine_class(EngineParts(cfg, _RealCuda(), None, up))

    class CudaEngine(stand_in):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            powers = [1]
            for _ in range(cfg.max_seq_len):
                powers.append(powers[-1] * BASE % PRIME)
            self.powers = torch.tensor(powers, dtype=torch.int64).to(self.device)
            script = scripted(requests)
            self.script_hashes = torch.tensor([-1, *script], dtype=torch.int64).to(self.device)
            self.script_tokens = torch.tensor([0, *script.values()], dtype=torch.int64).to(
                self.device
            )
            torch.cuda.synchronize(self.device)

        model_kernels: Callable[[], contextlib.AbstractContextManager[None]] = (
            contextlib.nullcontext
        )

        def forward_batch(self, batch: Any, args: Any) -> Any:
            assert torch.cuda.current_stream() == self.stream
            with self.model_kernels():
                tokens = self._model(batch)
            for req in batch.reqs:
                req.complete_one()
            next_tokens_cpu = tokens.to("cpu", non_blocking=True)
            copy_done = torch.cuda.Event()
            copy_done.record(self.stream)
            return up["minisgl.engine"].ForwardOutput(tokens, next_tokens_cpu, copy_done)

        def _model(self, batch: Any) -> torch.Tensor:
            tokens = torch.empty(batch.size, dtype=torch.int32, device=self.device)
            # the new tokens' KV first, then each request's context through its row
            self.kv[batch.out_loc.to(torch.int64)] = batch.input_ids
            offset = 0
            for i, req in enumerate(batch.reqs):
                n = req.device_len - req.cached_len
                row = self.page_table[req.table_idx, : req.device_len].to(torch.int64)
                context = self.kv[row]
                h = (context * self.powers[: req.device_len]).remainder(PRIME).sum()
                h = h.remainder(PRIME)
                hit = self.script_hashes == h  # a scripted context: its token (no host sync)
                token = torch.where(
                    hit.any(),
                    (self.script_tokens * hit).sum(),
                    h.remainder(cfg.vocab_size - FIRST) + FIRST,
                )
                tokens[i] = token.to(torch.int32)
                offset += n
            return tokens

    return CudaEngine

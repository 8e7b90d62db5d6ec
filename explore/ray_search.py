"""The search streams as Ray tasks (`explore --ray ADDRESS|local`), and the connection to a
cluster that a GPU replay's repeats use too (`replay/ray.py`).

Ray is an optional extra (`pip install 'overlapcheck[cluster]'`); nothing on the default path
imports this module. Every node needs overlapcheck (and a plugged-in scheduler's file, at the
same path) installed; `--db` should then name a directory on a filesystem all nodes share.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from overlapcheck.core.errors import UserError
from overlapcheck.explore.parallel import (
    QUIET,
    Listener,
    Message,
    Outcome,
    drive,
    run_stream,
    shared_database,
)
from overlapcheck.explore.search import SearchSpec


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'overlapcheck[cluster]'") from None
    return ray


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Ray's C++ core logs every failed attempt to join a cluster on file descriptor 2, a dozen
    lines before the exception; the one-line error raised after says what failed."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _reachable(address: str) -> None:
    """`host:port` and `ray://host:port` are tried with a plain TCP connect first: Ray itself
    retries an unreachable address for a long while before it gives up."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        if address == "auto":
            return
        raise UserError(f"--ray {address}: expected local, auto, HOST:PORT or ray://HOST:PORT")
    if not port.isdigit():
        raise UserError(f"--ray {address}: the port {port!r} is not a number")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise UserError(f"--ray {address}: cannot reach the Ray cluster ({reason})") from None


@contextmanager
def connected(address: str, cpus: int | None = None) -> Iterator[Any]:
    """Ray, connected: `local` starts a local instance with `cpus` CPUs (shut down afterwards);
    anything else joins that cluster. One-line UserErrors for every way this can fail."""
    ray = _ray()
    if address != "local":
        _reachable(address)
    try:
        if address == "local":
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        else:
            with _native_stderr_silenced():
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"--ray {address}: cannot start or join Ray ({first})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray_stream(spec: SearchSpec, index: int, channel: Any) -> Message:
    return run_stream(spec, index, channel.put)


class RayPool:
    """Streams as Ray tasks (one CPU each); a progress queue actor carries their messages."""

    def __init__(self, ray: Any, spec: SearchSpec, workers: int) -> None:
        from ray.util.queue import Empty, Queue

        self.ray = ray
        self.empty = Empty
        self.size = workers
        self.channel = Queue()
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_stream)
        self.refs = [task.remote(spec.stream(i, workers), i, self.channel) for i in range(workers)]
        self.index = {ref: i for i, ref in enumerate(self.refs)}
        self.pending = list(self.refs)
        self.cancelled: set[int] = set()

    def get(self, timeout: float) -> Message | None:
        try:
            if timeout:
                msg: Message = self.channel.get(block=True, timeout=timeout)
            else:
                msg = self.channel.get_nowait()
        except self.empty:
            return None
        return msg

    def ended(self) -> list[tuple[int, str | None]]:
        if not self.pending:
            return []
        ready, self.pending = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        out: list[tuple[int, str | None]] = []
        for ref in ready:
            i = self.index[ref]
            try:
                self.ray.get(ref)
                out.append((i, None))
            except Exception as err:
                if i in self.cancelled:
                    out.append((i, None))
                else:
                    line = (str(err).strip().splitlines() or [""])[0]
                    out.append((i, f"{type(err).__name__}: {line}"[:200]))
        return out

    def stop(self, keep: int | None) -> None:
        for ref in self.pending:
            i = self.index[ref]
            if i != keep and i not in self.cancelled:
                self.cancelled.add(i)
                self.ray.cancel(ref, force=True)

    def close(self) -> None:
        self.stop(keep=None)
        self.channel.shutdown()


def search_ray(
    spec: SearchSpec,
    address: str,
    workers: int | None,
    listener: Listener = QUIET,
) -> Outcome:
    """Search streams as Ray tasks: `workers` of them (None: one per CPU of the cluster)."""
    with connected(address, workers) as ray:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        listener.notice(f"ray: {n} search streams on {where(ray, address)}")
        with shared_database(spec) as shared:
            pool = RayPool(ray, shared, n)
            return drive(pool, shared, listener)


def where(ray: Any, address: str) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = int(ray.cluster_resources().get("CPU", 0))
    kind = "a local Ray instance" if address == "local" else f"the cluster at {address}"
    return f"{kind} ({len(nodes)} node(s), {cpus} CPUs)"

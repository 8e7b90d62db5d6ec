"""A GPU replay's repeats spread over a cluster's GPUs as Ray tasks (`replay --backend cuda --ray
ADDRESS`), one engine per GPU (or per CPU for `--backend cpu`).

Ray is an optional extra (`pip install 'overlapcheck[cluster]'`); nothing on the default path
imports this module.
"""

from __future__ import annotations

import socket
from typing import Any

from overlapcheck.core.errors import UserError
from overlapcheck.explore.ray_search import connected


def _replay_share(
    data: dict[str, Any],
    where: str,
    backend_name: str,
    repeats: int,
    preset: str | None,
    model: str | None,
) -> dict[str, Any]:
    """One engine (one GPU) runs `repeats` of the replay; runs inside a Ray task."""
    from overlapcheck.backends.gpu.backend import make_torch_backend
    from overlapcheck.formats.counterexample import Counterexample
    from overlapcheck.replay.gpu import replay_verdicts

    cex = Counterexample(data, where)
    backend = make_torch_backend(backend_name, model=model, preset=preset)
    plan, verdicts = replay_verdicts(cex, backend, repeats)
    return {
        "node": socket.gethostname(),
        "plan": plan.lines(),
        "verdicts": [v.to_json() for v in verdicts],
    }


def split(total: int, parts: int) -> list[int]:
    """`total` repeats over `parts` engines, as even as can be (no empty share)."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def replay_shares(
    data: dict[str, Any],
    where: str,
    backend_name: str,
    repeat: int,
    address: str,
    preset: str | None = None,
    model: str | None = None,
    engines: int | None = None,
) -> list[dict[str, Any]]:
    """Run a device replay's repeats as Ray tasks, one engine per GPU (`cuda`) or per CPU
    (`cpu`); `engines` caps how many. Returns each task's plan and verdicts, in task order."""
    with connected(address, engines) as ray:
        resources = ray.cluster_resources()
        if backend_name == "cuda":
            have = int(resources.get("GPU", 0))
            if have == 0:
                raise UserError(f"--ray {address}: the cluster has no GPUs for --backend cuda")
            task = ray.remote(num_gpus=1, max_retries=0)(_replay_share)
        else:
            have = max(1, int(resources.get("CPU", 1)))
            task = ray.remote(num_cpus=1, max_retries=0)(_replay_share)
        shares = split(repeat, min(have, engines or have))
        refs = [task.remote(data, where, backend_name, n, preset, model) for n in shares]
        try:
            results: list[dict[str, Any]] = ray.get(refs)
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"--ray {address}: a replay task failed ({first})") from None
        return results

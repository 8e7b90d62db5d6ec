"""The KV connector's stand-in: a consumer connector (P/D disaggregation's decode side), whose
scheduler half vLLM's own scheduler calls through its connector API.

Requests with an even uid were prefilled remotely: the connector offers the KV of their prompt's
full blocks before the last token (the last one is computed locally so that the next token can be
sampled) as an asynchronous load, once per request. vLLM allocates blocks for it, parks the
request in `WAITING_FOR_REMOTE_KVS`, and hands the load to the worker in the step's connector
metadata; the worker (worker.py) writes the prompt's tokens (our toy KV) into those blocks on its
transfer stream and reports the load finished once it has landed.

vLLM builds the connector by name from this module (`kv_connector_module_path`), so the class is
made on first use from the vLLM that the adapter imported (this module imports no vLLM itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from overlapcheck.adapters.vllm.configs import CONNECTOR_NAME


@dataclass(frozen=True, slots=True)
class PlannedLoad:
    """External KV for positions `start..start+len(tokens)` of a request, into `block_ids`."""

    req_id: str
    block_ids: tuple[int, ...]
    start: int
    tokens: tuple[int, ...]

    def cells(self, block_size: int) -> np.ndarray:
        positions = np.arange(self.start, self.start + len(self.tokens))
        blocks = np.asarray(self.block_ids, dtype=np.int64)
        return blocks[positions // block_size] * block_size + positions % block_size


def remote(req_id: str) -> bool:
    """Whether a request was prefilled remotely: its uid (`uid-n`) is even."""
    return int(req_id.split("-", 1)[0]) % 2 == 0


@cache
def connector_class() -> type:
    """The connector class, subclassing the imported vLLM's `KVConnectorBase_V1`."""
    base_module = __import__(
        "vllm.distributed.kv_transfer.kv_connector.v1.base",
        fromlist=["KVConnectorBase_V1", "KVConnectorMetadata"],
    )
    base: Any = base_module.KVConnectorBase_V1
    metadata: Any = base_module.KVConnectorMetadata

    class Metadata(metadata):  # type: ignore[misc]
        def __init__(self, loads: list[PlannedLoad]) -> None:
            self.loads = loads

    class OverlapcheckConnector(base):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            self.block_size = int(vllm_config.cache_config.block_size)
            self.offered: set[str] = set()
            self.planned: list[PlannedLoad] = []

        # -- scheduler side ------------------------------------------------------------------

        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int, bool]:
            rid = request.request_id
            if rid in self.offered or not remote(rid):
                return 0, False
            end = (len(request.prompt_token_ids) - 1) // self.block_size * self.block_size
            n = end - num_computed_tokens
            return (n, True) if n > 0 else (0, False)

        def update_state_after_alloc(
            self, request: Any, blocks: Any, num_external_tokens: int
        ) -> None:
            if num_external_tokens <= 0:
                return
            rid = request.request_id
            self.offered.add(rid)
            prompt = request.prompt_token_ids
            end = (len(prompt) - 1) // self.block_size * self.block_size
            start = end - num_external_tokens
            ids = tuple(int(b) for b in blocks.get_block_ids()[0])
            self.planned.append(PlannedLoad(rid, ids, start, tuple(prompt[start:end])))

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            loads, self.planned = self.planned, []
            return Metadata(loads)

        def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
            return False, None

        # -- worker side: the stand-in worker runs the loads (worker.py) ---------------------

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            return None

        def wait_for_layer_load(self, layer_name: str) -> None:
            return None

        def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
            return None

        def wait_for_save(self) -> None:
            return None

    OverlapcheckConnector.__name__ = CONNECTOR_NAME
    OverlapcheckConnector.__qualname__ = CONNECTOR_NAME
    return OverlapcheckConnector


def __getattr__(name: str) -> Any:
    """`OverlapcheckConnector`, looked up by vLLM's connector factory."""
    if name == CONNECTOR_NAME:
        return connector_class()
    raise AttributeError(name)

"""Our `SchedulerConfig` mapped onto vLLM's config objects, built as vLLM's own tests build them.

| ours | vLLM |
| --- | --- |
| `num_pages` | `num_gpu_blocks` = pages + 1: block 0 is the block pool's null block |
| `page_size` | `block_size` |
| `num_slots` | `max_num_seqs` (at most `max_extend_tokens`: vLLM demands a token per sequence) |
| `max_extend_tokens` | `max_num_batched_tokens` (at least 1 + drafts: see `build`) |
| `max_seq_len` | `max_model_len`, at most what the pool holds (vLLM refuses to start otherwise) |
| `cache` | `enable_prefix_caching` (`radix`: on) |
| `draft_tokens` | ngram speculative decoding with that many tokens (the variant may pin it) |
| the variant | async or sync, chunked prefill, the KV-connector mode |

The model is a one-layer llama's `config.json` in a folder of the temp directory, written once:
no weights and no tokenizer (`skip_tokenizer_init`). vLLM inspects its architecture once, in a
subprocess, and caches that. A `ModelConfig` costs about a second to build, so the objects are
built once per process for each distinct mapping and shared by the runs that use it (vLLM's
scheduler only reads them).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlapcheck.adapters.base import Loaded
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import UserError

# The name the KV-connector stand-in is registered under with vLLM's connector factory.
CONNECTOR_NAME = "OverlapcheckConnector"
CONNECTOR_MODULE = "overlapcheck.adapters.vllm.connector"
# The ngram drafter's n-gram lengths (vLLM's default, 5, is longer than our prompts).
LOOKUP_MIN, LOOKUP_MAX = 1, 3


@dataclass(frozen=True, slots=True)
class Variant:
    """Which vLLM set-up an adapter factory runs.

    `drafts`: None takes `SchedulerConfig.draft_tokens`; a number pins it. `connector`: a
    consumer KV connector whose loads of external KV run on a transfer stream (see connector.py).
    `pipeline`: vLLM's `pipeline_parallel_size`; the scheduler only sees what it changes for it
    (`max_concurrent_batches`: more steps in flight, and `AsyncScheduler`'s decode stagger).
    """

    asynchronous: bool = True
    drafts: int | None = None
    chunked_prefill: bool = True
    connector: bool = False
    pipeline: int = 1  # pipeline-parallel stages: the batch queue holds pipeline + 1 steps

    def draft_tokens(self, config: SchedulerConfig) -> int:
        return config.draft_tokens if self.drafts is None else self.drafts


@dataclass(frozen=True, slots=True)
class Built:
    """One run's vLLM configuration objects."""

    vllm_config: Any
    kv_cache_config: Any
    block_size: int
    num_blocks: int  # null block included
    max_model_len: int  # at most what the pool holds (see `build`): the runner's row width
    max_num_seqs: int
    drafts: int
    batch_queue: int  # EngineCore's batch queue size: vLLM's `max_concurrent_batches`


def build(loaded: Loaded, config: SchedulerConfig, variant: Variant) -> Built:
    """vLLM's configs for one run. Raises UserError when vLLM rejects the mapping."""
    drafts = variant.draft_tokens(config)
    # vLLM refuses to start with a KV cache that cannot hold one request of max_model_len
    # (`check_enough_kv_cache_memory`): the longest context it serves is what the pool holds.
    max_len = min(config.max_seq_len, config.num_pages * config.page_size)
    max_num_seqs = max(1, min(config.num_slots, config.max_extend_tokens))
    batched = config.max_extend_tokens
    if not variant.chunked_prefill:
        batched = max(batched, max_len)  # vLLM's rule without chunking
    if drafts:
        # vLLM accepts a budget below one token and its drafts (it warns), but then a waiting
        # request one token from its prompt's end is padded to 1 + k and never fits: it waits
        # forever. Deployments run far above that; so does the adapter (docs/vllm.md).
        batched = max(batched, 1 + drafts)
    key = (
        config.vocab_size,
        max_len,
        config.page_size,
        config.num_pages,
        config.cache == "radix",
        max_num_seqs,
        batched,
        drafts,
        variant.asynchronous,
        variant.chunked_prefill,
        variant.connector,
        variant.pipeline,
    )
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = _build(loaded, key)
    return built


# Built objects by mapping, for this process (there is one vLLM per process).
_BUILT: dict[tuple[Any, ...], Built] = {}


def _build(loaded: Loaded, key: tuple[Any, ...]) -> Built:
    (vocab, max_len, block_size, pages, caching, seqs, batched, drafts, asyn, chunked, conn, pp) = (
        key
    )
    cfg = loaded["vllm.config"]
    kv = loaded["vllm.v1.kv_cache_interface"]
    torch = __import__("torch")
    num_blocks = pages + 1
    try:
        model = cfg.ModelConfig(
            model=str(_model_folder(vocab)),
            skip_tokenizer_init=True,
            max_model_len=max_len,
            dtype="float32",
            seed=0,
        )
        scheduler = cfg.SchedulerConfig(
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            max_model_len=max_len,
            enable_chunked_prefill=chunked,
            async_scheduling=asyn,
            is_encoder_decoder=False,
            watermark=0.0,
        )
        cache_config = cfg.CacheConfig(block_size=block_size, enable_prefix_caching=caching)
        speculative = None
        if drafts:
            speculative = cfg.SpeculativeConfig(
                model="ngram",
                method="ngram",
                num_speculative_tokens=drafts,
                prompt_lookup_min=LOOKUP_MIN,
                prompt_lookup_max=LOOKUP_MAX,
            )
        transfer = None
        if conn:
            transfer = cfg.KVTransferConfig(
                kv_connector=CONNECTOR_NAME,
                kv_connector_module_path=CONNECTOR_MODULE,
                kv_role="kv_consumer",
            )
        vllm_config = cfg.VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=cache_config,
            device_config=cfg.DeviceConfig(device="cpu"),
            speculative_config=speculative,
            kv_transfer_config=transfer,
            parallel_config=cfg.ParallelConfig(pipeline_parallel_size=pp),
        )
    except (ValueError, TypeError, AssertionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"vLLM rejects the configuration: {first}") from None
    cache_config.num_gpu_blocks = num_blocks
    spec = kv.FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = kv.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[kv.KVCacheGroupSpec(["layer"], spec)],
    )
    loaded["vllm.v1.core.single_type_kv_cache_manager"].register_all_kvcache_specs(vllm_config)
    queue = vllm_config.max_concurrent_batches
    return Built(vllm_config, kv_cache_config, block_size, num_blocks, max_len, seqs, drafts, queue)


def _model_folder(vocab: int) -> Path:
    """A folder holding a one-layer llama's config.json (no weights), written once."""
    folder = Path(tempfile.gettempdir()) / f"overlapcheck-vllm-toy-llama-{vocab}"
    text = json.dumps(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 1,
            "vocab_size": vocab,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "torch_dtype": "float32",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        sort_keys=True,
    )
    file = folder / "config.json"
    if not file.is_file() or file.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"config.json.{os.getpid()}.tmp"
        partial.write_text(text)
        partial.replace(file)
    return folder

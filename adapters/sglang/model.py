"""The model SGLang is told it serves: a tiny local Llama-shaped `config.json` (no weights, no
tokenizer: `load_format="dummy"`, `skip_tokenizer_init=True`) whose architecture is the toy model's
(`toy.py`), in a folder made once per process and configuration."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from overlapcheck.adapters.sglang.toy import ARCH

CONFIG = {
    "architectures": [ARCH],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}


# On the simulated CUDA: one KV head of one element, so that a token's key is one cell of the KV
# pool's allocation (the trace's KV cells are token indices, as the checks read them).
ONE_CELL = {"hidden_size": 1, "intermediate_size": 1, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 1}  # fmt: skip


@functools.cache
def model_dir(vocab_size: int, eos: int, max_len: int, one_cell: bool = False) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="overlapcheck-sglang-model-"))
    config = dict(
        CONFIG,
        **(ONE_CELL if one_cell else {}),
        vocab_size=vocab_size,
        eos_token_id=eos,
        bos_token_id=eos,
        max_position_embeddings=max(max_len, 16),
    )
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


# ServerArgs for the toy model wherever SGLang is built here: no tokenizer, no weights, torch's
# attention and sampler, no CUDA graphs.
TOY_SERVER_ARGS: dict[str, object] = {
    "skip_tokenizer_init": True,
    "load_format": "dummy",
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
}

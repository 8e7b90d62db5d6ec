"""Model weights: presets with deterministic random weights, or a local Hugging Face checkpoint.

Weights are always a dict of Hugging Face parameter names to tensors, so the engine and the
`transformers` oracle load the very same tensors, and a random preset goes through the same
loading code as a checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from overlapcheck.core.errors import UserError

SUPPORTED = ("llama", "qwen2", "qwen3")

PRESETS: dict[str, dict[str, Any]] = {
    # CI: two layers, untied head; head_dim 128 so that CUDA compiles the same kernels as below.
    "tiny": dict(
        model_type="qwen3",
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        eos_token_id=2,
    ),
    # Qwen3-0.6B's shapes (~0.6B parameters, 0.44B without the tied embedding).
    "qwen3-0.6b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        eos_token_id=2,
    ),
}

# Random init: the final RMSNorm gives unit-RMS features, so a head of std LOGIT_STD / sqrt(hidden)
# gives logits of std ~LOGIT_STD: clear top-1 gaps, and greedy outputs that vary token to token
# (a tiny embedding keeps a tied head from just repeating the current token).
LOGIT_STD = 4.0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the engine needs from a `transformers` config."""

    model_type: str
    vocab_size: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    qk_norm: bool
    qkv_bias: bool
    tied: bool
    eos_token_id: int

    @classmethod
    def from_config(cls, cfg: PretrainedConfig) -> ModelSpec:
        if cfg.model_type not in SUPPORTED:
            raise UserError(
                f"model type {cfg.model_type!r} is not supported (use {', '.join(SUPPORTED)})"
            )
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise UserError(f"rope scaling {rope.get('rope_type')!r} is not supported")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        heads = cfg.num_attention_heads
        eos = cfg.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        return cls(
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            layers=cfg.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            eps=cfg.rms_norm_eps,
            rope_theta=float(theta),
            qk_norm=cfg.model_type == "qwen3",
            qkv_bias=cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            tied=bool(cfg.tie_word_embeddings),
            eos_token_id=int(eos if eos is not None else 2),
        )


def preset_config(name: str) -> PretrainedConfig:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    fields = dict(PRESETS[name])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Hugging Face names and shapes of every parameter, in a fixed order."""
    h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (spec.intermediate, h),
            p + "mlp.up_proj.weight": (spec.intermediate, h),
            p + "mlp.down_proj.weight": (h, spec.intermediate),
        }
        if spec.qkv_bias:
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                shapes[p + f"self_attn.{name}_proj.bias"] = (n,)
        if spec.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (spec.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (spec.head_dim,)
    shapes["model.norm.weight"] = (h,)
    if not spec.tied:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


@torch.no_grad()
def random_weights(
    spec: ModelSpec, seed: int, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Deterministic random weights (same seed, device and dtype: same tensors)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in param_shapes(spec).items():
        t = torch.empty(shape, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t.normal_(1.0, 0.1, generator=gen)  # not all ones, so a dropped weight shows
        elif name.endswith(".bias"):
            t.normal_(0.0, 0.1, generator=gen)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            t.normal_(0.0, LOGIT_STD / math.sqrt(spec.hidden), generator=gen)
        else:
            t.normal_(0.0, 1.0 / math.sqrt(shape[1]), generator=gen)
        out[name] = t.to(dtype)
    if spec.tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def load_checkpoint(path: str | Path) -> tuple[PretrainedConfig, dict[str, torch.Tensor]]:
    """A local checkpoint directory: `config.json` plus `*.safetensors` (no hub access)."""
    from safetensors.torch import load_file

    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{path}: not a checkpoint directory")
    if not (root / "config.json").is_file():
        raise UserError(f"{path}: no config.json")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise UserError(f"{path}: no *.safetensors weights")
    try:
        cfg = AutoConfig.from_pretrained(str(root), local_files_only=True)
    except (ValueError, OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: bad config.json: {str(err).splitlines()[0]}") from None
    spec = ModelSpec.from_config(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors |= load_file(str(f))
    if spec.tied:
        embed = tensors.get("model.embed_tokens.weight")
        if embed is not None:
            tensors.setdefault("lm_head.weight", embed)
    missing = [n for n in param_shapes(spec) if n not in tensors]
    if missing:
        raise UserError(f"{path}: {len(missing)} weights missing, e.g. {missing[0]}")
    bad = [n for n, s in param_shapes(spec).items() if tuple(tensors[n].shape) != s]
    if bad:
        raise UserError(
            f"{path}: weight {bad[0]} has shape {tuple(tensors[bad[0]].shape)}, "
            f"config says {param_shapes(spec)[bad[0]]}"
        )
    return cfg, tensors


def save_checkpoint(
    cfg: PretrainedConfig, tensors: dict[str, torch.Tensor], path: str | Path
) -> None:
    """Write a checkpoint directory that `load_checkpoint` (and `transformers`) can read."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(root))
    unique = {
        n: t.contiguous()
        for n, t in tensors.items()
        if not (n == "lm_head.weight" and cfg.tie_word_embeddings)
    }
    save_file(unique, str(root / "model.safetensors"))

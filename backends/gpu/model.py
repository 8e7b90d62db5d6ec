"""A compact Llama / Qwen2 / Qwen3-style decoder over a paged KV pool.

Embedding, RMSNorm, RoPE, grouped-query attention (optional q/k norm and qkv bias), SwiGLU MLP,
tied or untied head. The arithmetic follows `transformers`' modelling code step by step (float32
RMSNorm, cos/sin cast to the model dtype) so that float32 greedy tokens match it exactly.
Attention is delegated: FlashInfer on CUDA, a torch reference on CPU (`attention.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from overlapcheck.backends.gpu.weights import ModelSpec


class Attention(Protocol):
    """Paged attention for one batch: queries of the new tokens against the KV pool."""

    def run(
        self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """q: [tokens, heads, head_dim]; caches: [pages, page_size, kv_heads, head_dim]."""
        ...


@dataclass(slots=True)
class Layer:
    norm_in: torch.Tensor
    qkv: torch.Tensor  # q, k and v projections stacked: one matmul
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    norm_post: torch.Tensor
    gate_up: torch.Tensor  # gate and up stacked
    down: torch.Tensor


class DecoderModel:
    def __init__(
        self,
        spec: ModelSpec,
        tensors: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype

        def w(name: str) -> torch.Tensor:
            return tensors[name].to(device=device, dtype=dtype)

        self.embed = w("model.embed_tokens.weight")
        self.layers: list[Layer] = []
        for i in range(spec.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if spec.qkv_bias:
                bias = torch.cat([w(a + f"{n}_proj.bias") for n in "qkv"])
            self.layers.append(
                Layer(
                    norm_in=w(p + "input_layernorm.weight"),
                    qkv=torch.cat([w(a + f"{n}_proj.weight") for n in "qkv"]),
                    qkv_bias=bias,
                    q_norm=w(a + "q_norm.weight") if spec.qk_norm else None,
                    k_norm=w(a + "k_norm.weight") if spec.qk_norm else None,
                    o=w(a + "o_proj.weight"),
                    norm_post=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                    down=w(p + "mlp.down_proj.weight"),
                )
            )
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if spec.tied else w("lm_head.weight")
        d = spec.head_dim
        exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
        self.inv_freq = 1.0 / (spec.rope_theta**exponents)

    def kv_shape(self, num_pages: int, page_size: int) -> tuple[int, int, int, int]:
        """One layer's K (or V) pool, FlashInfer's NHD layout: cell = page * page_size + offset."""
        return (num_pages, page_size, self.spec.kv_heads, self.spec.head_dim)

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cells: torch.Tensor,
        last: torch.Tensor,
        attn: Attention,
        k_pool: list[torch.Tensor],
        v_pool: list[torch.Tensor],
    ) -> torch.Tensor:
        """Run the new tokens `ids` at positions `pos`, write their K/V into `cells` of the pool,
        and return float32 logits of the rows `last` (one per sequence)."""
        s = self.spec
        n_tok = ids.shape[0]
        x = self.embed[ids]
        cos, sin = self._rope(pos)
        q_end, k_end = s.heads * s.head_dim, (s.heads + s.kv_heads) * s.head_dim
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.norm_in, s.eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q = qkv[:, :q_end].view(n_tok, s.heads, s.head_dim)
            k = qkv[:, q_end:k_end].view(n_tok, s.kv_heads, s.head_dim)
            v = qkv[:, k_end:].view(n_tok, s.kv_heads, s.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = _rms_norm(q, layer.q_norm, s.eps), _rms_norm(k, layer.k_norm, s.eps)
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
            k_pool[i].view(-1, s.kv_heads, s.head_dim).index_copy_(0, cells, k)
            v_pool[i].view(-1, s.kv_heads, s.head_dim).index_copy_(0, cells, v.contiguous())
            o = attn.run(i, q.contiguous(), k_pool[i], v_pool[i])
            x = x + F.linear(o.reshape(n_tok, q_end), layer.o)
            h = _rms_norm(x, layer.norm_post, s.eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        x = _rms_norm(x[last], self.norm, s.eps)
        return F.linear(x, self.lm_head).float()

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

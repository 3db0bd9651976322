"""MHA checkpoints -> GQA and key-driven variants: ``convert(model, variant, kv_heads)``.

K and V heads are mean-pooled over contiguous groups of ``heads / kv_heads`` (Ainslie et al.,
2023), weights and biases alike; Q and the output projection are copied. With ``kv_heads ==
heads`` and ``variant="gqa"`` the converted model computes what the original did.

Adapters exist for timm's ViT ``Attention`` (fused ``qkv``); any other attention module is an
error that names it, so nothing is silently left unconverted.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphkit.attention.core import VARIANTS, GroupedQueryAttention
from graphkit.errors import GraphkitError


class ConvertError(GraphkitError):
    """A model, variant or head count that convert() cannot handle."""


def mean_pool_heads(weight: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Average contiguous groups of heads along dim 0: (heads * d, ...) -> (kv_heads * d, ...)."""
    d = weight.shape[0] // heads
    grouped = weight.reshape(kv_heads, heads // kv_heads, d, *weight.shape[1:])
    return grouped.mean(dim=1).reshape(kv_heads * d, *weight.shape[1:])


class ViTGroupedAttention(nn.Module):
    """timm ViT attention with ``kv_heads`` K/V heads: a fused ``qkv`` projection to
    (heads + 2 kv_heads) * head_dim, a :class:`GroupedQueryAttention` core and ``proj``."""

    def __init__(self, dim: int, heads: int, kv_heads: int, variant: str = "gqa", *, qkv_bias: bool = True,
                 proj_bias: bool = True, **variant_options: Any) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=qkv_bias)
        self.core = GroupedQueryAttention(heads, kv_heads, variant, **variant_options)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        y = self.core(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y.transpose(1, 2).reshape(b, n, -1))

    @classmethod
    def from_timm(cls, attn: nn.Module, kv_heads: int, variant: str, **variant_options: Any) -> ViTGroupedAttention:
        """Convert a timm ``Attention`` by mean-pooling its K/V heads."""
        heads, dim = attn.num_heads, attn.qkv.in_features
        new = cls(dim, heads, kv_heads, variant, qkv_bias=attn.qkv.bias is not None,
                  proj_bias=attn.proj.bias is not None, **variant_options).to(attn.qkv.weight.device, attn.qkv.weight.dtype)
        with torch.no_grad():
            for name in ("weight", "bias"):
                source = getattr(attn.qkv, name)
                if source is None:
                    continue
                q, k, v = source.chunk(3, dim=0)
                getattr(new.qkv, name).copy_(torch.cat([q, mean_pool_heads(k, heads, kv_heads), mean_pool_heads(v, heads, kv_heads)]))
            new.proj.load_state_dict(attn.proj.state_dict())
        return new


def _timm_adapter(path: str, module: nn.Module, kv_heads: int, variant: str, options: dict) -> nn.Module | None:
    if type(module).__name__ != "Attention" or not type(module).__module__.startswith("timm."):
        return None
    plain = all(isinstance(getattr(module, n, None), (nn.Identity, type(None))) for n in ("q_norm", "k_norm", "norm"))
    if not plain or getattr(module, "gate", None) is not None:
        raise ConvertError(f"module '{path}' (timm Attention) uses qk-norm, a scale norm or gating, which convert() does not handle yet")
    return ViTGroupedAttention.from_timm(module, kv_heads, variant, **options)


ADAPTERS = (_timm_adapter,)
_ATTENTION_NAMES = ("attention", "attn")


def convert(model: nn.Module, variant: str = "gqa", kv_heads: int | None = None, **variant_options: Any) -> nn.Module:
    """Replace every attention module of ``model`` (in place) by ``variant`` with ``kv_heads``
    K/V heads, mean-pooling K/V; returns the model. ``variant_options`` go to
    :class:`GroupedQueryAttention` (window, evolution, alpha, allow_empty, perturb_in_eval)."""
    if variant not in VARIANTS:
        raise ConvertError(f"unknown attention variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    replaced = 0
    for path, module in list(model.named_modules()):
        heads = getattr(module, "num_heads", None)
        if heads is None:
            if any(n in type(module).__name__.lower() for n in _ATTENTION_NAMES) and not isinstance(module, (GroupedQueryAttention, ViTGroupedAttention)):
                raise ConvertError(f"module '{path}' ({type(module).__module__}.{type(module).__name__}) is an attention graphkit cannot convert yet")
            continue
        kv = heads if kv_heads is None else kv_heads
        if kv < 1 or heads % kv:
            raise ConvertError(f"kv_heads {kv} does not divide the {heads} heads of module '{path}'")
        new = next((a(path, module, kv, variant, variant_options) for a in ADAPTERS), None)
        if new is None:
            raise ConvertError(f"module '{path}' ({type(module).__module__}.{type(module).__name__}) is an attention graphkit cannot convert yet")
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, new)
        replaced += 1
    if not replaced:
        raise ConvertError(f"{type(model).__name__} has no attention module graphkit knows how to convert")
    return model

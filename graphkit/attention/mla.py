"""Multi-head latent attention (MLA, DeepSeek-V2) by conversion: ``to_mla(model, kv_rank)``.

In MLA every head's keys and values are read from one shared latent per token,
``c = x W_down`` (``kv_rank`` numbers), ``K = c W_k_up`` and ``V = c W_v_up``, so a KV cache
holds ``kv_rank`` numbers per token and layer instead of MHA's ``2 heads head_dim``.

Conversion factors a layer's stacked K/V projections ``[W_k; W_v]`` (2 heads head_dim x dim)
by a truncated SVD, ``U_R S_R V_R^T``: ``W_down = V_R^T`` and ``[W_k_up; W_v_up] = U_R S_R``,
the best rank-R approximation of the pair in the Frobenius norm (Eckart-Young), as TransMLA and
MHA2MLA start from. The stacked matrix has rank at most ``dim``, so at ``kv_rank = dim`` the
converted layer computes exactly what the original did. The K/V biases stay on the up
projections: they add the same vector to every token and do not pass through the latent. Q and
the output projection are copied.

Handled: timm ViTs, Hugging Face GPT-2 and LLaMA-style models (LLaMA, Mistral, GQA or not);
the language models' converted attention caches the latent, not K and V. LLaMA's keys are
rotated per position (RoPE) after the projection, so the converted attention rebuilds K from the
cached latent and rotates it for every cached position each step: exact, with the cache at
``kv_rank`` numbers per token, but the up projection cannot be folded into the query (the
absorbed form DeepSeek uses at inference), which would need RoPE's dimensions kept out of the
latent (MHA2MLA's partial RoPE, TransMLA's decoupled key; not built). Cached positions are
taken to run up to the current token's (the ``position_ids`` the decoder layer passes), which a
full or a sliding-window cache both keep.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.attention.convert import (
    GPT2_ATTENTION,
    LLAMA_ATTENTION,
    TIMM_ATTENTION,
    GPT2AttentionCall,
    GPT2GroupedAttention,
    ViTGroupedAttention,
)
from graphkit.errors import GraphkitError
from graphkit.validation import is_count


class MLAError(GraphkitError):
    """A model or rank ``to_mla`` cannot convert."""


class LatentKV(nn.Module):
    """The part of MLA every converted attention shares: the down projection to the latent and
    the K and V up projections. ``attention_variant`` and ``attention_attrs`` are what the
    tracer records on the attention node."""

    attention_variant = "mla"

    def __init__(self, dim: int, width: int, kv_rank: int, bias: bool) -> None:
        super().__init__()
        self.kv_rank = kv_rank
        self.down = nn.Linear(dim, kv_rank, bias=False)
        self.k_up = nn.Linear(kv_rank, width, bias=bias)
        self.v_up = nn.Linear(kv_rank, width, bias=bias)

    @property
    def attention_attrs(self) -> dict[str, Any]:
        return {"kv_rank": self.kv_rank}

    def extra_repr(self) -> str:
        return f"kv_rank={self.kv_rank}"

    @classmethod
    def factor(
        cls, w_k: torch.Tensor, w_v: torch.Tensor, b_k: torch.Tensor | None, b_v: torch.Tensor | None, kv_rank: int
    ) -> LatentKV:
        """The rank-``kv_rank`` latent of K and V projections ``w_k``, ``w_v`` (out, in), by the
        truncated SVD of their stack (see the module docstring)."""
        width, dim = w_k.shape
        new = cls(dim, width, kv_rank, bias=b_k is not None).to(w_k.device, w_k.dtype)
        u, s, vh = torch.linalg.svd(torch.cat([w_k, w_v]).double(), full_matrices=False)
        up = (u[:, :kv_rank] * s[:kv_rank]).to(w_k.dtype)
        with torch.no_grad():
            new.down.weight.copy_(vh[:kv_rank].to(w_k.dtype))
            new.k_up.weight.copy_(up[:width])
            new.v_up.weight.copy_(up[width:])
            if b_k is not None:
                new.k_up.bias.copy_(b_k)
                new.v_up.bias.copy_(b_v)
        return new


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, positions, heads * d) -> (batch, heads, positions, d)."""
    b, n, width = x.shape
    return x.view(b, n, heads, width // heads).transpose(1, 2)


class ViTLatentAttention(nn.Module):
    """timm ViT attention as MLA: ``q``, the shared :class:`LatentKV`, SDPA and ``proj``."""

    def __init__(self, dim: int, heads: int, kv_rank: int, *, qkv_bias: bool = True, proj_bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = LatentKV(dim, dim, kv_rank, qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        c = self.kv.down(x)
        q, k, v = (_heads(t, self.heads) for t in (self.q(x), self.kv.k_up(c), self.kv.v_up(c)))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y.transpose(1, 2).flatten(2))

    @classmethod
    def from_timm(cls, attn: nn.Module, kv_rank: int) -> ViTLatentAttention:
        """Convert a timm ``Attention``: Q and ``proj`` copied, K/V factored through the latent."""
        dim = attn.qkv.in_features
        has_bias = attn.qkv.bias is not None
        new = cls(dim, attn.num_heads, kv_rank, qkv_bias=has_bias, proj_bias=attn.proj.bias is not None)
        new = new.to(attn.qkv.weight.device, attn.qkv.weight.dtype)
        w_q, w_k, w_v = attn.qkv.weight.detach().chunk(3)
        b_q, b_k, b_v = attn.qkv.bias.detach().chunk(3) if has_bias else (None, None, None)
        new.kv = LatentKV.factor(w_k, w_v, b_k, b_v, kv_rank)
        with torch.no_grad():
            new.q.weight.copy_(w_q)
            if has_bias:
                new.q.bias.copy_(b_q)
            new.proj.load_state_dict(attn.proj.state_dict())
        return new


class GPT2LatentAttention(GPT2AttentionCall):
    """Hugging Face GPT-2 attention as MLA; same call and return as ``GPT2Attention``. Its KV
    cache holds the latent, ``kv_rank`` numbers per token (stored in the cache's key slot, with
    an empty value), and K and V are rebuilt from it every step."""

    def __init__(self, dim: int, heads: int, kv_rank: int, *, layer_idx: int | None = None, resid_pdrop: float = 0.0):
        super().__init__()
        self.heads, self.layer_idx = heads, layer_idx
        self.is_causal = True  # as GPT2Attention: the tracer and HF masks read it
        self.q = nn.Linear(dim, dim)
        self.kv = LatentKV(dim, dim, kv_rank, bias=True)
        self.c_proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(resid_pdrop)

    def attend(self, hidden_states: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = hidden_states.shape
        c = self.kv.down(hidden_states)
        if cache is not None:
            cached, _ = cache.update(c.unsqueeze(1), c.new_zeros(b, 1, n, 0), self.layer_idx)
            c = cached.squeeze(1)
        q, k, v = (_heads(t, self.heads) for t in (self.q(hidden_states), self.kv.k_up(c), self.kv.v_up(c)))
        if attention_mask is not None:
            attention_mask = attention_mask[:, :, :, : k.shape[-2]]
        causal = attention_mask is None and n > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=causal)
        return y.transpose(1, 2).flatten(2)

    @classmethod
    def from_hf(cls, attn: nn.Module, kv_rank: int) -> GPT2LatentAttention:
        """Convert a ``GPT2Attention`` (``Conv1D`` weights stored (in, out)): Q and ``c_proj``
        copied, K/V factored through the latent."""
        dim = attn.embed_dim
        new = cls(dim, attn.num_heads, kv_rank, layer_idx=attn.layer_idx, resid_pdrop=attn.resid_dropout.p)
        new = new.to(attn.c_attn.weight.device, attn.c_attn.weight.dtype)
        w_q, w_k, w_v = attn.c_attn.weight.detach().t().chunk(3)
        b_q, b_k, b_v = attn.c_attn.bias.detach().chunk(3)
        new.kv = LatentKV.factor(w_k, w_v, b_k, b_v, kv_rank)
        with torch.no_grad():
            new.q.weight.copy_(w_q)
            new.q.bias.copy_(b_q)
            new.c_proj.weight.copy_(attn.c_proj.weight.t())
            new.c_proj.bias.copy_(attn.c_proj.bias)
        return new


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as LLaMA applies it: ``x cos + rotate_half(x) sin``; x (batch, heads, positions, d),
    cos and sin (batch, positions, d)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class LlamaLatentAttention(nn.Module):
    """LLaMA-style attention as MLA: ``q_proj`` and ``o_proj`` copied, K and V rebuilt from the
    cached latent and K rotated for every cached position (see the module docstring); the
    module's call and return are ``LlamaAttention``'s."""

    def __init__(self, attn: nn.Module, kv_rank: int, rotary: nn.Module) -> None:
        super().__init__()
        self.config, self.layer_idx, self.head_dim = attn.config, attn.layer_idx, attn.head_dim
        self.is_causal, self.scaling = True, attn.scaling
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.q_proj, self.o_proj = attn.q_proj, attn.o_proj
        self.kv = LatentKV.factor(
            attn.k_proj.weight.detach(),
            attn.v_proj.weight.detach(),
            None if attn.k_proj.bias is None else attn.k_proj.bias.detach(),
            None if attn.v_proj.bias is None else attn.v_proj.bias.detach(),
            kv_rank,
        )
        self._rotary = [rotary]  # the model's own rotary embedding, shared, not a submodule of each layer

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        b, n, _ = hidden_states.shape
        cache = cache if cache is not None else past_key_values
        cos, sin = position_embeddings
        q = _rotate(_heads(self.q_proj(hidden_states), self.q_proj.out_features // self.head_dim), cos, sin)
        c = self.kv.down(hidden_states)
        if cache is not None:
            cached, _ = cache.update(c.unsqueeze(1), c.new_zeros(b, 1, n, 0), self.layer_idx)
            c = cached.squeeze(1)
        length = c.shape[1]
        if length != n:  # the cached keys run up to this step's last position (a sliding cache keeps the last few)
            last = kwargs["position_ids"][:, -1:] if kwargs.get("position_ids") is not None else length - 1
            positions = last - length + 1 + torch.arange(length, device=c.device)
            cos, sin = self._rotary[0](c, positions.expand(b, length))
        k = _rotate(_heads(self.kv.k_up(c), self.kv_heads), cos, sin)
        v = _heads(self.kv.v_up(c), self.kv_heads)
        if attention_mask is not None:
            attention_mask = attention_mask[:, :, :, :length]
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attention_mask,
            is_causal=attention_mask is None and n > 1,
            scale=self.scaling,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        return self.o_proj(y.transpose(1, 2).flatten(2)), None


#: the attention modules to_mla converts, recognised as convert's adapters recognise them
_KINDS = {"vit": TIMM_ATTENTION, "gpt2": GPT2_ATTENTION, "llama": LLAMA_ATTENTION}


def _kind(module: nn.Module) -> str | None:
    """Which of :data:`_KINDS` ``module`` is, or None."""
    return next((kind for kind, adapter in _KINDS.items() if adapter.claims(module)), None)


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """Every attention module of ``model`` ``to_mla`` would replace, with its kind, checked: an
    attention it cannot convert is an MLAError naming it."""
    found = []
    for path, module in model.named_modules():
        name = type(module).__name__
        if any(path.startswith(p + ".") for p, _, _ in found) or isinstance(
            module, (LatentKV, ViTLatentAttention, GPT2LatentAttention, LlamaLatentAttention)
        ):
            continue
        kind = _kind(module)
        if kind == "gpt2" and module.is_cross_attention:
            raise MLAError(f"module '{path}' (GPT2Attention) is cross-attention, which to_mla does not handle")
        if kind is not None:
            found.append((path, module, kind))
        elif "attention" in name.lower():
            raise MLAError(f"module '{path}' ({type(module).__module__}.{name}) is an attention to_mla cannot convert")
    if not found:
        raise MLAError(f"{type(model).__name__} has no attention module to_mla knows how to convert")
    return found


def kv_cache_bytes(model: nn.Module) -> int:
    """Bytes of KV cache per token, summed over the layers: K and V, heads x head_dim values
    each, per layer for MHA and GQA, ``kv_rank`` values for MLA, at the model's parameter dtype."""
    size = next(model.parameters()).element_size()
    total = 0
    for module in model.modules():
        kind = _kind(module)
        if isinstance(module, LatentKV):
            total += module.kv_rank
        elif isinstance(module, (ViTGroupedAttention, GPT2GroupedAttention)):
            total += 2 * module.core.kv_heads * module.head_dim
        elif kind == "llama":  # its K/V projections say how many K/V heads it has, converted to GQA or not
            total += module.k_proj.out_features + module.v_proj.out_features
        elif kind is not None:  # MHA: K and V as wide as the model
            total += 2 * _width(module, kind)
    return total * size


def _width(module: nn.Module, kind: str) -> int:
    """The model width an attention module of ``kind`` reads: the most ``kv_rank`` can be."""
    if kind == "vit":
        return module.qkv.in_features
    if kind == "gpt2":
        return module.embed_dim
    return module.k_proj.in_features


def to_mla(model: nn.Module, kv_rank: int) -> nn.Module:
    """Replace every attention module of ``model`` (in place) by MLA with a ``kv_rank``-number
    latent per token (see the module docstring); returns the model. Every module is checked
    before any changes: a rank that is not an integer from 1 to the model's width, or an
    attention ``to_mla`` cannot convert, is an MLAError naming it, and the model is left as it
    was."""
    plan = _attention_modules(model)
    for path, module, kind in plan:
        dim = _width(module, kind)
        if not is_count(kv_rank, 1, dim):
            raise MLAError(
                f"kv_rank {kv_rank!r} for module '{path}': must be an integer from 1 to its width {dim} "
                f"(at {dim} the latent is exact)"
            )
    rotary = next((m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")), None)
    if rotary is None and any(kind == "llama" for _, _, kind in plan):
        raise MLAError(f"{type(model).__name__}: no rotary embedding module found for its RoPE attention")
    for path, module, kind in plan:
        if kind == "vit":
            new = ViTLatentAttention.from_timm(module, kv_rank)
        elif kind == "gpt2":
            new = GPT2LatentAttention.from_hf(module, kv_rank)
        else:
            new = LlamaLatentAttention(module, kv_rank, rotary)
        new.train(module.training)
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, new)
    return model


def mla_metadata(model: nn.Module) -> dict[str, str]:
    """What an MLA conversion is, for a safetensors file's metadata: the variant and the rank,
    read off the model's own latents."""
    latent = next((m for m in model.modules() if isinstance(m, LatentKV)), None)
    if latent is None:
        raise MLAError(f"{type(model).__name__} has no MLA attention to describe")
    return {"graphkit_attention": "mla", "graphkit_kv_rank": str(latent.kv_rank)}

"""graphkit's own attention adapters (:class:`~graphkit.attention.adapter.AttentionAdapter`), one
section per kind of module: timm's ViT ``Attention`` (a fused ``qkv``), Hugging Face GPT-2
(``Conv1D`` ``c_attn``, its weight stored (in, out)) and LLaMA-style models (separate q/k/v
projections; HF computes GQA natively, so only K/V shrink and attention is routed through a
registered "graphkit" implementation that holds the variant). Each holds every hook a conversion
asks of it: GQA and its variants, MLA, the KV cache's size, the Hugging Face export.

Importing :mod:`graphkit.attention` registers them; the families that build such models
(``graphkit.families``) name them as their ``attention_adapter``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from graphkit.attention.adapter import AttentionAdapter, LibraryModule, register_adapter
from graphkit.attention.convert import GPT2GroupedAttention, ViTGroupedAttention
from graphkit.attention.core import GroupedQueryAttention
from graphkit.attention.grouping import Calibration, contiguous_groups, permute_heads, pool_heads, query_order
from graphkit.attention.mla import GPT2LatentAttention, LlamaLatentAttention, ViTLatentAttention, rope_pairs
from graphkit.errors import ConvertError, MLAError
from graphkit.validation import divisors, is_count


def _check_kv(path: str, heads: int, kv_heads: int | None) -> int:
    kv = heads if kv_heads is None else kv_heads
    if not is_count(kv) or heads % kv:
        raise ConvertError(
            f"kv_heads {kv!r} does not divide the {heads} heads of module '{path}'; "
            f"accepted: {', '.join(map(str, divisors(heads)))}"
        )
    return kv


def _capture_fused(projection: str, output: str):
    """A capture for attention with one fused q/k/v projection (timm's ``qkv``, GPT-2's
    ``c_attn``): its output's Q, K and V thirds, as (batch, positions, heads, head_dim), and the
    output projection's weight as (out, in) (GPT-2's ``Conv1D`` stores it transposed)."""

    def capture(module: LibraryModule, store: Callable[..., None]) -> list:
        heads = module.num_heads
        w_o = getattr(module, output).weight.detach()
        w_o = w_o.t() if type(getattr(module, output)).__name__ == "Conv1D" else w_o

        def hook(_module, _inputs, out):
            q, k, v = out.detach().chunk(3, dim=-1)
            store(*(x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads) for x in (q, k, v)), w_o)

        return [getattr(module, projection).register_forward_hook(hook)]

    return capture


# timm's ViT Attention


def _is_timm(module: LibraryModule) -> bool:
    return type(module).__name__ == "Attention" and type(module).__module__.startswith("timm.")


def _refuse_timm_extras(path: str, module: LibraryModule, error: type[Exception], conversion: str) -> None:
    """Refuse, with ``error`` naming ``conversion``, a timm ``Attention`` with qk-norm, a scale
    norm or gating: the converted modules compute plain attention and would silently drop them."""
    plain = all(isinstance(getattr(module, n, None), (nn.Identity, type(None))) for n in ("q_norm", "k_norm", "norm"))
    if not plain or getattr(module, "gate", None) is not None:
        raise error(
            f"module '{path}' (timm Attention) uses qk-norm, a scale norm or gating, "
            f"which {conversion} does not handle yet"
        )


def _check_timm(path: str, module: LibraryModule, kv_heads: int | None) -> None:
    _refuse_timm_extras(path, module, ConvertError, "convert()")
    _check_kv(path, module.num_heads, kv_heads)


def _convert_timm(
    path: str, module: LibraryModule, kv_heads: int | None, variant: str, options: dict, groups
) -> nn.Module:
    return ViTGroupedAttention.from_timm(
        module, _check_kv(path, module.num_heads, kv_heads), variant, groups, **options
    )


def _timm_mla_rank(path: str, module: LibraryModule, rope_dims: int | None) -> int:
    _refuse_timm_extras(path, module, MLAError, "to_mla")
    return module.qkv.in_features


def _timm_to_mla(module: LibraryModule, kv_rank: int, *_: Any) -> nn.Module:
    return ViTLatentAttention.from_timm(module, kv_rank)


TIMM_ATTENTION = register_adapter(
    AttentionAdapter(
        claims=_is_timm,
        check=_check_timm,
        convert=_convert_timm,
        capture=_capture_fused("qkv", "proj"),
        mla_rank=_timm_mla_rank,
        to_mla=_timm_to_mla,
        kv_values=lambda module: 2 * module.qkv.in_features,
        hf_refusal="a ViT has no stock GQA or MLA class in transformers",
    )
)


# Hugging Face GPT-2


def _is_gpt2(module: LibraryModule) -> bool:
    return type(module).__name__ == "GPT2Attention"


def _check_gpt2(path: str, module: LibraryModule, kv_heads: int | None) -> None:
    if module.is_cross_attention:
        raise ConvertError(f"module '{path}' (GPT2Attention) is cross-attention, which convert() does not handle")
    _check_kv(path, module.num_heads, kv_heads)


def _convert_gpt2(
    path: str, module: LibraryModule, kv_heads: int | None, variant: str, options: dict, groups
) -> nn.Module:
    return GPT2GroupedAttention.from_hf(module, _check_kv(path, module.num_heads, kv_heads), variant, groups, **options)


def _gpt2_mla_rank(path: str, module: LibraryModule, rope_dims: int | None) -> int:
    if module.is_cross_attention:
        raise MLAError(f"module '{path}' (GPT2Attention) is cross-attention, which to_mla does not handle")
    return module.embed_dim


def _gpt2_to_mla(module: LibraryModule, kv_rank: int, *_: Any) -> nn.Module:
    return GPT2LatentAttention.from_hf(module, kv_rank)


GPT2_ATTENTION = register_adapter(
    AttentionAdapter(
        claims=_is_gpt2,
        check=_check_gpt2,
        convert=_convert_gpt2,
        capture=_capture_fused("c_attn", "c_proj"),
        mla_rank=_gpt2_mla_rank,
        to_mla=_gpt2_to_mla,
        kv_values=lambda module: 2 * module.embed_dim,
        causal=True,
        hf_refusal="GPT-2 has no stock GQA or MLA class in transformers",
    )
)


# LLaMA-style attention (LLaMA, Mistral, Qwen, Gemma, ...)


def _graphkit_attention(
    module: LibraryModule,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention function "graphkit": the module's variant core on un-repeated K/V."""
    causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    out = module.graphkit_core(query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register_hf_attention(path: str) -> None:
    """Register graphkit's attention with transformers' attention and mask interfaces (public
    since transformers 4.48 and 4.53); an older transformers gets a ConvertError, not a crash."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        import transformers

        raise ConvertError(
            f"module '{path}': converting LLaMA-style attention needs transformers' AttentionInterface "
            f"and masking_utils (4.53 or newer); installed: {transformers.__version__} ({e})"
        ) from e
    AttentionInterface.register("graphkit", _graphkit_attention)
    AttentionMaskInterface.register("graphkit", sdpa_mask)  # masks (causal, sliding window) as for SDPA


def _is_llama(module: LibraryModule) -> bool:
    return all(hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "config", "head_dim"))


def _check_llama(path: str, module: LibraryModule, kv_heads: int | None) -> None:
    heads = module.config.num_attention_heads
    current = module.k_proj.out_features // module.head_dim
    kv = _check_kv(path, heads, kv_heads)
    if current % kv:
        raise ConvertError(f"kv_heads {kv} does not divide the {current} K/V heads module '{path}' already has")
    _register_hf_attention(path)  # before anything changes: an old transformers is refused here


def _convert_llama(
    path: str, module: LibraryModule, kv_heads: int | None, variant: str, options: dict, groups
) -> nn.Module:
    heads = module.config.num_attention_heads
    current = module.k_proj.out_features // module.head_dim
    kv = _check_kv(path, heads, kv_heads)
    measured, groups = groups, groups or contiguous_groups(current, kv)
    order = query_order(groups, heads // current)
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):
            old = getattr(module, name)
            new = nn.Linear(old.in_features, kv * module.head_dim, bias=old.bias is not None).to(
                old.weight.device, old.weight.dtype
            )
            new.weight.copy_(pool_heads(old.weight, groups))
            if old.bias is not None:
                new.bias.copy_(pool_heads(old.bias, groups))
            setattr(module, name, new)
        module.q_proj.weight.copy_(permute_heads(module.q_proj.weight, order))
        if module.q_proj.bias is not None:
            module.q_proj.bias.copy_(permute_heads(module.q_proj.bias, order))
        module.o_proj.weight.copy_(permute_heads(module.o_proj.weight, order, dim=1))
    module.num_key_value_groups = heads // kv
    module.graphkit_core = GroupedQueryAttention(heads, kv, variant, **options)
    module.graphkit_core.groups = measured
    module.config.num_key_value_heads = kv
    module.config._attn_implementation = "graphkit"
    return module


def _capture_llama(module: LibraryModule, store: Callable[..., None]) -> list:
    """A capture for LLaMA-style attention: ``q_proj``'s, ``k_proj``'s and ``v_proj``'s outputs,
    before RoPE, as (batch, positions, heads, head_dim). RoPE does not change the similarity
    groupings (see :mod:`~graphkit.attention.grouping`); ``search`` scores without it."""
    seen: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_module, _inputs, out):
            seen[name] = out.detach().reshape(*out.shape[:-1], -1, module.head_dim)
            if len(seen) == 3:
                store(seen.pop("q"), seen.pop("k"), seen.pop("v"), module.o_proj.weight.detach())

        return record

    return [getattr(module, f"{n}_proj").register_forward_hook(hook(n)) for n in ("q", "k", "v")]


def _llama_mla_rank(path: str, module: LibraryModule, rope_dims: int | None) -> int:
    """Per-head query and key norms (Qwen3's ``q_norm`` and ``k_norm``) are refused: a key
    normalised per token and head is not a linear function of the input, so no latent can hold
    it. The latent's rank is at most the model's width or the stacked K/V projections' rows
    (fewer for a GQA model with few K/V heads, less the rotary keys kept out), whichever is less."""
    norms = [n for n in ("q_norm", "k_norm") if not isinstance(getattr(module, n, nn.Identity()), nn.Identity)]
    if norms:
        raise MLAError(
            f"module '{path}' ({type(module).__name__}) normalises its queries and keys per head ({', '.join(norms)}), "
            "which a latent cannot hold; to_mla does not convert it"
        )
    if rope_dims is not None and (not is_count(rope_dims, 2, module.head_dim - 2) or rope_dims % 2):
        raise MLAError(
            f"rope_dims {rope_dims!r} for module '{path}': must be an even integer from 2 to "
            f"{module.head_dim - 2}, its head_dim less one pair (rotary dimensions come in pairs, "
            "and some must pass through the latent)"
        )
    rows = module.k_proj.out_features + module.v_proj.out_features
    rows -= 0 if rope_dims is None else module.k_proj.out_features // module.head_dim * rope_dims
    return min(module.k_proj.in_features, rows)


def _llama_to_mla(
    module: LibraryModule,
    kv_rank: int,
    rope_dims: int | None,
    rotary: nn.Module | None,
    calibration: Sequence[Calibration] | None,
) -> nn.Module:
    """MLA with the rotary pairs :func:`~graphkit.attention.mla.rope_pairs` keeps, read from the
    calibration queries and keys when there are some."""
    assert rotary is not None, "to_mla hands a rotary adapter the model's rotary embedding"
    pairs = None
    if rope_dims is not None:
        q, k = (torch.cat([getattr(b, n).flatten(0, 1) for b in calibration]) if calibration else None for n in "qk")
        kv_heads = module.k_proj.out_features // module.head_dim
        pairs = rope_pairs(q, k, kv_heads, rope_dims, module.head_dim).to(module.k_proj.weight.device)
    return LlamaLatentAttention(module, kv_rank, rotary, rope_dims, pairs)


LLAMA_ATTENTION = register_adapter(
    AttentionAdapter(
        claims=_is_llama,
        check=_check_llama,
        convert=_convert_llama,
        capture=_capture_llama,
        mla_rank=_llama_mla_rank,
        to_mla=_llama_to_mla,
        kv_values=lambda module: module.k_proj.out_features + module.v_proj.out_features,
        causal=True,
        rotary=True,
    )
)

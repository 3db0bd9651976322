"""Grouped-query attention and its key-driven variants (KDGQA, DGQA, PGQA; arXiv 2408.08454).

``allocation`` decides how many query heads each K/V head serves, ``core`` is the attention
module and its variants (``register_variant`` adds one), ``convert`` turns MHA models into any
variant by mean-pooling K/V heads, ``mla`` into multi-head latent attention, ``hf_format``
writes the result in transformers' own classes. Every conversion handles a module through the
:class:`AttentionAdapter` that claims it (``adapter``, the one plugin point for modules);
importing this package registers graphkit's own (``builtin``).
"""

from graphkit.attention.adapter import AttentionAdapter, adapter_for, register_adapter
from graphkit.attention.allocation import allocate_queries, key_norms, query_groups
from graphkit.attention.builtin import GPT2_ATTENTION, LLAMA_ATTENTION, TIMM_ATTENTION
from graphkit.attention.convert import ConvertError, ViTGroupedAttention, convert, mean_pool_heads
from graphkit.attention.core import (
    ATTENTION_VARIANTS,
    AttentionVariant,
    GroupedQueryAttention,
    kdgqa_index,
    register_variant,
)

__all__ = [
    "GroupedQueryAttention",
    "ATTENTION_VARIANTS",
    "AttentionVariant",
    "register_variant",
    "allocate_queries",
    "key_norms",
    "query_groups",
    "kdgqa_index",
    "convert",
    "mean_pool_heads",
    "ViTGroupedAttention",
    "ConvertError",
    "AttentionAdapter",
    "adapter_for",
    "register_adapter",
    "TIMM_ATTENTION",
    "GPT2_ATTENTION",
    "LLAMA_ATTENTION",
]

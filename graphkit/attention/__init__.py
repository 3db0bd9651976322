"""Grouped-query attention and its key-driven variants (KDGQA, DGQA, PGQA; arXiv 2408.08454).

``allocation`` decides how many query heads each K/V head serves, ``core`` is the attention
module, ``convert`` turns MHA models into any variant by mean-pooling K/V heads.
"""

from graphkit.attention.allocation import allocate_queries, key_norms, query_groups
from graphkit.attention.convert import ConvertError, ViTGroupedAttention, convert, mean_pool_heads
from graphkit.attention.core import ATTENTION_VARIANTS, GroupedQueryAttention, kdgqa_index

__all__ = [
    "GroupedQueryAttention",
    "ATTENTION_VARIANTS",
    "allocate_queries",
    "key_norms",
    "query_groups",
    "kdgqa_index",
    "convert",
    "mean_pool_heads",
    "ViTGroupedAttention",
    "ConvertError",
]

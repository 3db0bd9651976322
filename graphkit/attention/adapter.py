"""The one plugin point of :mod:`graphkit.attention`: an :class:`AttentionAdapter` per kind of
attention module, and the table every conversion looks modules up in.

:func:`~graphkit.attention.convert` (GQA and the key-driven variants),
:func:`~graphkit.attention.mla.to_mla`, :func:`~graphkit.attention.mla.kv_cache_bytes` and the
Hugging Face export (:mod:`~graphkit.attention.hf_format`) never branch on a module's class or a
family's name: each asks :func:`adapter_for` and calls the adapter's hooks. graphkit's own
adapters (timm's ViT ``Attention``, GPT-2's, LLaMA-style) are registered when
:mod:`graphkit.attention` is imported (:mod:`graphkit.attention.builtin`); a model family
registers its own through ``Family.attention_adapter``, or anyone with :func:`register_adapter`.
The adapter registered last is asked first, so a family can claim modules that a built-in
adapter's duck-typed test would also take.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

#: a library's attention module as the hooks read it: by its attributes (``num_heads``,
#: ``q_proj``, ``c_attn``, its config), which are the library's own; a type checker sees only
#: ``nn.Module``'s ``Tensor | Module`` there, so the hooks take it duck-typed
LibraryModule = Any


@dataclass(frozen=True)
class AttentionAdapter:
    """How graphkit converts one kind of attention module.

    ``claims(module)`` recognises it.

    GQA and the key-driven variants (:func:`~graphkit.attention.convert`): ``check(path, module,
    kv_heads)`` refuses a conversion before anything changes; ``convert(path, module, kv_heads,
    variant, options, groups)`` returns the converted module (``groups``: the K/V heads pooled
    together, None for neighbours); ``capture(module, store)`` hooks the module so that a forward
    pass hands its queries, keys and values, (batch, positions, heads, head_dim) each, and its
    output projection's weight (out, in) to ``store`` (it returns the hooks' handles); ``causal``
    says whether its attention is causal (what ``search`` scores).

    MLA (:func:`~graphkit.attention.mla.to_mla`): ``mla_rank(path, module, rope_dims)`` refuses
    what a latent cannot hold (an MLAError naming the module) and returns the largest
    ``kv_rank`` the module can take; ``to_mla(module, kv_rank, rope_dims, rotary, calibration)``
    returns its MLA form (``rotary``: the model's rotary embedding module, ``calibration``: what
    ``capture`` saw, or None); ``rotary`` says whether its keys are rotated per position (RoPE),
    so that ``rope_dims`` applies and the model must have a rotary embedding.

    The cache (:func:`~graphkit.attention.mla.kv_cache_bytes`): ``kv_values(module)``, the K and
    V numbers per token the unconverted module caches.

    The Hugging Face export (``convert --format hf``): ``hf_refusal`` is None when the module
    maps onto transformers' stock LLaMA-style attention (``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``, which the export reads), or else says why it has no stock class."""

    claims: Callable[[nn.Module], bool]
    check: Callable[[str, LibraryModule, int | None], None]
    convert: Callable[[str, LibraryModule, int | None, str, dict, list[list[int]] | None], nn.Module]
    capture: Callable[[LibraryModule, Callable[..., None]], list]
    mla_rank: Callable[[str, LibraryModule, int | None], int]
    to_mla: Callable[[LibraryModule, int, int | None, LibraryModule | None, Sequence[Any] | None], nn.Module]
    kv_values: Callable[[LibraryModule], int]
    causal: bool = False
    rotary: bool = False
    hf_refusal: str | None = None


#: every adapter graphkit tries, in the order they were registered (asked last first)
ADAPTERS: list[AttentionAdapter] = []


def register_adapter(adapter: AttentionAdapter) -> AttentionAdapter:
    """Let every conversion handle the attention modules ``adapter`` claims (a family registers
    its own through ``Family.attention_adapter``); registering one twice is a no-op."""
    if adapter not in ADAPTERS:
        ADAPTERS.append(adapter)
    return adapter


def adapter_for(module: nn.Module) -> AttentionAdapter | None:
    """The adapter that claims ``module``, the one registered last first; None for a module no
    adapter claims (not attention, or attention graphkit cannot convert)."""
    return next((a for a in reversed(ADAPTERS) if a.claims(module)), None)

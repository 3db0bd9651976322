"""MHA checkpoints -> GQA and key-driven variants: ``convert(model, variant, kv_heads)``.

K and V heads are mean-pooled over groups of ``heads / kv_heads``, weights and biases alike. By
default the groups are neighbouring heads (Ainslie et al., 2023); ``grouping`` picks them from
the heads' keys and values on calibration inputs instead (:mod:`graphkit.attention.grouping`).
Q and the output projection are copied, their heads reordered so that each group's query heads
are contiguous. With ``kv_heads == heads`` and ``variant="gqa"`` the converted model computes
what the original did.

Each attention module is handled by the :class:`~graphkit.attention.adapter.AttentionAdapter`
that claims it (:mod:`graphkit.attention.builtin` has graphkit's own: timm's ViT ``Attention``,
Hugging Face GPT-2, LLaMA-style models). This module holds the converted modules for the fused
projections and what every conversion shares: the checks, the calibration pass, the metadata.
Any attention module no adapter claims is an error that names it, so nothing is silently left
unconverted.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from graphkit.attention.adapter import AttentionAdapter, LibraryModule, adapter_for
from graphkit.attention.core import ATTENTION_VARIANTS, GroupedQueryAttention
from graphkit.attention.grouping import (
    GROUPINGS,
    MEASURED,
    Calibration,
    choose_groups,
    contiguous_groups,
    permute_heads,
    pool_heads,
    query_order,
)
from graphkit.errors import ConvertError
from graphkit.validation import is_count, is_number


def mean_pool_heads(weight: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Average contiguous groups of heads along dim 0: (heads * d, ...) -> (kv_heads * d, ...)."""
    return pool_heads(weight, contiguous_groups(heads, kv_heads))


class ViTGroupedAttention(nn.Module):
    """timm ViT attention with ``kv_heads`` K/V heads: a fused ``qkv`` projection to
    (heads + 2 kv_heads) * head_dim, a :class:`GroupedQueryAttention` core and ``proj``."""

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        variant: str = "gqa",
        *,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        **variant_options: Any,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=qkv_bias)
        self.core = GroupedQueryAttention(heads, kv_heads, variant, **variant_options)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        y = self.core(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y.transpose(1, 2).reshape(b, n, -1))

    @classmethod
    def from_timm(
        cls,
        attn: LibraryModule,
        kv_heads: int,
        variant: str,
        groups: list[list[int]] | None = None,
        **variant_options: Any,
    ) -> ViTGroupedAttention:
        """Convert a timm ``Attention`` by mean-pooling its K/V heads over ``groups`` (default:
        neighbours), its query heads reordered to match."""
        heads, dim = attn.num_heads, attn.qkv.in_features
        measured, groups = groups, groups or contiguous_groups(heads, kv_heads)
        order = query_order(groups, 1)
        new = cls(
            dim,
            heads,
            kv_heads,
            variant,
            qkv_bias=attn.qkv.bias is not None,
            proj_bias=attn.proj.bias is not None,
            **variant_options,
        ).to(attn.qkv.weight.device, attn.qkv.weight.dtype)
        with torch.no_grad():
            for name in ("weight", "bias"):
                source = getattr(attn.qkv, name)
                if source is None:
                    continue
                q, k, v = source.chunk(3, dim=0)
                getattr(new.qkv, name).copy_(
                    torch.cat([permute_heads(q, order), pool_heads(k, groups), pool_heads(v, groups)])
                )
            new.proj.weight.copy_(permute_heads(attn.proj.weight, order, dim=1))
            if attn.proj.bias is not None:
                new.proj.bias.copy_(attn.proj.bias)
        new.core.groups = measured  # None for neighbours: the file records only a measured grouping
        return new


class GPT2AttentionCall(nn.Module):
    """What GPT-2's blocks call, as ``GPT2Attention`` answers it: ``forward(hidden_states, cache,
    attention_mask)`` returns ``(c_proj output after dropout, None)``. transformers up to 5.1x
    hands the KV cache over as ``past_key_values``, later ones as ``cache``; both are taken.
    Subclasses compute the attention before ``c_proj`` in :meth:`attend`."""

    c_proj: Any  # the subclass's output projection (transformers' Conv1D, imported where it is built)
    resid_dropout: nn.Module

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        cache = cache if cache is not None else past_key_values
        return self.resid_dropout(self.c_proj(self.attend(hidden_states, cache, attention_mask))), None

    def attend(self, hidden_states: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The heads' outputs, concatenated (batch, positions, width), before the output projection."""
        raise NotImplementedError


class GPT2GroupedAttention(GPT2AttentionCall):
    """Hugging Face GPT-2 attention with ``kv_heads`` K/V heads: ``c_attn`` (a Conv1D, weight
    stored (in, out)) projects to (heads + 2 kv_heads) * head_dim; a :class:`GroupedQueryAttention`
    core; ``c_proj``. Same call and return as ``GPT2Attention`` (KV cache included)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        variant: str = "gqa",
        *,
        layer_idx: int | None = None,
        resid_pdrop: float = 0.0,
        **variant_options: Any,
    ) -> None:
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.layer_idx = heads, kv_heads, dim // heads, layer_idx
        self.is_causal = True  # as GPT2Attention: the tracer and HF masks read it
        self.c_attn = Conv1D((heads + 2 * kv_heads) * self.head_dim, dim)
        self.core = GroupedQueryAttention(heads, kv_heads, variant, **variant_options)
        self.c_proj = Conv1D(dim, dim)
        self.resid_dropout = nn.Dropout(resid_pdrop)

    def attend(self, hidden_states: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=2
        )
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        y = self.core(q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None and n > 1)
        return y.transpose(1, 2).reshape(b, n, -1)

    @classmethod
    def from_hf(
        cls,
        attn: LibraryModule,
        kv_heads: int,
        variant: str,
        groups: list[list[int]] | None = None,
        **variant_options: Any,
    ) -> GPT2GroupedAttention:
        """Convert a ``GPT2Attention`` by mean-pooling its K/V heads (columns of the Conv1D weight)
        over ``groups`` (default: neighbours), its query heads reordered to match."""
        heads, dim = attn.num_heads, attn.embed_dim
        measured, groups = groups, groups or contiguous_groups(heads, kv_heads)
        order = query_order(groups, 1)
        new = cls(
            dim, heads, kv_heads, variant, layer_idx=attn.layer_idx, resid_pdrop=attn.resid_dropout.p, **variant_options
        ).to(attn.c_attn.weight.device, attn.c_attn.weight.dtype)
        with torch.no_grad():
            for name in ("weight", "bias"):
                source = getattr(attn.c_attn, name)
                q, k, v = (source.t() if name == "weight" else source).chunk(3, dim=0)
                pooled = torch.cat([permute_heads(q, order), pool_heads(k, groups), pool_heads(v, groups)])
                getattr(new.c_attn, name).copy_(pooled.t() if name == "weight" else pooled)
            new.c_proj.weight.copy_(permute_heads(attn.c_proj.weight, order, dim=0))  # Conv1D: (in, out)
            new.c_proj.bias.copy_(attn.c_proj.bias)
        new.core.groups = measured  # None for neighbours: the file records only a measured grouping
        return new


def conversion_metadata(model: nn.Module) -> dict[str, str]:
    """What a converted model's attention is, for a safetensors file's metadata: the variant,
    K/V heads and, for DGQA, window, evolution and (with ema) alpha, read off the model's own
    attention cores so that the file says what was used, defaults included."""
    core = next((m for m in model.modules() if isinstance(m, GroupedQueryAttention)), None)
    if core is None:
        raise ConvertError(f"{type(model).__name__} has no converted attention to describe")
    metadata = {"graphkit_attention": core.variant, "graphkit_kv_heads": str(core.kv_heads)}
    groups = {path: m.groups for path, m in model.named_modules() if isinstance(m, GroupedQueryAttention)}
    if any(g is not None for g in groups.values()):
        metadata["graphkit_groups"] = json.dumps(groups, separators=(",", ":"))
    spec = ATTENTION_VARIANTS[core.variant]
    if spec.metadata is not None:
        metadata.update(spec.metadata(core))
    return metadata


def variant_options() -> dict[str, tuple[str, ...]]:
    """Each option of :class:`GroupedQueryAttention` and the variants that read it
    (``AttentionVariant.options``, registered ones included), the module's own options in the
    order its signature names them, a registered variant's after them."""
    found: dict[str, tuple[str, ...]] = {}
    for name, variant in ATTENTION_VARIANTS.items():
        for option in variant.options:
            found[option] = (*found.get(option, ()), name)
    order = list(inspect.signature(GroupedQueryAttention).parameters)
    return dict(sorted(found.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))


EVOLUTIONS = ("ema", "difference")


def check_variant_options(variant: str, options: dict[str, Any], prefix: str = "") -> None:
    """Refuse, with a ConvertError naming the option (``prefix`` + name: ``--window`` on the
    command line) and what it accepts, an option ``variant`` does not use (it would be silently
    ignored) or a value it cannot use: DGQA's ``window`` is a whole number of training steps
    >= 1, ``evolution`` is ema or difference, and ``alpha``, eq. 7's weight of the current key
    norms in the EMA (KDGQA paper, arXiv 2408.08454), is a number in [0, 1] used by ema only."""
    readers = variant_options()
    for name in options:
        if name not in readers:
            raise ConvertError(f"unknown attention option {name!r}; accepted: {', '.join(readers)}")
        if variant not in readers[name]:
            raise ConvertError(f"{prefix}{name} applies only to {' and '.join(readers[name])}, not {variant}")
    window, evolution, alpha = options.get("window"), options.get("evolution"), options.get("alpha")
    if window is not None and not is_count(window):
        raise ConvertError(f"{prefix}window {window!r}: must be a whole number of training steps >= 1")
    if evolution is not None and evolution not in EVOLUTIONS:
        raise ConvertError(f"{prefix}evolution {evolution!r}: accepted: {', '.join(EVOLUTIONS)}")
    if alpha is not None:
        if not is_number(alpha) or not 0 <= alpha <= 1:
            raise ConvertError(
                f"{prefix}alpha {alpha!r}: must be a number in [0, 1] (the weight of the current key norms)"
            )
        if evolution == "difference":
            raise ConvertError(f"{prefix}alpha applies only to {prefix}evolution ema, not difference")


def check_grouping(variant: str, grouping: str, prefix: str = "") -> None:
    """Refuse a grouping :func:`convert` does not know, or one given with a variant that picks its
    own groups (the key-driven variants allocate query heads to K/V heads as they run)."""
    if grouping not in GROUPINGS:
        raise ConvertError(f"unknown {prefix}grouping {grouping!r}; accepted: {', '.join(GROUPINGS)}")
    if grouping != "mean" and variant != "gqa":
        why = "has no K/V heads to group" if variant == "mla" else "allocates its own groups"
        raise ConvertError(f"{prefix}grouping {grouping} applies to gqa; {variant} {why}")


_CONVERTED = (ViTGroupedAttention, GPT2GroupedAttention, GroupedQueryAttention)


def convert(
    model: nn.Module,
    variant: str = "gqa",
    kv_heads: int | None = None,
    *,
    grouping: str = "mean",
    calibration: Sequence[Any] = (),
    **variant_options: Any,
) -> nn.Module:
    """Replace every attention module of ``model`` (in place) by ``variant`` with ``kv_heads``
    K/V heads (default: as many as query heads), mean-pooling K/V over the groups ``grouping``
    picks (:mod:`graphkit.attention.grouping`: ``mean``, neighbouring heads, or ``keynorm`` and
    ``similarity``, measured on ``calibration``, a sequence of the model's inputs: a tensor, a
    tuple of arguments or a dict of keyword arguments each); returns the model.
    ``variant_options`` go to :class:`GroupedQueryAttention` (window, evolution, alpha,
    allow_empty, perturb_in_eval). Every attention module is checked before any is changed: an
    unknown one, or a head count that does not divide, is a ConvertError naming the module and
    the model is left as it was, and so is an option the variant does not use or cannot take
    (:func:`check_variant_options`), and a grouping it cannot apply."""
    if variant not in ATTENTION_VARIANTS:
        raise ConvertError(f"unknown attention variant {variant!r}; accepted: {', '.join(ATTENTION_VARIANTS)}")
    check_variant_options(variant, variant_options)
    check_grouping(variant, grouping)
    if grouping in MEASURED and not calibration:
        raise ConvertError(f"grouping {grouping} reads keys and values on calibration inputs; none were given")
    plan: list[tuple[str, nn.Module, AttentionAdapter]] = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p, _, _ in plan) or isinstance(module, _CONVERTED):
            continue
        adapter = adapter_for(module)
        if adapter is None:
            if "attention" in type(module).__name__.lower():
                raise ConvertError(
                    f"module '{path}' ({type(module).__module__}.{type(module).__name__}) "
                    "is an attention graphkit cannot convert yet"
                )
            continue
        adapter.check(path, module, kv_heads)
        plan.append((path, module, adapter))
    if not plan:
        raise ConvertError(f"{type(model).__name__} has no attention module graphkit knows how to convert")
    groups = _groups(model, plan, kv_heads, grouping, calibration)
    for path, module, adapter in plan:
        new = adapter.convert(path, module, kv_heads, variant, variant_options, groups.get(path))
        new = new.train(module.training)
        if new is not module:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, new)
    return model


def _groups(
    model: nn.Module, plan: list, kv_heads: int | None, grouping: str, calibration: Sequence[Any]
) -> dict[str, list[list[int]]]:
    """Each planned module's groups under ``grouping``, read from one pass of every calibration
    input through the unconverted model (none for ``mean``)."""
    if grouping == "mean":
        return {}
    groups = {}
    for path, batches in capture_calibration(model, plan, calibration).items():
        current = batches[0].k.shape[2]
        groups[path] = choose_groups(grouping, current, current if kv_heads is None else kv_heads, batches)
    return groups


def capture_calibration(
    model: nn.Module, plan: Sequence[tuple[str, nn.Module, AttentionAdapter]], calibration: Sequence[Any]
) -> dict[str, list[Calibration]]:
    """What each planned attention module, ``(path, module, adapter)``, saw of every calibration
    input (a tensor, a tuple of arguments or a dict of keyword arguments) in one pass through
    ``model``: its queries, keys and values, as :class:`~graphkit.attention.grouping.Calibration`
    batches. A calibration input the model cannot run, or one that never reaches a module, is a
    ConvertError."""
    seen: dict[str, list[tuple[torch.Tensor, ...]]] = {path: [] for path, _, _ in plan}
    handles = [
        handle
        for path, module, adapter in plan
        for handle in adapter.capture(module, lambda *qkv, path=path: seen[path].append(qkv))
    ]
    run_calibration(model, calibration, handles)
    for path, _, _ in plan:
        if not seen[path]:
            raise ConvertError(f"module '{path}': the calibration inputs never reached it")
    return {
        path: [Calibration(q, k, v, adapter.causal, w_o) for q, k, v, w_o in seen[path]] for path, _, adapter in plan
    }


def run_calibration(model: nn.Module, calibration: Sequence[Any], hooks: Sequence[Any] = ()) -> None:
    """Run ``model`` without gradients on every calibration input (a tensor, a tuple of
    arguments or a dict of keyword arguments), for the ``hooks`` that read its activations, and
    remove those hooks (their handles) after, whatever happens; an input the model cannot take is
    a ConvertError."""
    try:
        with torch.no_grad():
            for inputs in calibration:
                if isinstance(inputs, dict):
                    model(**inputs)
                else:
                    model(*(inputs if isinstance(inputs, tuple) else (inputs,)))
    except Exception as e:  # a calibration input the model cannot take
        raise ConvertError(f"calibration input: {type(model).__name__} cannot run it ({type(e).__name__}: {e})") from e
    finally:
        for hook in hooks:
            hook.remove()

"""Converted attention as checkpoints stock transformers loads (``graphkit convert --format hf``).

Two formats, both a folder ``AutoModelForCausalLM.from_pretrained`` reads with no custom code:

- **GQA as the model's own class.** :func:`~graphkit.attention.convert` keeps a LLaMA-style
  model's attention modules (LLaMA, Mistral, Qwen2/3, Gemma, ...) and only shrinks ``k_proj`` and
  ``v_proj``, with the query heads and the output projection's columns reordered into their
  groups. That is the model's own class with fewer ``num_key_value_heads``: its weights and
  config are saved as they are (:func:`save_hf`).
- **MLA in DeepSeek's format** (:func:`to_deepseek`): a ``deepseek_v3`` model with every layer
  dense, ``kv_lora_rank`` R and ``qk_rope_head_dim`` D. DeepSeek caches per token one latent of R
  numbers and one rotary key of D numbers that every head shares; graphkit's own MLA
  (:func:`~graphkit.attention.mla.to_mla`) keeps D rotary dimensions per K/V head instead.
  The bridge is TransMLA's RoRoPE (Meng et al., 2025): RoPE turns the two dimensions of a
  frequency pair by the same angle in every K/V head, so any orthogonal mix of the heads' pair
  components commutes with it. Per kept frequency pair, the K/V heads' key components are rotated
  onto their principal direction (PCA over the heads, on calibration keys): that direction
  becomes the shared rotary key, exact for what it holds, and what is left of each head's key
  (its other directions) joins the other dimensions, unrotated, in the latent. The query of each
  head is split to match: all of it, unrotated, against the latent's keys, and its share of each
  principal direction against the rotary key.

What DeepSeek's attention computes, and how each part is met:

- *Frequencies.* DeepSeek rotates D dimensions with ``D / 2`` frequencies from its own config.
  D must divide ``head_dim``: its rotary embedding, with the source's ``rope_parameters``, then
  gives exactly the frequencies of every ``head_dim / D``-th pair of the source (checked after
  building). The pairs in between are folded into the kept pair before them (TransMLA's
  FreqFold): its principal direction is taken over both pairs' components and turned at the kept
  pair's frequency, as long as they turn at least :data:`FOLD_RATIO` times as fast; slower ones
  lose their rotation and join the latent.
- *Layout.* ``rope_interleave`` is on, as in DeepSeek's own checkpoints (vLLM and SGLang assume
  it): a pair's two components sit side by side in ``q_proj`` and ``kv_a_proj_with_mqa``.
- *Scale.* DeepSeek scales scores by ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``; the
  ratio to the source's scale (``head_dim ** -0.5``, Gemma's ``query_pre_attn_scalar``) is folded
  into the query weights, so the scores are the source's.
- *The latent's norm* (``kv_a_layernorm``): DeepSeek normalises the latent per token, which no
  weight can undo. The input RMSNorm's weight is folded into the projections, so the latent
  reads the unit-RMS input ``x̂``; its basis is the SVD of the stacked K (less the rotary
  directions) and V projections in that space, K scaled to V's Frobenius norm first (TransMLA's
  BKV: keys are the larger, and a plain SVD spends the rank on them), and
  the norm's weight is the latent's mean RMS on the calibration tokens (1 without them: ``x̂`` has
  unit RMS), the scale that least changes the latent on average. At R = the model's width the
  latent is an orthonormal basis of ``x̂`` itself: its RMS is that of ``x̂``, and the norm is exact.
  Below it, each token's latent is rescaled by its own RMS over the mean; BENCHMARKS.md measures
  what that costs.
- *Biases.* DeepSeek's ``q_proj`` has none. A K bias only shifts a query's scores by one amount
  on the unrotated part (softmax ignores it) and is kept on the rotary key; a V bias passes through
  attention unchanged and is folded into ``o_proj``'s bias. A query bias (Qwen2) is carried by
  DeepSeek's low-rank query path with rank ``width + 1``: ``q_a_proj`` copies ``x̂`` and appends a
  constant 1, so ``q_a_layernorm`` divides by a constant RMS, and ``q_b_proj`` holds the query
  weights and the bias as its last column. Exact, at the price of one more width x width matrix
  per layer.
- *The rest* maps directly: embeddings (Gemma's ``sqrt(width)`` scale folded in, its tied output
  layer untied), the RMSNorms (Gemma's ``1 + weight`` folded), the SwiGLU MLP (the source's
  activation), the output layer. ``first_k_dense_replace`` is the number of layers, so no MoE block
  is built.

Exact where nothing is dropped: one K/V head (its principal direction is itself), D = head_dim
and R = the width give the source's logits (tested); elsewhere the model changes and wants
up-training (``graphkit finetune``), as graphkit's partial-RoPE MLA does. A decoder DeepSeek's
format cannot hold (per-head q/k norms, sliding windows, logit soft-capping, sandwich norms,
multipliers, a RoPE type whose frequencies do not map) is refused in one line before any work.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.attention.adapter import LibraryModule, adapter_for
from graphkit.attention.convert import run_calibration
from graphkit.errors import ExportError
from graphkit.fileio import MARK, OutputError, check_output_dir, graphkit_kind, version, write_folder
from graphkit.validation import divisors, is_count

#: the variants ``--format hf`` writes: GQA as the model's own class, MLA as DeepSeek's
HF_VARIANTS = ("gqa", "mla")
#: a LLaMA-style decoder layer's parts, all DeepSeek's dense layer has
_DECODER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
#: the SwiGLU MLP's projections, LLaMA's and DeepSeek's alike
_MLP = ("gate_proj", "up_proj", "down_proj")
#: RoPE types whose frequencies are a function of the frequency alone, so that every s-th pair
#: of the source is what DeepSeek's rotary embedding of head_dim / s dimensions computes
_ROPE_TYPES = ("default", "linear", "llama3")
#: FreqFold's bound: a neighbouring frequency pair shares a kept pair's rotation when it turns at least
#: this fraction as fast (measured, :func:`default_fold`)
FOLD_RATIO = 0.4
#: config fields of decoders that scale what DeepSeek's format cannot (Granite's multipliers, Cohere's logit scale)
_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling", "logit_scale")
#: config fields of decoders that cap scores or logits (Gemma 2)
_SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")


def _stock_attention(module: nn.Module) -> bool:
    """Whether ``module`` is attention whose adapter maps it onto transformers' stock LLaMA-style
    attention (``hf_refusal`` None)."""
    adapter = adapter_for(module)
    return adapter is not None and adapter.hf_refusal is None


def check_hf_export(model: nn.Module, variant: str) -> None:
    """Refuse, before any work, a model or variant ``--format hf`` cannot write: a variant with
    no stock class (only gqa and mla have one), a model that is not a transformers model, or
    attention other than LLaMA-style (ViTs and GPT-2 have no stock GQA or MLA class: their
    converted attention stays in graphkit's format). MLA's own checks are
    :func:`check_deepseek`'s."""
    from transformers import PreTrainedModel

    if variant not in HF_VARIANTS:
        raise ExportError(
            f"--format hf writes {' or '.join(HF_VARIANTS)}: no stock transformers class computes {variant}; "
            "--format graphkit writes it"
        )
    name = type(model).__name__
    for path, module in model.named_modules():
        adapter = adapter_for(module)
        if adapter is not None and adapter.hf_refusal is not None:
            raise ExportError(
                f"{name}: {adapter.hf_refusal} (module '{path}'); --format graphkit writes its converted attention"
            )
    if not isinstance(model, PreTrainedModel):
        raise ExportError(
            f"{name}: not a transformers model, so no stock class can load it; --format hf takes "
            "LLaMA-style transformers decoders (LLaMA, Mistral, Qwen2/3, Gemma, ...)"
        )
    if not any(_stock_attention(m) for m in model.modules()):
        raise ExportError(f"{name}: has no LLaMA-style attention (q_proj, k_proj, v_proj, o_proj) to convert")


@dataclass(frozen=True)
class DecoderPlan:
    """What a LLaMA-style decoder maps to in DeepSeek's format, read and checked before any
    work (:func:`check_deepseek`): its sizes, the effective RMSNorm weights (``weight`` or
    Gemma's ``1 + weight``), the scale on its embeddings, and which projections carry biases."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    width: int
    mlp: int
    scaling: float
    eps: float
    input_norms: tuple[torch.Tensor, ...]
    post_norms: tuple[torch.Tensor, ...]
    final_norm: torch.Tensor
    embed_scale: float
    hidden_act: str
    query_bias: bool
    attention_bias: bool


class _Stop(Exception):
    """Raised by a hook to end a probing forward pass once it has what it reads."""


def check_deepseek(model: LibraryModule, kv_rank: Any, rope_dims: Any) -> DecoderPlan:
    """Check, before any work, that ``model`` is a LLaMA-style decoder DeepSeek's format holds
    and that ``kv_rank`` (1 to the width) and ``rope_dims`` (even, dividing head_dim) fit it;
    returns what the conversion reads. One ExportError line naming the module, option or config
    field otherwise."""
    from transformers.activations import ACT2FN

    check_hf_export(model, "mla")
    name, config = type(model).__name__, model.config
    inner = getattr(model, "model", None)
    parts = [getattr(inner, n, None) for n in ("embed_tokens", "layers", "norm", "rotary_emb")]
    head = getattr(model, "lm_head", None)
    if any(p is None for p in parts) or not isinstance(head, nn.Linear) or not isinstance(parts[0], nn.Embedding):
        raise ExportError(
            f"{name}: not a LLaMA-style causal LM (model.embed_tokens, model.layers, model.norm, "
            "model.rotary_emb, lm_head); DeepSeek's format takes LLaMA, Mistral, Qwen2, Gemma and their like"
        )
    embed, layers, final, _ = parts
    for field in (*_MULTIPLIERS, *_SOFTCAPS):
        value = getattr(config, field, None)
        if value not in (None, 1, 1.0):
            raise ExportError(f"{name}: config {field}={value}; DeepSeek's format has no place for it")
    if _sliding(config):
        raise ExportError(
            f"{name}: attends within a sliding window of {config.sliding_window} tokens; DeepSeek's format "
            "attends to every token, so it would change what the model computes"
        )
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type not in _ROPE_TYPES or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ExportError(
            f"{name}: RoPE type {rope_type} (partial_rotary_factor {rope.get('partial_rotary_factor', 1.0)}); "
            f"DeepSeek's format keeps the frequencies of {', '.join(_ROPE_TYPES)} with every dimension rotated"
        )
    if head.bias is not None:
        raise ExportError(f"{name}: lm_head has a bias; DeepSeek's output layer has none")
    eps = float(config.rms_norm_eps)
    act = getattr(config, "hidden_activation", None) or config.hidden_act
    attentions, norms, posts, mlps = [], [], [], set()
    for i, layer in enumerate(layers):
        where = f"model.layers.{i}"
        extra = [n for n, m in layer.named_children() if n not in _DECODER_PARTS and _has_parameters(m)]
        if extra or any(getattr(layer, n, None) is None for n in _DECODER_PARTS):
            what = f"'{where}.{extra[0]}'" if extra else "the layer's " + ", ".join(_DECODER_PARTS)
            raise ExportError(
                f"module {what}: DeepSeek's dense layer holds only attention, MLP, input and post-attention norms"
            )
        attn, mlp = layer.self_attn, layer.mlp
        if not _stock_attention(attn):
            raise ExportError(f"module '{where}.self_attn' ({type(attn).__name__}) is not LLaMA-style attention")
        extra = [n for n, m in attn.named_children() if n not in ("q_proj", "k_proj", "v_proj", "o_proj")]
        extra = [n for n in extra if _has_parameters(getattr(attn, n))]
        if extra:
            raise ExportError(
                f"module '{where}.self_attn.{extra[0]}': per-head query/key norms have no place in DeepSeek's attention"
            )
        linears = [getattr(mlp, n, None) for n in _MLP]
        others = [n for n, m in mlp.named_children() if n not in (*_MLP, "act_fn")]
        if not all(isinstance(m, nn.Linear) and m.bias is None for m in linears) or others:
            raise ExportError(
                f"module '{where}.mlp' ({type(mlp).__name__}): DeepSeek's MLP is gate_proj, up_proj and down_proj "
                "without biases"
            )
        if type(getattr(mlp, "act_fn", None)) is not type(ACT2FN[act]):
            raise ExportError(f"module '{where}.mlp': its activation is not the config's {act}")
        mlps.add(linears[0].out_features)
        attentions.append(attn)
        norms.append(_norm_scale(layer.input_layernorm, f"{where}.input_layernorm", eps))
        posts.append(_norm_scale(layer.post_attention_layernorm, f"{where}.post_attention_layernorm", eps))
    first = attentions[0]
    head_dim, width = first.head_dim, embed.embedding_dim
    heads, kv_heads = first.q_proj.out_features // head_dim, first.k_proj.out_features // head_dim
    shapes = {(a.head_dim, a.q_proj.out_features, a.k_proj.out_features) for a in attentions}
    if len(shapes) > 1 or len(mlps) > 1:
        raise ExportError(f"{name}: its layers differ in shape; DeepSeek's config gives every layer the same")
    biases = [getattr(a, n).bias is not None for a in attentions for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    accepted = [d for d in divisors(head_dim) if d % 2 == 0]
    if not is_count(rope_dims) or rope_dims not in accepted:
        raise ExportError(
            f"--rope-dims {rope_dims!r}: DeepSeek's rotary key keeps every (head_dim / D)-th frequency pair, so D "
            f"must be even and divide head_dim {head_dim}; accepted: {', '.join(map(str, accepted))}"
        )
    if not is_count(kv_rank, 1, width):
        raise ExportError(
            f"--kv-rank {kv_rank!r}: must be an integer from 1 to the width {width} (at {width} the latent is exact)"
        )
    plan = DecoderPlan(
        layers=len(attentions),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        width=width,
        mlp=mlps.pop(),
        scaling=float(first.scaling),
        eps=eps,
        input_norms=tuple(norms),
        post_norms=tuple(posts),
        final_norm=_norm_scale(final, "model.norm", eps),
        embed_scale=_embedding_scale(model, embed, layers[0]),
        hidden_act=act,
        query_bias=any(biases[0::4]),
        attention_bias=any(biases),
    )
    _check_frequencies(model, deepseek_config(model, plan, kv_rank, rope_dims), _kept_pairs(plan, rope_dims))
    return plan


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _sliding(config: Any) -> bool:
    """Whether a decoder's config makes some layer attend within a sliding window shorter than its context."""
    window = getattr(config, "sliding_window", None)
    if window is None or window >= getattr(config, "max_position_embeddings", window + 1):
        return False
    types = getattr(config, "layer_types", None)
    return types is None or "sliding_attention" in types


def _norm_scale(norm: nn.Module, path: str, eps: float) -> torch.Tensor:
    """The per-channel scale an RMSNorm applies to ``x / rms(x)``, read off what it computes on a
    probe: its ``weight`` (LLaMA) or ``1 + weight`` (Gemma); anything else is refused."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ExportError(f"module '{path}' ({type(norm).__name__}) is not an RMSNorm with a weight per channel")
    probe = torch.randn(4, weight.numel(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = norm(probe.to(weight.device, weight.dtype)).double().cpu()
    normed = probe.double() * torch.rsqrt(probe.double().pow(2).mean(-1, keepdim=True) + eps)
    tolerance = max(1e-4, 8 * torch.finfo(weight.dtype).eps)
    for scale in (weight.detach().double().cpu(), 1 + weight.detach().double().cpu()):
        if torch.allclose(out, normed * scale, rtol=tolerance, atol=tolerance):
            return scale
    raise ExportError(
        f"module '{path}' ({type(norm).__name__}) computes neither weight * x / rms(x) nor (1 + weight) * x / rms(x) "
        f"with eps {eps}, the RMSNorms DeepSeek's format holds"
    )


def _embedding_scale(model: nn.Module, embed: nn.Embedding, first_layer: nn.Module) -> float:
    """The number the decoder multiplies its embedding table's rows by before the first layer (1
    for LLaMA, sqrt(width) for Gemma, inside its embedding module), read off one probing forward
    pass stopped at that layer."""
    seen: dict[str, torch.Tensor] = {}

    def hook(_module, args, kwargs):
        seen["hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        raise _Stop

    ids = torch.tensor([[0, 1]], device=embed.weight.device)
    handle = first_layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(ids)
    except _Stop:
        pass
    finally:
        handle.remove()
    tokens = nn.functional.embedding(ids, embed.weight.detach()).double()  # the table: a scale in the module counts
    hidden = seen["hidden"].double()
    scale = ((hidden * tokens).sum() / (tokens * tokens).sum()).item()
    if not torch.allclose(hidden, scale * tokens, rtol=1e-3, atol=1e-6):
        raise ExportError(
            f"{type(model).__name__}: its first layer does not read the token embeddings times one number; "
            "DeepSeek's format cannot hold what it adds"
        )
    return scale


@dataclass
class _Layer:
    """One source layer's attention in the unit-RMS input space (the input norm's scale folded
    into every projection), float64: Q, K, V and O weights and biases."""

    q: torch.Tensor  # (heads, head_dim, width)
    k: torch.Tensor  # (kv_heads, head_dim, width)
    v: torch.Tensor  # (kv_heads, head_dim, width)
    o: torch.Tensor  # (width, heads * head_dim)
    q_bias: torch.Tensor | None  # (heads, head_dim)
    k_bias: torch.Tensor | None  # (kv_heads, head_dim)
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None

    @classmethod
    def read(cls, attn: LibraryModule, norm: torch.Tensor, plan: DecoderPlan) -> _Layer:
        def weight(linear: nn.Linear, heads: int) -> torch.Tensor:
            return (linear.weight.detach().double().cpu() * norm).view(heads, plan.head_dim, plan.width)

        def bias(linear: nn.Linear, heads: int) -> torch.Tensor | None:
            return None if linear.bias is None else linear.bias.detach().double().cpu().view(heads, plan.head_dim)

        return cls(
            q=weight(attn.q_proj, plan.heads),
            k=weight(attn.k_proj, plan.kv_heads),
            v=weight(attn.v_proj, plan.kv_heads),
            o=attn.o_proj.weight.detach().double().cpu(),
            q_bias=bias(attn.q_proj, plan.heads),
            k_bias=bias(attn.k_proj, plan.kv_heads),
            v_bias=bias(attn.v_proj, plan.kv_heads),
            o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach().double().cpu(),
        )


def _kept_pairs(plan: DecoderPlan, rope_dims: int) -> torch.Tensor:
    """The source's frequency pairs DeepSeek's rotary key of ``rope_dims`` dimensions turns at
    their own frequency: every (head_dim / rope_dims)-th, from the highest frequency."""
    return torch.arange(rope_dims // 2) * (plan.head_dim // rope_dims)


def _folded_pairs(plan: DecoderPlan, rope_dims: int, fold: int) -> torch.Tensor:
    """The source's frequency pairs each pair of DeepSeek's rotary key holds (FreqFold), (rope_dims
    / 2, fold): a kept pair and the ``fold - 1`` lower frequencies after it, all turned at the kept
    pair's frequency. With ``fold`` 1 the kept pair alone; pairs in no group join the latent unrotated."""
    return _kept_pairs(plan, rope_dims).unsqueeze(1) + torch.arange(fold)


def default_fold(model: LibraryModule, plan: DecoderPlan, rope_dims: int) -> int:
    """How many neighbouring frequency pairs each pair of the rotary key holds by default: the
    kept pair and those after it, up to the next kept one, that turn at least :data:`FOLD_RATIO`
    times as fast as it does in every group (the source's own frequencies, ``inv_freq``). Rotated at
    the kept pair's frequency, a much slower pair is worse off than unrotated (BENCHMARKS.md,
    "MLA in DeepSeek's format": at head_dim 64 folding gains up to 0.5 nats, at head_dim 16, where
    neighbours are 3x apart, it loses up to 0.3)."""
    inv_freq = model.model.rotary_emb.inv_freq.detach().double().cpu()
    kept, fold = _kept_pairs(plan, rope_dims), 1
    while fold < plan.head_dim // rope_dims and (inv_freq[kept + fold] >= FOLD_RATIO * inv_freq[kept]).all():
        fold += 1
    return fold


def principal_directions(covariances: torch.Tensor) -> torch.Tensor:
    """RoRoPE's mix of the K/V heads per pair of the rotary key: for each (n x n) covariance of
    the components it holds (the K/V heads', of each folded frequency: n = kv_heads x folded), its
    principal eigenvector (unit length, its largest entry positive so that a conversion repeats);
    (pairs, n x n) -> (pairs, n)."""
    _, vectors = torch.linalg.eigh(covariances)
    top = vectors[..., -1]
    sign = torch.sign(top.gather(-1, top.abs().argmax(-1, keepdim=True)))
    return top * sign


def _pair_moments(keys: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The second moments of keys (tokens, kv_heads, head_dim) in each rotary pair's folded
    frequencies ``pairs`` (rotary pairs, folded), summed over both components of a frequency pair
    (LLaMA pairs dimension p with p + head_dim / 2): (rotary pairs, n, n), n = kv_heads x folded,
    head by head."""
    half = keys.shape[-1] // 2
    tokens, rotary = keys.shape[0], pairs.shape[0]
    a, b = (keys[:, :, dims].transpose(1, 2).reshape(tokens, rotary, -1) for dims in (pairs, pairs + half))
    return torch.einsum("tpg,tph->pgh", a, a) + torch.einsum("tpg,tph->pgh", b, b)


def _weight_moments(layer: _Layer, pairs: torch.Tensor) -> torch.Tensor:
    """The keys' moments of :func:`_pair_moments` for a white unit-RMS input, from the weights
    alone: E[k k^T] = W W^T + b b^T, one "token" per input direction and the bias."""
    keys = [layer.k.permute(2, 0, 1)]  # (width, kv_heads, head_dim)
    if layer.k_bias is not None:
        keys.append(layer.k_bias.unsqueeze(0))
    return _pair_moments(torch.cat(keys), pairs)


def _key_moments(model: LibraryModule, plan: DecoderPlan, pairs: torch.Tensor, calibration: Sequence[Any]) -> list:
    """Per layer, :func:`_pair_moments` of the keys the source computes on ``calibration``
    (``k_proj``'s output: before RoPE, which turns all heads alike), summed over its tokens."""
    layers = model.model.layers
    n = plan.kv_heads * pairs.shape[1]
    totals = [torch.zeros(len(pairs), n, n, dtype=torch.float64) for _ in layers]

    def record(i: int) -> Callable:
        def hook(_module, _inputs, out):
            totals[i] += _pair_moments(out.detach().double().cpu().reshape(-1, plan.kv_heads, plan.head_dim), pairs)

        return hook

    run_calibration(
        model, calibration, [x.self_attn.k_proj.register_forward_hook(record(i)) for i, x in enumerate(layers)]
    )
    return totals


def _latent_rms(model: LibraryModule, plan: DecoderPlan, downs: list[torch.Tensor], calibration: Sequence[Any]) -> list:
    """Per layer, the mean RMS of the latent ``down @ x̂`` over the calibration tokens (1 without
    them: ``x̂`` has unit RMS and ``down`` orthonormal rows), the weight ``kv_a_layernorm`` gets.
    A token whose hidden state is zero (a padding row as transformers initialises it) is left out:
    its latent is zero whatever the weight, and counted it pulled an exact conversion's 1 down."""
    if not calibration:
        return [1.0] * len(downs)
    sums, counts = [0.0] * len(downs), [0] * len(downs)

    def record(i: int) -> Callable:
        def hook(_module, args):
            h = args[0].detach().double().cpu().reshape(-1, plan.width)
            unit = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + plan.eps)
            latent = (unit @ downs[i].T)[h.pow(2).sum(-1) > 0]
            sums[i] += latent.pow(2).mean(-1).sqrt().sum().item()
            counts[i] += len(latent)

        return hook

    layers = model.model.layers
    run_calibration(
        model, calibration, [x.input_layernorm.register_forward_pre_hook(record(i)) for i, x in enumerate(layers)]
    )
    return [s / n if n else 1.0 for s, n in zip(sums, counts)]


def _interleave(first: torch.Tensor, second: torch.Tensor, dim: int) -> torch.Tensor:
    """A pair's two components side by side along ``dim`` (DeepSeek's ``rope_interleave``
    layout): (..., pairs, ...) twice -> (..., 2 pairs, ...)."""
    return torch.stack([first, second], dim=dim + 1).flatten(dim, dim + 1)


def _attention_tensors(
    layer: _Layer, plan: DecoderPlan, pairs: torch.Tensor, mix: torch.Tensor, kv_rank: int, balance: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One layer's DeepSeek attention weights from its source attention, by RoRoPE with the
    mix ``mix`` (rotary pairs, kv_heads x folded) of the frequency pairs ``pairs`` (rotary pairs,
    folded; :func:`_folded_pairs`) and a rank-``kv_rank`` latent (module docstring), and the
    latent's down projection in the unit-RMS input space (the latent norm's weight is its mean
    RMS on data, measured with it)."""
    half, rope_dims = plan.head_dim // 2, 2 * len(pairs)
    mix = mix.view(len(pairs), plan.kv_heads, -1).transpose(0, 1)  # (kv_heads, rotary pairs, folded)
    group = torch.arange(plan.heads) // (plan.heads // plan.kv_heads)  # each query head's K/V head
    scale = plan.scaling * (plan.head_dim + rope_dims) ** 0.5  # DeepSeek's score scale -> the source's

    def shared(k: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:  # (kv_heads, head_dim, ...) -> (rotary pairs, ...)
        return torch.einsum("gpf,gpf...->p...", mix, k[:, dims])

    def rotary_key(k: torch.Tensor) -> torch.Tensor:  # (kv_heads, head_dim, ...) -> (rope_dims, ...)
        return _interleave(shared(k, pairs), shared(k, pairs + half), 0)

    def residual_key(k: torch.Tensor) -> torch.Tensor:  # each head's key less its share of the rotary key
        rest = k.clone()
        weights = mix.reshape(*mix.shape, *[1] * (k.dim() - 2))
        for dims in (pairs, pairs + half):
            rest[:, dims] = k[:, dims] - weights * shared(k, dims).unsqueeze(1)
        return rest

    def query(q: torch.Tensor) -> torch.Tensor:  # (heads, head_dim, ...) -> (heads, head_dim + rope_dims, ...)
        def along(dims: torch.Tensor) -> torch.Tensor:  # each head's part of its K/V head's principal directions
            return torch.einsum("hpf,hpf...->hp...", mix[group], q[:, dims])

        return torch.cat([q, _interleave(along(pairs), along(pairs + half), 1)], dim=1) * scale

    keys, values = residual_key(layer.k).flatten(0, 1), layer.v.flatten(0, 1)
    stacked = torch.cat([keys, values])  # (2 kv_heads head_dim, width)
    weight = (values.norm() / keys.norm().clamp_min(1e-30)) if balance else 1.0  # BKV: K no louder than V
    _, _, vh = torch.linalg.svd(torch.cat([keys * weight, values]), full_matrices=True)
    down = vh[:kv_rank]  # orthonormal rows: at kv_rank = width, a basis of x̂ itself
    up = (stacked @ down.T).view(2, plan.kv_heads, plan.head_dim, kv_rank)
    tensors = {
        "kv_a_proj_with_mqa.weight": torch.cat([down, rotary_key(layer.k)]),
        "kv_b_proj.weight": torch.cat([up[0][group], up[1][group]], dim=1).flatten(0, 1),
        "o_proj.weight": layer.o,
    }
    q = query(layer.q).flatten(0, 1)
    if plan.query_bias:  # q_a_proj appends a constant 1 to x̂; q_b_proj's last column is the bias
        q_bias = query(layer.q_bias if layer.q_bias is not None else torch.zeros(plan.heads, plan.head_dim))
        eye = torch.eye(plan.width + 1, plan.width, dtype=torch.float64)
        tensors.update(
            {
                "q_a_proj.weight": eye,
                "q_a_proj.bias": torch.eye(plan.width + 1, dtype=torch.float64)[-1],
                "q_a_layernorm.weight": torch.ones(plan.width + 1, dtype=torch.float64),
                "q_b_proj.weight": torch.cat([q, q_bias.flatten().unsqueeze(1)], dim=1),
            }
        )
    else:
        tensors["q_proj.weight"] = q
    if plan.attention_bias:
        rope_bias = rotary_key(layer.k_bias) if layer.k_bias is not None else torch.zeros(rope_dims)
        tensors["kv_a_proj_with_mqa.bias"] = torch.cat([torch.zeros(kv_rank, dtype=torch.float64), rope_bias])
        o_bias = layer.o_bias if layer.o_bias is not None else torch.zeros(plan.width, dtype=torch.float64)
        if layer.v_bias is not None:  # attention weights sum to one: a V bias reaches o_proj unchanged
            o_bias = o_bias + layer.o @ layer.v_bias[group].flatten()
        tensors["o_proj.bias"] = o_bias
    return {name: t.contiguous() for name, t in tensors.items()}, down


def deepseek_config(model: LibraryModule, plan: DecoderPlan, kv_rank: int, rope_dims: int) -> Any:
    """The ``DeepseekV3Config`` of ``model`` converted with ``kv_rank`` and ``rope_dims``: every
    layer dense, the source's vocabulary, context, RoPE parameters and special tokens."""
    from transformers import DeepseekV3Config

    source = model.config
    tied = model.lm_head.weight is model.model.embed_tokens.weight and plan.embed_scale == 1.0
    return DeepseekV3Config(
        vocab_size=source.vocab_size,
        hidden_size=plan.width,
        intermediate_size=plan.mlp,
        num_hidden_layers=plan.layers,
        num_attention_heads=plan.heads,
        num_key_value_heads=plan.heads,
        first_k_dense_replace=plan.layers,  # every layer dense: no MoE block is built
        num_mtp_layers=0,
        kv_lora_rank=kv_rank,
        q_lora_rank=plan.width + 1 if plan.query_bias else None,
        qk_rope_head_dim=rope_dims,
        qk_nope_head_dim=plan.head_dim,
        v_head_dim=plan.head_dim,
        hidden_act=plan.hidden_act,
        max_position_embeddings=source.max_position_embeddings,
        initializer_range=getattr(source, "initializer_range", 0.02),
        rms_norm_eps=plan.eps,
        tie_word_embeddings=tied,
        rope_parameters=dict(source.rope_parameters),
        rope_interleave=True,
        attention_bias=plan.attention_bias,
        attention_dropout=float(getattr(source, "attention_dropout", 0.0) or 0.0),
        bos_token_id=source.bos_token_id,
        eos_token_id=source.eos_token_id,
        pad_token_id=source.pad_token_id,
    )


def to_deepseek(
    model: LibraryModule,
    kv_rank: int,
    rope_dims: int,
    calibration: Sequence[Any] = (),
    *,
    fold: int | None = None,
    balance_kv: bool = True,
) -> nn.Module:
    """A ``DeepseekV3ForCausalLM`` (stock transformers, every layer dense) computing what the
    LLaMA-style ``model`` computes, its attention converted to MLA with a ``kv_rank`` latent and a
    ``rope_dims`` rotary key shared by all heads, by RoRoPE on ``calibration`` (the model's
    inputs; without them, the weights alone) (module docstring). ``model`` is left as it was. A
    model or option DeepSeek's format cannot hold is an ExportError before any work
    (:func:`check_deepseek`). ``fold``: how many neighbouring frequency pairs each rotary pair
    holds (FreqFold, 1 to head_dim / rope_dims; by default :func:`default_fold`); ``balance_kv``:
    the latent's basis from K scaled to V's size (TransMLA's BKV; off: a plain SVD of the stack). Layer by layer:
    beside the two models, memory holds one layer's float64 working copies."""
    from transformers import DeepseekV3ForCausalLM

    plan = check_deepseek(model, kv_rank, rope_dims)
    if fold is not None and not is_count(fold, 1, plan.head_dim // rope_dims):
        raise ExportError(
            f"fold {fold!r}: must be an integer from 1 to head_dim / rope_dims = {plan.head_dim // rope_dims}"
        )
    reference = next(model.parameters())
    if reference.is_meta:
        raise ExportError(f"{type(model).__name__}: on the meta device; converting needs its weights")
    pairs = _folded_pairs(plan, rope_dims, fold or default_fold(model, plan, rope_dims))
    moments = _key_moments(model, plan, pairs, calibration) if calibration else None
    with torch.device(reference.device):
        new = DeepseekV3ForCausalLM(deepseek_config(model, plan, kv_rank, rope_dims)).to(reference.dtype)

    def load(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:  # strict: every parameter, right shapes
        module.load_state_dict({name: t.to(reference.dtype) for name, t in tensors.items()})

    downs = []
    for i, (source, target) in enumerate(zip(model.model.layers, new.model.layers)):
        layer = _Layer.read(source.self_attn, plan.input_norms[i], plan)
        mix = principal_directions(moments[i] if moments is not None else _weight_moments(layer, pairs))
        attention, down = _attention_tensors(layer, plan, pairs, mix, kv_rank, balance_kv)
        downs.append(down)
        mlp = {f"mlp.{name}.weight": getattr(source.mlp, name).weight.detach() for name in _MLP}
        load(
            target,
            {
                **{f"self_attn.{name}": t for name, t in attention.items()},
                "self_attn.kv_a_layernorm.weight": torch.ones(kv_rank),  # the latent's RMS, measured below
                "input_layernorm.weight": torch.ones(plan.width),  # folded into the projections
                "post_attention_layernorm.weight": plan.post_norms[i],
                **mlp,
            },
        )
    for target, rms in zip(new.model.layers, _latent_rms(model, plan, downs, calibration)):
        with torch.no_grad():
            target.self_attn.kv_a_layernorm.weight.fill_(rms)
    load(new.model.embed_tokens, {"weight": model.model.embed_tokens.weight.detach().double() * plan.embed_scale})
    load(new.model.norm, {"weight": plan.final_norm})
    load(new.lm_head, {"weight": model.lm_head.weight.detach()})  # tied: the embeddings, loaded twice alike
    new.train(model.training)
    if getattr(model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(model.generation_config)
    return new


def _check_frequencies(source: LibraryModule, config: Any, pairs: torch.Tensor) -> None:
    """Refuse a conversion whose rotary key would not turn at the kept pairs' own frequencies: what
    DeepSeek's rotary embedding computes from ``config`` (built alone, with no layers), against
    the source's frequencies at ``pairs``."""
    from transformers import DeepseekV3Model

    bare = copy.deepcopy(config)
    bare.num_hidden_layers, bare.vocab_size, bare.hidden_size, bare.intermediate_size = 0, 1, 1, 1
    bare.pad_token_id = None  # a pad token of the source's vocabulary lies outside the bare one
    ours, theirs = source.model.rotary_emb, DeepseekV3Model(bare).rotary_emb
    expected = ours.inv_freq.detach().double().cpu()[pairs]
    got = theirs.inv_freq.detach().double().cpu()
    scales = (float(getattr(ours, "attention_scaling", 1.0)), float(getattr(theirs, "attention_scaling", 1.0)))
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-6) or scales != (1.0, 1.0):
        raise ExportError(
            f"{type(source).__name__}: DeepSeek's rotary embedding of {2 * len(pairs)} dimensions does not turn at "
            "the kept pairs' frequencies with these rope_parameters"
        )


def check_hf_output(out: str | Path, what: str = "--out") -> Path:
    """Check, before any work, that a model folder can be written at ``out``: a folder (or none
    yet) not under a file, and new, empty, or a folder graphkit wrote (its config.json carries
    graphkit's mark), so that a user's checkpoint is never replaced."""
    path = check_output_dir(out, what, kind="model-folder")
    if path.is_dir() and any(path.iterdir()) and not written_by_graphkit_folder(path):
        raise OutputError(
            f"{what} {path}: exists and was not written by graphkit; refusing to write a model folder over it "
            "(remove it, or choose another name)"
        )
    return path


def written_by_graphkit_folder(path: str | Path) -> bool:
    """Whether ``path`` is a model folder graphkit wrote: its config.json holds graphkit's mark of
    a model folder (a ``graphkit`` key transformers keeps as a config attribute and writes back)."""
    return graphkit_kind(Path(path) / "config.json") == "model-folder"


def check_stock(model: nn.Module) -> None:
    """Refuse a model no stock transformers class would compute from its saved folder: one that is
    not a transformers model, or holds graphkit's own attention (anything but GQA, which runs in
    the model's own modules)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise ExportError(f"{type(model).__name__}: not a transformers model; --format graphkit writes it")
    for path, module in model.named_modules():
        if type(module).__module__.startswith("graphkit.") and getattr(module, "variant", None) != "gqa":
            raise ExportError(
                f"{type(model).__name__}: module '{path}' is graphkit's {type(module).__name__}, which no stock "
                "transformers class computes; --format graphkit writes it (convert -a mla --format hf writes "
                "DeepSeek's MLA)"
            )


def hf_info(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """What a conversion's metadata (``graphkit_attention``, ``graphkit_kv_heads``, ... as a
    safetensors file holds it, strings) says, for a model folder's config.json: the names without
    the prefix, the values parsed where they are JSON (numbers, the groups)."""
    info = {}
    for key, value in metadata.items():
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        info[key.removeprefix("graphkit_")] = value
    return info


def save_hf(model: LibraryModule, out: str | Path, info: dict[str, Any], *, in_place: bool = False) -> Path:
    """Write ``model`` (a transformers model) as ``save_pretrained`` does (config.json, the
    safetensors weights, generation_config.json when it has one) into the folder ``out``,
    atomically, with graphkit's mark in config.json: ``"graphkit": {"version": ..., **info}``
    (what was converted, and how). The folder is replaced whole after :func:`check_hf_output`,
    or, ``in_place`` (a run folder, checked by its own rules), file by file."""
    from transformers.utils import logging

    if not in_place:
        check_hf_output(out)
    check_stock(model)

    def write(staging: Path) -> None:
        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # "Writing model shards" is noise in a command's output
        try:
            model.save_pretrained(staging)
        finally:
            if shown:
                logging.enable_progress_bar()
        config = json.loads((staging / "config.json").read_text())
        earlier = config.get(MARK) if isinstance(config.get(MARK), dict) else {}  # a folder graphkit wrote, trained
        config[MARK] = {**earlier, **info, "kind": "model-folder", "version": version()}
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return write_folder(out, write, in_place=in_place)

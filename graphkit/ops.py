"""The op vocabulary of graphkit graphs.

Every node of an :class:`~graphkit.ArchGraph` carries one op from :data:`OPS`, or
``other:<aten op>`` for an ATen op outside the vocabulary (kept, never dropped). The
vocabulary is versioned: ops are only ever appended, so an op's integer id (its index in
:data:`OPS`, used by ``to_pyg()`` and by hypernetworks) never changes meaning; bump
:data:`OPS_VERSION` with every addition.

:data:`GHN3_PRIMITIVES` maps each op to the closest GHN-3 / DeepNets-1M primitive, so that
graphs can be fed to GHN-style models. ``None`` means GHN-3 has no such primitive: the node is
folded into its predecessor (activations) or carries no parameters GHN-3 would predict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPS_VERSION = 4

#: op name -> one-line meaning. The order is the op id and is append-only.
OP_DOCS: dict[str, str] = {
    "input": "the model input (token ids or images); one per graph",
    "output": "the model output; every returned tensor feeds it",
    "linear": "affine map x W^T + b (nn.Linear, HF Conv1D, F.linear, addmm with a weight)",
    "head": "output head: a linear layer with no parametric layer after it (classifier, LM head)",
    "patch_embed": "patch-embedding convolution (stride == kernel size, no padding)",
    "conv": "any other convolution",
    "embedding": "token embedding lookup",
    "pos_embedding": "learned positional embedding (lookup of positions, or x + P with a parameter P)",
    "class_token": "learned tokens prepended to the sequence (class, distillation, register tokens)",
    "layer_norm": "LayerNorm",
    "rms_norm": "RMSNorm (and L2 normalisation, which differs from it by the constant sqrt(width))",
    "attention": "scaled dot-product attention core; attrs heads, kv_heads, head_dim, causal, window",
    "rotary_embedding": "rotary position embedding (RoPE) tables, applied inside attention",
    "alibi": "ALiBi attention bias",
    "gelu": "GELU activation (exact or tanh approximation)",
    "silu": "SiLU / swish activation (and hard swish, its piecewise-linear form)",
    "relu": "ReLU activation",
    "tanh": "tanh activation",
    "add": "elementwise sum of two activations (residual connection)",
    "mul": "elementwise product of two activations (gating, e.g. SwiGLU)",
    "concat": "concatenation of activations",
    "mean_pool": "mean over tokens or positions (global average pooling)",
    "softcap": "logit soft-capping c * tanh(x / c)",
    "moe_router": "top-k selection outside a mixture-of-experts block (inside one it is part of the moe node)",
    "scale": "elementwise product with a learned parameter (layer scale)",
    "bias": "addition of a learned 1-D parameter",
    "softmax": "softmax outside attention (e.g. router probabilities)",
    "sigmoid": "sigmoid activation (and hard sigmoid, its piecewise-linear form)",
    "other": "catch-all id for ops written as 'other:<aten op>'",
    # version 2
    "moe": (
        "mixture-of-experts block: router, top-k gating and experts as one node; attrs num_experts, top_k, "
        "intermediate_size"
    ),
    "roll": "cyclic shift of tokens along spatial dims (torch.roll; Swin's shifted windows); attrs shifts",
    "pad": "constant padding of activations (F.pad; Swin pads to a multiple of the window with zeros); attrs pad, "
    "and value where the fill is not zero (since v3)",
    # version 3: what timm's hierarchical and hybrid ViTs add (the zoo datasets)
    "batch_norm": "BatchNorm: normalisation by running statistics with a learned scale and shift",
    "group_norm": "GroupNorm: normalisation over groups of channels",
    "avg_pool": "average pooling over windows of positions; attrs kernel and stride, or output_size (adaptive)",
    "max_pool": "max pooling over windows of positions, or the max over dims; attrs kernel and stride, output_size "
    "or dim",
    "sum_pool": "sum over tokens or positions (SwiftFormer's global query); attrs dim",
    "interpolate": "resampling of a feature map or a grid of position embeddings (F.interpolate); attrs mode",
    "unfold": "sliding-window patches laid out as channels (F.unfold, im2col: TNT, VOLO); attrs kernel, stride",
    "fold": "sliding-window patches summed back into a map (F.fold, col2im: VOLO); attrs kernel, stride",
    "sub": "elementwise difference of two activations (PoolFormer's pool(x) - x)",
    "div": "elementwise quotient of two activations (division by a computed norm)",
    "clamp": "clamping of activations to a range (ReLU6, hard tanh, a norm's floor)",
    "norm": "vector norm of activations along a dim (L2 normalisation)",
    "matmul": "product of two activations as matrices outside softmax attention (linear attention's K^T V)",
    "ssm": "recurrent token mixer as one node, with its module's projections and convolution: a state-space "
    "model or linear recurrence (Mamba's selective scan, gated DeltaNet, RG-LRU, RWKV's time mixing, xLSTM)",
    "square": "elementwise square of activations (squared ReLU)",
    "softplus": "softplus activation",
    # version 4: what transformers' decoders add (the zoo-decoders dataset)
    "pow": "elementwise power of activations by a constant other than 2 (sqrt, rsqrt, reciprocal); attrs exponent",
    "std": "standard deviation of activations along a dim (Gemma 3n's activation-sparsity threshold)",
    "xielu": "xIELU activation (Apertus): a piecewise quadratic/exponential unit with learned slopes",
}

OPS: tuple[str, ...] = tuple(OP_DOCS)
#: how many ops each vocabulary version has: a version-v reader (a hypernetwork checkpoint)
#: understands the first VOCABULARY_SIZES[v] ids, whose meaning never changes
VOCABULARY_SIZES: dict[int, int] = {1: 29, 2: 32, 3: 48, 4: 51}
OP_IDS: dict[str, int] = {op: i for i, op in enumerate(OPS)}

#: graphkit op -> GHN-3 primitive (ppuda's PRIMITIVES_DEEPNETS1M), None where GHN-3 has none.
GHN3_PRIMITIVES: dict[str, str | None] = {
    "input": "input",
    "output": None,
    "linear": "conv",
    "head": "conv",
    "patch_embed": "conv",
    "conv": "conv",
    "embedding": "conv",
    "pos_embedding": "pos_enc",
    "class_token": "pos_enc",
    "layer_norm": "ln",
    "rms_norm": "ln",
    "attention": "msa",
    "rotary_embedding": "pos_enc",
    "alibi": "pos_enc",
    "gelu": None,
    "silu": None,
    "relu": None,
    "tanh": None,
    "add": "sum",
    "mul": "cse",
    "concat": "concat",
    "mean_pool": "glob_avg",
    "softcap": None,
    "moe_router": None,
    "scale": "bias",
    "bias": "bias",
    "softmax": None,
    "sigmoid": None,
    "other": None,
    "moe": None,
    "roll": None,
    "pad": None,
    "batch_norm": "bn",
    "group_norm": "ln",
    "avg_pool": "avg_pool",
    "max_pool": "max_pool",
    "sum_pool": None,
    "interpolate": None,
    "unfold": None,
    "fold": None,
    "sub": None,
    "div": None,
    "clamp": None,
    "norm": None,
    "matmul": None,
    "ssm": None,
    "square": None,
    "softplus": None,
    "pow": None,
    "std": None,
    "xielu": None,
}


def op_id(op: str) -> int:
    """Integer id of ``op``; every ``other:<aten op>`` shares the id of ``other``."""
    if op.startswith("other:"):
        return OP_IDS["other"]
    try:
        return OP_IDS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}") from None


def vocabulary_markdown() -> str:
    """The vocabulary as a Markdown table (id, op, meaning, GHN-3 primitive): docs/vocabulary.md."""
    lines = [
        f"# Op vocabulary, version {OPS_VERSION}",
        "",
        "Generated by `graphkit ops --markdown`; ids are append-only. An ATen op outside the",
        "vocabulary is kept as `other:aten.<op>` and shares the id of `other`. The GHN-3 column maps",
        "each op to the closest primitive of GHN-3 / DeepNets-1M (`-`: none; activations fold into",
        "the preceding node there).",
        "",
        "| id | op | meaning | GHN-3 primitive |",
        "|---|---|---|---|",
    ]
    for i, op in enumerate(OPS):
        lines.append(f"| {i} | `{op}` | {OP_DOCS[op]} | {GHN3_PRIMITIVES[op] or '-'} |")
    return "\n".join(lines) + "\n"


def is_known_op(op: str) -> bool:
    """True for a vocabulary op or an ``other:<aten op>`` fallback."""
    return op in OP_IDS or (op.startswith("other:") and len(op) > 6)


def window_text(window: int | list[int]) -> str:
    """An attention window for people: a sliding window's size, or an image window's sides (7×7)."""
    return "×".join(map(str, window)) if isinstance(window, (list, tuple)) else str(window)


def attention_kind(attrs: Mapping[str, Any]) -> str:
    """MHA, MQA or GQA from an attention node's head counts, or its recorded variant (e.g. KDGQA),
    with MLA's latent rank and decoupled rotary dimensions, which set its cache."""
    heads, kv = attrs.get("heads"), attrs.get("kv_heads")
    kind = str(attrs.get("variant") or "").upper() or ("MHA" if kv == heads else "MQA" if kv == 1 else "GQA")
    ranks = [f"{name}={attrs[name]}" for name in ("kv_rank", "rope_dims") if attrs.get(name)]
    return f"{kind}({', '.join(ranks)})" if ranks else kind

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

import torch
from torch import nn

OPS_VERSION = 1

#: op name -> one-line meaning. The order is the op id and is append-only.
OP_DOCS: dict[str, str] = {
    "input": "the model input (token ids or images); one per graph",
    "output": "the model output; every returned tensor feeds it",
    "linear": "affine map x W^T + b (nn.Linear, HF Conv1D, F.linear, addmm with a weight)",
    "head": "output head: a linear layer whose result is a model output (classifier, LM head)",
    "patch_embed": "patch-embedding convolution (stride == kernel size, no padding)",
    "conv": "any other convolution",
    "embedding": "token embedding lookup",
    "pos_embedding": "learned positional embedding (lookup of positions, or x + P with a parameter P)",
    "class_token": "learned tokens prepended to the sequence (class, distillation, register tokens)",
    "layer_norm": "LayerNorm",
    "rms_norm": "RMSNorm",
    "attention": "scaled dot-product attention core; attrs heads, kv_heads, head_dim, causal, window",
    "rotary_embedding": "rotary position embedding (RoPE) tables, applied inside attention",
    "alibi": "ALiBi attention bias",
    "gelu": "GELU activation (exact or tanh approximation)",
    "silu": "SiLU / swish activation",
    "relu": "ReLU activation",
    "tanh": "tanh activation",
    "add": "elementwise sum of two activations (residual connection)",
    "mul": "elementwise product of two activations (gating, e.g. SwiGLU)",
    "concat": "concatenation of activations",
    "mean_pool": "mean over tokens or positions (global average pooling)",
    "softcap": "logit soft-capping c * tanh(x / c)",
    "moe_router": "mixture-of-experts routing: top-k selection over router logits",
    "scale": "elementwise product with a learned parameter (layer scale)",
    "bias": "addition of a learned 1-D parameter",
    "softmax": "softmax outside attention (e.g. router probabilities)",
    "sigmoid": "sigmoid activation",
    "other": "catch-all id for ops written as 'other:<aten op>'",
}

OPS: tuple[str, ...] = tuple(OP_DOCS)
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
}


def op_id(op: str) -> int:
    """Integer id of ``op``; every ``other:<aten op>`` shares the id of ``other``."""
    if op.startswith("other:"):
        return OP_IDS["other"]
    try:
        return OP_IDS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; known ops: {', '.join(OPS)}") from None


def is_known_op(op: str) -> bool:
    """True for a vocabulary op or an ``other:<aten op>`` fallback."""
    return op in OP_IDS or (op.startswith("other:") and len(op) > 6)


# ---------------------------------------------------------------------------------------------
# How the tracer names what it sees. Whole modules first: every ATen op inside one call of a
# module listed here becomes one node (an HF NewGELU is eight ATen ops, an RMSNorm six).

_MODULE_TYPES: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Linear, "linear"),
    (nn.Embedding, "embedding"),
    (nn.LayerNorm, "layer_norm"),
    (nn.Conv1d, "conv"),
    (nn.Conv2d, "conv"),
    (nn.Conv3d, "conv"),
    (nn.GELU, "gelu"),
    (nn.SiLU, "silu"),
    (nn.ReLU, "relu"),
    (nn.Tanh, "tanh"),
    (nn.Sigmoid, "sigmoid"),
)
if hasattr(nn, "RMSNorm"):
    _MODULE_TYPES += ((nn.RMSNorm, "rms_norm"),)

# Library classes that do not derive from the torch ones, matched by class name so that
# graphkit needs no import of every library (transformers' Conv1D, LlamaRMSNorm, ...).
_MODULE_NAME_RULES: tuple[tuple[str, str], ...] = (
    ("rmsnorm", "rms_norm"),
    ("layernorm", "layer_norm"),
    ("rotary", "rotary_embedding"),
    ("alibi", "alibi"),
    ("gelu", "gelu"),
    ("silu", "silu"),
    ("swish", "silu"),
)
_MODULE_EXACT_NAMES = {"Conv1D": "linear"}  # transformers.pytorch_utils.Conv1D (GPT-2)


def module_op(module: nn.Module) -> str | None:
    """The op a whole module call becomes, or None if its inside should be traced op by op."""
    for cls, op in _MODULE_TYPES:
        if isinstance(module, cls):
            if op == "conv" and _is_patchify(module):
                return "patch_embed"
            return op
    name = type(module).__name__
    if name in _MODULE_EXACT_NAMES:
        return _MODULE_EXACT_NAMES[name]
    lowered = name.lower().replace("_", "")
    for needle, op in _MODULE_NAME_RULES:
        if needle in lowered:
            return op
    return None


def _is_patchify(conv: nn.Module) -> bool:
    kernel, stride = tuple(conv.kernel_size), tuple(conv.stride)
    padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
    return kernel == stride and kernel != (1,) * len(kernel) and padding in ((0,) * len(kernel), "valid")


# ATen ops outside those modules. Shape-only ops pass their input through and make no node.
SHAPE_ONLY_ATEN: frozenset[str] = frozenset(
    {
        "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "expand_as",
        "contiguous", "clone", "alias", "detach", "unsqueeze", "squeeze", "flatten", "unflatten",
        "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "narrow", "getitem",
        "to", "_to_copy", "type_as", "dropout", "feature_dropout", "alpha_dropout", "lift_fresh_copy",
        "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "copy",
        "repeat", "repeat_interleave", "index_select", "movedim", "as_strided", "identity",
    }
)

#: ATen ops the tracer names directly (all other ops are decided by context in trace.py).
ATEN_OPS: dict[str, str] = {
    "linear": "linear",
    "addmm": "linear",
    "embedding": "embedding",
    "layer_norm": "layer_norm",
    "native_layer_norm": "layer_norm",
    "rms_norm": "rms_norm",
    "conv1d": "conv",
    "conv2d": "conv",
    "conv3d": "conv",
    "convolution": "conv",
    "gelu": "gelu",
    "silu": "silu",
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "softmax": "softmax",
    "_softmax": "softmax",
    "_safe_softmax": "softmax",
    "topk": "moe_router",
    "cat": "concat",
    "concat": "concat",
    "mean": "mean_pool",
}

#: ATen ops that are the core of an attention computation.
SDPA_ATEN: frozenset[str] = frozenset(
    {
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward",
        "_efficient_attention_forward",
        "flex_attention",
    }
)
MATMUL_ATEN: frozenset[str] = frozenset({"matmul", "bmm", "mm", "einsum", "baddbmm"})


def aten_name(target: object) -> str:
    """Short ATen name of an FX call target: ``aten.view.default`` -> ``view``."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    return getattr(target, "__name__", str(target))


#: ATen ops whose result depends on their input's shape only, never its values.
SHAPE_DEPENDENT_ATEN: frozenset[str] = frozenset(
    {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
     "new_zeros", "new_ones", "new_empty", "new_full", "sym_size", "sym_numel", "sym_stride"}
)


def is_float(value: object) -> bool:
    """True for a floating or complex tensor (activations), or a tuple holding one (``topk``);
    False for ints, bools and others."""
    if isinstance(value, (tuple, list)):
        return any(is_float(v) for v in value)
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())

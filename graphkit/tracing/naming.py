"""How the tracer names what it sees: which modules become one node, which ATen ops are the
vocabulary's ops, which only move data, and which are attention cores.

Whole modules first: every ATen op inside one call of a module that :func:`module_op` names, or
whose class name claims an op (:func:`claimed_op`) that its call could compute
(:func:`could_compute`), becomes one node (an HF NewGELU is eight ATen ops, an RMSNorm six). The op names themselves
live in :mod:`graphkit.ops`, which the hypernetwork imports without the tracer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphkit.compat import aten_name

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
# graphkit needs no import of every library (transformers' Conv1D, LlamaRMSNorm, ...). A class
# from one of KNOWN_LIBRARIES is what its name says; any other class's name is only a claim
# (:func:`claimed_op`), which the tracer checks against what the call computes.
_MODULE_NAME_RULES: tuple[tuple[str, str], ...] = (
    ("rmsnorm", "rms_norm"),
    ("layernorm", "layer_norm"),
    ("rotary", "rotary_embedding"),
    ("alibi", "alibi"),
    ("gelu", "gelu"),
    ("silu", "silu"),
    ("swish", "silu"),
    ("xielu", "xielu"),  # Apertus' xIELU, a piecewise activation with learned slopes
    # L2 normalisation (nGPT, Dory): an RMSNorm up to the constant sqrt(width)
    ("l2norm", "rms_norm"),
    # recurrent token mixers (transformers' hybrid and recurrent decoders), each one node
    ("mambamixer", "ssm"),  # Mamba, FalconMamba, Jamba, Zamba
    ("mamba2mixer", "ssm"),  # Mamba-2, Nemotron-H
    ("mambalayer", "ssm"),  # Granite hybrid
    ("bambamixer", "ssm"),
    ("falconh1mixer", "ssm"),
    ("gateddeltanet", "ssm"),  # Qwen3-Next, Qwen3.5, OLMo hybrid
    ("deltaattention", "ssm"),  # Kimi Linear, Bailing hybrid
    ("rglru", "ssm"),  # RecurrentGemma
    ("rwkvselfattention", "ssm"),  # RWKV's time mixing
    ("xlstmbackend", "ssm"),  # xLSTM's mLSTM cell
)
#: the child that holds a mixture's experts, by the convention of transformers and hand-written code
EXPERTS_CHILD = "experts"

_MODULE_EXACT_NAMES = {"Conv1D": "linear"}  # transformers.pytorch_utils.Conv1D (GPT-2)

#: the top-level packages whose classes graphkit knows by identity: their names are what they
#: compute (transformers' remote code loads as ``transformers_modules``, which is not one of them)
KNOWN_LIBRARIES: frozenset[str] = frozenset({"torch", "transformers", "timm"})
#: ATen ops one of which any norm computes: a reduction over the features
NORM_REDUCTIONS: frozenset[str] = frozenset(
    {"mean", "var", "var_mean", "std", "sum", "norm", "linalg_vector_norm"}
    | {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"}
)


def module_op(module: nn.Module) -> str | None:
    """The op a whole module call becomes, or None if its inside should be traced op by op (or
    checked against the op its class name claims, :func:`claimed_op`)."""
    for cls, op in _MODULE_TYPES:
        if isinstance(module, cls):
            if op == "conv" and _is_patchify(module):
                return "patch_embed"
            return op
    if type(module).__module__.partition(".")[0] not in KNOWN_LIBRARIES:
        return None
    name = type(module).__name__
    return _MODULE_EXACT_NAMES.get(name) or _named_op(name)


def claimed_op(module: nn.Module) -> str | None:
    """The op a class from outside :data:`KNOWN_LIBRARIES` claims by its name (a hand-written
    ``RMSNorm``, ``RotaryEmbedding``, ``AlibiAttention``): a claim only, which the tracer accepts
    when the call computes that op (:func:`could_compute`), because a name is no evidence that
    ``class PreLayerNormBlock`` is one norm."""
    if type(module).__module__.partition(".")[0] in KNOWN_LIBRARIES:
        return None
    return _named_op(type(module).__name__)


def could_compute(op: str, module: nn.Module, inside: list[tuple[str, bool]]) -> bool:
    """Whether a call of ``module``, whose ATen ops are ``inside`` (each op's name and whether it
    reads a parameter or the model's input, directly or through other ops), can be the single op
    ``op`` that the module's class name claims. Every op a name can claim (a norm, an activation,
    a rotary or ALiBi table, a recurrent mixer) is one that mixes no tokens and no features
    through a weight: so no parameter above one dimension, no attention core and no softmax, and
    no matrix product, linear, convolution or lookup of the input or a parameter (a rotary table's
    product of constant positions and frequencies is none). A norm also reduces over features."""
    if any(param.dim() > 1 for param in module.parameters()):
        return False
    for name, reads_content in inside:
        if name in SDPA_ATEN or ATEN_OPS.get(name) == "softmax":
            return False
        if reads_content and (name in MATMUL_ATEN or ATEN_OPS.get(name) in ("linear", "conv", "embedding")):
            return False
    return op not in ("layer_norm", "rms_norm") or any(name in NORM_REDUCTIONS for name, _ in inside)


def _named_op(class_name: str) -> str | None:
    lowered = class_name.lower().replace("_", "")
    for needle, op in _MODULE_NAME_RULES:
        if needle in lowered:
            return op
    return None


def _is_patchify(conv: Any) -> bool:  # a convolution module, read by its attributes
    kernel, stride = tuple(conv.kernel_size), tuple(conv.stride)
    padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
    return kernel == stride and kernel != (1,) * len(kernel) and padding in ((0,) * len(kernel), "valid")


# ATen ops outside those modules. Shape-only ops pass their input through and make no node.
SHAPE_ONLY_ATEN: frozenset[str] = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "permute",
        "transpose",
        "t",
        "numpy_T",  # x.T
        "mT",  # x.mT, the last two dimensions swapped
        "swapaxes",  # aliases of transpose and movedim, which torch.export keeps by their own names
        "swapdims",
        "moveaxis",
        "expand",
        "expand_as",
        "contiguous",
        "clone",
        "alias",
        "detach",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "slice",
        "select",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "narrow",
        "getitem",
        "to",
        "_to_copy",
        "type_as",
        "dropout",
        "feature_dropout",
        "alpha_dropout",
        "lift_fresh_copy",
        "_assert_tensor_metadata",
        "_assert_scalar",
        "sym_constrain_range_for_size",
        "copy",
        "repeat",
        "repeat_interleave",
        "index_select",
        "index",
        "movedim",
        "as_strided",
        "identity",
        "reshape_as",
        "view_as",
        "flip",  # a reversal is a gather with fixed indices, as index_select is
        "view_as_complex",  # the same values read as complex numbers (Llama 4's rotary) and back
        "view_as_real",
    }
)

#: ATen ops that place one tensor's values into another (``x[idx] = y``, ``torch.scatter``,
#: what slice assignment becomes): data movement, so the result carries both inputs' sources
PLACE_ATEN: frozenset[str] = frozenset(
    {
        "index_put",
        "_index_put_impl",
        "index_copy",
        "index_fill",
        "index_add",
        "masked_scatter",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "slice_scatter",
        "select_scatter",
        "diagonal_scatter",
        "as_strided_scatter",
    }
)

#: ATen ops the tracer names directly (all other ops are decided by context in :mod:`graphkit.tracing.builder`).
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
    "conv_transpose1d": "conv",
    "conv_transpose2d": "conv",
    "conv_transpose3d": "conv",
    "gelu": "gelu",
    "silu": "silu",
    "hardswish": "silu",  # x * relu6(x + 3) / 6, swish's piecewise-linear form (MobileNetV3, LeViT, PP-LCNet)
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "hardsigmoid": "sigmoid",  # relu6(x + 3) / 6, sigmoid's piecewise-linear form (squeeze-excitation gates)
    "softmax": "softmax",
    "_softmax": "softmax",
    "_safe_softmax": "softmax",
    "topk": "moe_router",
    "cat": "concat",
    "concat": "concat",
    "stack": "concat",
    "mean": "mean_pool",
    "batch_norm": "batch_norm",
    "native_batch_norm": "batch_norm",
    "_native_batch_norm_legit": "batch_norm",
    "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm",
    "group_norm": "group_norm",
    "native_group_norm": "group_norm",
    "sub": "sub",  # of two activations: a parameter or a constant on one side is decided before
    "rsub": "sub",
    "div": "div",
    "true_divide": "div",
    "clamp": "clamp",
    "clamp_min": "clamp",
    "clamp_max": "clamp",
    "hardtanh": "clamp",
    "linalg_vector_norm": "norm",
    "norm": "norm",
    "square": "square",
    "softplus": "softplus",
    "std": "std",
}

#: ATen spellings that are another op's alias (``torch.multiply`` is ``torch.mul``)
_ALIASES: dict[str, str] = {
    "multiply": "mul",
    "subtract": "sub",
    "divide": "div",
    "concatenate": "cat",
    "negative": "neg",
    "absolute": "abs",
    "greater": "gt",
    "less": "lt",
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


#: ATen ops whose result depends on their input's shape only, never its values.
SHAPE_DEPENDENT_ATEN: frozenset[str] = frozenset(
    {
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "sym_size",
        "sym_numel",
        "sym_stride",
    }
)


def functional_name(target: object) -> str:
    """The ATen name of an FX call target with in-place variants mapped to their out-of-place
    op (``add_`` -> ``add``, ``masked_fill_`` -> ``masked_fill``) and aliases to the op they
    name (``multiply`` -> ``mul``, ``concatenate`` -> ``cat``): the graph records what is
    computed, not whether a buffer was reused (Falcon's parallel block adds in place) or which
    spelling the code chose (Zamba concatenates, Gemma 3n multiplies)."""
    name = aten_name(target)
    name = name[:-1] if name.endswith("_") and not name.endswith("__") and len(name) > 1 else name
    return _ALIASES.get(name, name)


def in_module(scope: str, path: str) -> bool:
    """Whether the module path ``scope`` is the module ``path`` or inside it."""
    return scope == path or scope.startswith(path + ".")


def moves_data(name: str, value: object) -> bool:
    """True for an op that only moves data or computes no activation (shape-only ops, writes of
    one tensor into another, integer and boolean results such as indices and masks): it passes its
    inputs through and makes no node."""
    return name in SHAPE_ONLY_ATEN or name in PLACE_ATEN or not is_float(value)


def is_float(value: object) -> bool:
    """True for a floating or complex tensor (activations), or a tuple holding one (``topk``);
    False for ints, bools and others."""
    if isinstance(value, (tuple, list)):
        return any(is_float(v) for v in value)
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())

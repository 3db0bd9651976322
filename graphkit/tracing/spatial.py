"""Ops on the token grid that the vocabulary names from their arguments: ``torch.roll``
(Swin's shifted windows), zero padding (Swin pads the grid to a multiple of its window), an
adaptive average pool to one position (a global average pool, as HF's Swin and MaxViT end), and
what hierarchical and hybrid ViTs add: windowed and adaptive pools (``avg_pool``, ``max_pool``
with their kernel and stride or output size), a max or sum over dims (``max_pool`` and
``sum_pool`` with ``dim``: Hiera pools its mask units by a max), resampling (``interpolate`` with
its mode: CrossViT resizes its position grid) and sliding-window patches (``unfold`` and
``fold``, im2col and col2im: TNT, VOLO).

Roll and pad are vocabulary ops (``roll`` with attr ``shifts``, ``pad`` with attr ``pad``),
because where a model shifts or pads its windows is architecture. A roll by zero or a pad by
zero computes nothing (Swin calls ``F.pad`` whether or not its grid needs it) and makes no node,
as a reshape makes none. Since vocabulary 3 a constant pad with another fill is a ``pad`` too,
with attr ``value`` (NesT pads with -inf before max-pooling, EfficientViT's linear attention
with ones; an infinite fill is the string "-inf" or "inf", which JSON can hold); a pad that is
not constant (reflect, replicate) stays ``other:aten.pad``. An adaptive average pool to size 1 is
the mean over the pooled dims: ``mean_pool`` with those ``dim``, as ``x.mean(dim)`` gives.
"""

from __future__ import annotations

import math
from typing import Any, cast

from torch import fx

from graphkit.tracing.naming import functional_name

_PAD_ATEN = frozenset({"pad", "constant_pad_nd"})
_ADAPTIVE_AVG_POOL_ATEN = {
    "adaptive_avg_pool1d": 1,
    "adaptive_avg_pool2d": 2,
    "_adaptive_avg_pool2d": 2,
    "adaptive_avg_pool3d": 3,
    "_adaptive_avg_pool3d": 3,
}  # name -> pooled dims
_AMOUNT = {"roll": "shifts", "pad": "pad"}  # op -> the attr (and ATen argument) of its amounts
#: windowed pools and sliding-window patches: ATen name -> (op, argument index of the kernel, of
#: the stride); ``im2col(x, kernel, dilation, padding, stride)``, ``col2im(x, output_size, kernel,
#: dilation, padding, stride)``, pools ``(x, kernel, stride, ...)``
_WINDOWED = {
    **dict.fromkeys(("avg_pool1d", "avg_pool2d", "avg_pool3d"), ("avg_pool", 1, 2)),
    **dict.fromkeys(
        ("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices"),
        ("max_pool", 1, 2),
    ),
    "im2col": ("unfold", 1, 4),
    "unfold": ("unfold", 2, 3),  # Tensor.unfold(dim, size, step): windows along one dim (a short convolution's)
    "col2im": ("fold", 2, 5),
}
#: adaptive pools to a size other than one position: ATen name -> op; attr output_size (arg 1)
_ADAPTIVE = {
    **dict.fromkeys(_ADAPTIVE_AVG_POOL_ATEN, "avg_pool"),
    **dict.fromkeys(("adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"), "max_pool"),
}
#: reductions over given dims: ATen name -> op; attr dim (arg 1)
_REDUCTIONS = {"amax": "max_pool", "max": "max_pool", "sum": "sum_pool"}


def spatial_op(node: fx.Node) -> str | None:
    """The vocabulary op a grid op is (module docstring), whatever its amounts, else None."""
    name = functional_name(node.target)
    if name == "roll":
        return "roll"
    if name in _PAD_ATEN and _pads_constant(node):
        return "pad"
    if name in _ADAPTIVE_AVG_POOL_ATEN and _pools_to_one(node):
        return "mean_pool"
    if name in _WINDOWED:
        return _WINDOWED[name][0]
    if name in _ADAPTIVE:
        return _ADAPTIVE[name]
    if name in _REDUCTIONS and _dims(node) is not None:
        return _REDUCTIONS[name]
    if name.startswith(("upsample_", "_upsample_")):
        return "interpolate"
    return None


def is_identity(node: fx.Node) -> bool:
    """True for a roll or zero pad by nothing: it passes its input through and makes no node."""
    op = spatial_op(node)
    return op in _AMOUNT and not any(spatial_attrs(node, op)[_AMOUNT[op]])


def spatial_attrs(node: fx.Node, op: str) -> dict[str, Any]:
    """``{"shifts": [...]}`` for a roll (one shift per rolled dim), ``{"pad": [...]}`` for a pad
    (F.pad's order: last dim first, (before, after) for each), ``{"dim": [...]}`` for an adaptive
    pool (the last dims of its input)."""
    name = functional_name(node.target)
    if op == "mean_pool":
        rank = cast(fx.Node, node.args[0]).meta["val"].dim()
        return {"dim": list(range(rank - _ADAPTIVE_AVG_POOL_ATEN[name], rank))}
    if name in _WINDOWED:
        _, at_kernel, at_stride = _WINDOWED[name]
        kernel = _ints(node.args[at_kernel])
        stride = _ints(node.args[at_stride]) if len(node.args) > at_stride and node.args[at_stride] else kernel
        return {"kernel": kernel, "stride": stride}  # a pool's stride defaults to its kernel
    if name in _ADAPTIVE:
        return {"output_size": _ints(node.args[1])}
    if name in _REDUCTIONS:
        return {"dim": _dims(node)}
    if op == "interpolate":  # upsample_bicubic2d, _upsample_bilinear2d_aa, upsample_nearest2d, ...
        return {"mode": name.lstrip("_").removeprefix("upsample_").rstrip("123d").removesuffix("_aa")}
    amount: Any = node.args[1] if len(node.args) > 1 else node.kwargs[_AMOUNT[op]]
    attrs: dict[str, Any] = {_AMOUNT[op]: _ints(amount)}
    value = _pad_value(node) if op == "pad" else None
    if value:  # NesT pads with -inf before a max pool: the fill is architecture
        attrs["value"] = value if math.isfinite(value) else str(value)
    return attrs


def _ints(value: Any) -> list[int]:
    """An ATen size argument (an int or a list of ints) as a list."""
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _dims(node: fx.Node) -> list[int] | None:
    """The dims a reduction (``amax``, ``max``, ``sum``) runs over, as non-negative ints; None for
    a reduction over everything or ``max`` of two tensors (elementwise)."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dim is None or isinstance(dim, fx.Node) or dim == []:
        return None
    rank = cast(fx.Node, node.args[0]).meta["val"].dim()
    return [d % rank for d in _ints(dim)]


def _pad_value(node: fx.Node) -> float | None:
    """The fill of F.pad (``aten.pad(x, pad, mode, value)``) or ``constant_pad_nd(x, pad, value)``;
    None for a pad that is not constant (reflect, replicate, circular) or fills with a tensor."""
    name = functional_name(node.target)
    args = list(node.args[2:])
    if name == "pad":
        mode = args[0] if args else node.kwargs.get("mode", "constant")
        value = args[1] if len(args) > 1 else node.kwargs.get("value")
    else:
        mode, value = "constant", args[0] if args else node.kwargs.get("value", 0)
    if mode != "constant" or not isinstance(value, (int, float, type(None))):  # a tensor (an fx Node) is no fill
        return None
    return float(value or 0)


def _pads_constant(node: fx.Node) -> bool:
    return _pad_value(node) is not None


def _pools_to_one(node: fx.Node) -> bool:
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    return all(side == 1 for side in (size if isinstance(size, (list, tuple)) else [size]))

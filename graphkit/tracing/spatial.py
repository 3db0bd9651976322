"""Ops on the token grid that the vocabulary names from their arguments: ``torch.roll``
(Swin's shifted windows), zero padding (Swin pads the grid to a multiple of its window) and an
adaptive average pool to one position (a global average pool, as HF's Swin and MaxViT end).

Roll and pad are vocabulary ops (``roll`` with attr ``shifts``, ``pad`` with attr ``pad``),
because where a model shifts or pads its windows is architecture. A roll by zero or a pad by
zero computes nothing (Swin calls ``F.pad`` whether or not its grid needs it) and makes no node,
as a reshape makes none. A pad that is not zero padding (reflect, replicate, another value)
stays ``other:aten.pad``: the vocabulary op means zeros. An adaptive average pool to size 1 is
the mean over the pooled dims: ``mean_pool`` with those ``dim``, as ``x.mean(dim)`` gives.
"""

from __future__ import annotations

from typing import Any

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


def spatial_op(node: fx.Node) -> str | None:
    """``roll``, ``pad`` or ``mean_pool`` for an op that is one (whatever its amounts), else None."""
    name = functional_name(node.target)
    if name == "roll":
        return "roll"
    if name in _PAD_ATEN and _pads_zeros(node):
        return "pad"
    if name in _ADAPTIVE_AVG_POOL_ATEN and _pools_to_one(node):
        return "mean_pool"
    return None


def is_identity(node: fx.Node) -> bool:
    """True for a roll or zero pad by nothing: it passes its input through and makes no node."""
    op = spatial_op(node)
    return op in _AMOUNT and not any(spatial_attrs(node, op)[_AMOUNT[op]])


def spatial_attrs(node: fx.Node, op: str) -> dict[str, Any]:
    """``{"shifts": [...]}`` for a roll (one shift per rolled dim), ``{"pad": [...]}`` for a pad
    (F.pad's order: last dim first, (before, after) for each), ``{"dim": [...]}`` for an adaptive
    pool (the last dims of its input)."""
    if op == "mean_pool":
        rank = node.args[0].meta["val"].dim()
        return {"dim": list(range(rank - _ADAPTIVE_AVG_POOL_ATEN[functional_name(node.target)], rank))}
    amount = node.args[1] if len(node.args) > 1 else node.kwargs[_AMOUNT[op]]
    return {_AMOUNT[op]: [int(a) for a in amount] if isinstance(amount, (list, tuple)) else [int(amount)]}


def _pads_zeros(node: fx.Node) -> bool:
    """F.pad (``aten.pad(x, pad, mode, value)``) or ``constant_pad_nd(x, pad, value)`` with zeros."""
    name = functional_name(node.target)
    args = list(node.args[2:])
    if name == "pad":
        mode = args[0] if args else node.kwargs.get("mode", "constant")
        value = args[1] if len(args) > 1 else node.kwargs.get("value")
        return mode == "constant" and not value
    value = args[0] if args else node.kwargs.get("value", 0)
    return not value


def _pools_to_one(node: fx.Node) -> bool:
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    return all(side == 1 for side in (size if isinstance(size, (list, tuple)) else [size]))

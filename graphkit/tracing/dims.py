"""Where each dimension of a tensor comes from, so that an attention's heads are counted from
what its tensors hold rather than from their rank or layout.

A query may hold its heads in one dimension (``(b, h, t, d)``), in two (grouped heads written
``(b, g, r, t, d)``), folded into the batch for ``bmm`` (``(b * h, t, d)``, reshaped there from
``(b, h, t, d)`` or, as ``nn.MultiheadAttention`` does, from ``(t, b, h * d)``), or in an einsum
letter. What is common to all of them: heads are the factors of the query's dimensions that were
carved out of the features of the projection that computed it. So :func:`dimension_origins`
walks back from a tensor to where its values were computed (a ``linear``, a matrix product, a
convolution), through ops that only move data and ops that keep the shape (rotary application, a
per-head norm, scaling); there the channel axis is ``FEATURES`` and every other axis
``POSITIONS`` (batch, tokens, image windows); then it replays the walk's ops forward, splitting,
merging and reordering those factors as the reshapes did, and marking as ``COPIES`` what
``expand``, ``repeat`` or ``repeat_interleave`` made (GQA's ``repeat_kv``). The attention rules
(:mod:`graphkit.tracing.attention`) count query heads as the feature factors of the query's
dimensions other than its tokens and per-head features, and K/V heads as V's (copies excluded:
they are the distinct K/V slices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import fx

from graphkit.tracing.naming import PLACE_ATEN, SHAPE_ONLY_ATEN, functional_name, is_float

FEATURES, POSITIONS, COPIES = "features", "positions", "copies"
#: one dimension: its factors (size, origin), outermost first; a dimension of size 1 has none
Factors = list[tuple[int, str]]

#: ops whose values are computed from features rather than moved: where a walk back stops
_PROJECTIONS = {"linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "einsum", "embedding"}
_CONVOLUTIONS = {"conv1d", "conv2d", "conv3d", "convolution", "_convolution"}
#: ops that regroup dimensions without reordering them (row-major reshapes, size-1 dims)
_REGROUP = {"view", "_unsafe_view", "reshape", "reshape_as", "view_as", "flatten", "unflatten", "squeeze", "unsqueeze"}
#: ops that reorder dimensions
_REORDER = {"permute", "transpose", "t", "numpy_T", "mT", "movedim", "moveaxis", "swapaxes", "swapdims"}
#: multi-output ops whose outputs are pieces of their input along one dimension
_SPLITS = {"split", "split_with_sizes", "chunk", "unbind", "unsafe_split", "unsafe_chunk", "tensor_split"}
#: ops that reduce some dimensions and keep the rest (a max-pool over query units, Hiera's)
_REDUCTIONS = {"amax", "amin", "max", "min", "mean", "sum", "prod", "logsumexp", "std", "var"}
#: ops that work on each channel alone, over the spatial dimensions after (batch, channels): pooling
_PER_CHANNEL = {
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
}
#: at most this many ops between a tensor and where its values were computed
_MAX_STEPS = 64


class Untraced(Exception):
    """An op whose effect on the dimensions is not followed (``as_strided``, a reshape that cuts
    across factors, a gather by a tensor of indices): the message names it."""


def dimension_origins(node: fx.Node) -> list[Factors]:
    """Each dimension of ``node``'s value as its factors with their origin (``FEATURES``,
    ``POSITIONS``, ``COPIES``). Raises :class:`Untraced` where the walk back meets an op it
    does not follow."""
    path: list[tuple[fx.Node, fx.Node]] = []  # (op, the input its dimensions come from)
    current = node
    for _ in range(_MAX_STEPS):
        previous = _followed_input(current)
        if previous is None:
            break
        path.append((current, previous))
        current = previous
    else:
        raise Untraced(f"more than {_MAX_STEPS} ops")
    origins = _computed_origins(current)
    for op, source in reversed(path):
        origins = _carried(op, source, origins)
    return origins


def count(origins: list[Factors], dims: tuple[int, ...], origin: str = FEATURES) -> int:
    """The product of the factors of ``origin`` in dimensions ``dims``."""
    return math.prod(size for d in dims for size, kind in origins[d] if kind == origin)


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    value = node.meta.get("val")
    return tuple(int(s) for s in value.shape) if isinstance(value, torch.Tensor) else None


def _followed_input(node: fx.Node) -> fx.Node | None:
    """The input whose dimensions ``node``'s value carries, or None where its values were
    computed (a projection, an op that changes the shape of every input, a program input)."""
    if node.op != "call_function":
        return None
    shape = _shape(node)
    name = functional_name(node.target)
    if name == "getitem":
        producer = node.args[0]
        if not isinstance(producer, fx.Node) or not isinstance(producer.args[0], fx.Node):
            return None
        if functional_name(producer.target) in _SPLITS:
            return producer.args[0]
        node, name = producer, functional_name(producer.target)  # one output of a multi-output op
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if name in _PER_CHANNEL or name in _CONVOLUTIONS and _depthwise(node) or _reduction(node):
        return first
    if name in _PROJECTIONS or name in _CONVOLUTIONS:
        return None
    if name in PLACE_ATEN:  # rows placed by routing (JetMoE's mixture of query projections)
        raise Untraced(f"aten.{name}")
    if name == "copy":  # copy(destination, source): the source's values
        return node.args[1] if len(node.args) > 1 and isinstance(node.args[1], fx.Node) else None
    if name in SHAPE_ONLY_ATEN:
        return first
    if name in ("cat", "concat"):
        pieces = node.args[0] if node.args and isinstance(node.args[0], (list, tuple)) else ()
        return next((p for p in pieces if isinstance(p, fx.Node) and is_float(p.meta.get("val"))), None)
    # an op that keeps the shape (scaling, rotary application, a norm): its input of that shape
    return next((a for a in node.all_input_nodes if is_float(a.meta.get("val")) and _shape(a) == shape), None)


def _reduction(op: fx.Node) -> bool:
    """A reduction over some dimensions named by ``dim`` (not an elementwise ``max`` of two tensors)."""
    dim = op.args[1] if len(op.args) > 1 else op.kwargs.get("dim")
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return functional_name(op.target) in _REDUCTIONS and bool(dims) and all(isinstance(d, int) for d in dims)


def _depthwise(conv: fx.Node) -> bool:
    """Whether a convolution filters each channel alone (MViT pools its queries so): weights of
    one input channel per group, as many channels out as in."""
    weight = conv.args[1] if len(conv.args) > 1 and isinstance(conv.args[1], fx.Node) else None
    shape, out, source = (
        _shape(weight) if weight is not None else None,
        _shape(conv),
        _shape(cast(fx.Node, conv.args[0])),
    )
    return shape is not None and shape[1] == 1 and out is not None and source is not None and out[1] == source[1]


def _computed_origins(node: fx.Node) -> list[Factors]:
    """The origins of a value computed where the walk back stops: the channel axis (dimension 1
    of a convolution's output, the last otherwise; an einsum's letters that only its second
    operand has) is features, every other axis positions. A tensor the program is given (q, k
    and v passed in, a learned query) is read in SDPA's layout: batch, heads, tokens, features."""
    shape = _shape(node)
    if shape is None:
        raise Untraced(f"{node.name}, which is not a tensor")
    name = functional_name(node.target) if node.op == "call_function" else None
    if node.op != "call_function":
        features = {0} if len(shape) == 1 else {len(shape) - 1, *range(1, len(shape) - 2)}
    elif name in _CONVOLUTIONS and len(shape) >= 3:
        features = {1}
    elif name == "einsum":
        features = _einsum_features(node) or {len(shape) - 1}
    else:
        features = {len(shape) - 1}
    return [[(s, FEATURES if d in features else POSITIONS)] if s > 1 else [] for d, s in enumerate(shape)]


def _einsum_features(node: fx.Node) -> set[int]:
    """The output dimensions of an einsum projection that come from its weight (letters its first
    operand lacks: ``btd,dhk->bthk`` makes heads and their features)."""
    letters = einsum_letters(node)
    if letters is None:
        return set()
    (first, _), out = letters
    return {d for d, c in enumerate(out) if c not in first}


def _carried(op: fx.Node, source: fx.Node, origins: list[Factors]) -> list[Factors]:
    """The origins of ``op``'s value, from those of ``source``, the input it carries."""
    out, before = _shape(op), _shape(source)
    name = functional_name(op.target)
    if name == "getitem" and functional_name(cast(fx.Node, op.args[0]).target) not in _SPLITS:
        op = cast(fx.Node, op.args[0])  # the multi-output op whose output this is
        name = functional_name(op.target)
    if out is None or before is None or len(origins) != len(before):
        raise Untraced(f"aten.{name}")
    if name == "as_strided":
        raise Untraced(f"aten.{name}")
    if name in _PER_CHANNEL or name in _CONVOLUTIONS:
        if len(out) != len(before) or out[:2] != before[:2]:
            raise Untraced(f"aten.{name}")
        return origins[:2] + [[(s, POSITIONS)] if s > 1 else [] for s in out[2:]]
    if _reduction(op):
        return _reduced(op, origins, out)
    if name in _REGROUP:
        return _regrouped(origins, out)
    if name in _REORDER:
        return [origins[d] for d in _permutation(op, before)]
    if name in ("expand", "expand_as"):
        return _broadcast(origins, before, out)
    if name == "repeat":
        reps = list(cast(list[int], op.args[1]))
        padded: list[Factors] = [[]] * (len(reps) - len(origins)) + origins
        return [([(r, COPIES)] if r > 1 else []) + o for r, o in zip(reps, padded, strict=True)]
    if name == "repeat_interleave":
        repeats, dim = (list(op.args[1:3]) + [None, None])[:2]
        if not isinstance(repeats, int) or not isinstance(dim, int):
            raise Untraced(f"aten.{name}")
        dim %= len(origins)
        return [o + [(repeats, COPIES)] if d == dim and repeats > 1 else o for d, o in enumerate(origins)]
    if name == "view_as_complex":  # (..., n, 2) read as (..., n) complex numbers
        return origins[:-1]
    if name == "view_as_real":
        return origins + [[(2, origins[-1][-1][1] if origins[-1] else FEATURES)]]
    if len(out) == len(before) - 1:  # select, or one piece of unbind
        return _without_selected(op, origins)
    return _resized(name, origins, before, out)


def _reduced(op: fx.Node, origins: list[Factors], out: tuple[int, ...]) -> list[Factors]:
    """Origins after a reduction over ``dim`` (removed, or kept as size 1 with ``keepdim``)."""
    dim = op.args[1] if len(op.args) > 1 else op.kwargs.get("dim")
    keepdim = op.args[2] if len(op.args) > 2 else op.kwargs.get("keepdim", False)
    reduced = {cast(int, d) % len(origins) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    kept = [[] if d in reduced else o for d, o in enumerate(origins) if keepdim or d not in reduced]
    if len(kept) != len(out):
        raise Untraced(f"aten.{functional_name(op.target)}")
    return kept


def _regrouped(origins: list[Factors], out: tuple[int, ...]) -> list[Factors]:
    """Origins after a row-major reshape to ``out``: the factors in order, split or merged."""
    pending = [f for factors in origins for f in factors]
    result: list[Factors] = []
    for size in out:
        dim: Factors = []
        while size > 1:
            if not pending:
                raise Untraced("a reshape across its factors")
            factor, kind = pending.pop(0)
            if size % factor == 0:
                dim.append((factor, kind))
                size //= factor
            elif factor % size == 0:  # the outer part of a factor this dimension splits off
                dim.append((size, kind))
                pending.insert(0, (factor // size, kind))
                size = 1
            else:
                raise Untraced("a reshape across its factors")
        result.append(dim)
    if pending:
        raise Untraced("a reshape across its factors")
    return result


def _permutation(op: fx.Node, shape: tuple[int, ...]) -> list[int]:
    """For each output dimension of a reordering op, the input dimension it is: the op replayed
    on a meta tensor whose dimensions have distinct sizes."""
    probe = torch.empty(tuple(range(2, len(shape) + 2)), device="meta")
    args = [probe, *op.args[1:]]
    return [s - 2 for s in cast(Callable, op.target)(*args, **op.kwargs).shape]


def _broadcast(origins: list[Factors], before: tuple[int, ...], out: tuple[int, ...]) -> list[Factors]:
    """Origins after ``expand``: dimensions of size 1 (or new ones) grown into copies."""
    padded: list[Factors] = [[]] * (len(out) - len(before)) + origins
    sizes = (1,) * (len(out) - len(before)) + before
    return [o if s == n else [(n, COPIES)] for o, s, n in zip(padded, sizes, out, strict=True)]


def _without_selected(op: fx.Node, origins: list[Factors]) -> list[Factors]:
    """Origins after ``select`` (or a piece of ``unbind``) removed one dimension."""
    name = functional_name(op.target)
    if name == "select":
        dim = op.args[1]
    elif name == "getitem" and functional_name(cast(fx.Node, op.args[0]).target) == "unbind":
        unbind = cast(fx.Node, op.args[0])
        dim = unbind.args[1] if len(unbind.args) > 1 else unbind.kwargs.get("dim", 0)
    else:
        raise Untraced(f"aten.{name}")
    dim = cast(int, dim) % len(origins)
    return origins[:dim] + origins[dim + 1 :]


def _resized(name: str, origins: list[Factors], before: tuple[int, ...], out: tuple[int, ...]) -> list[Factors]:
    """Origins after an op that keeps every dimension but may resize one: a slice, a piece of a
    split, a concatenation with others (it keeps its origin), or a gather by indices that makes
    it longer (``index_select`` with repeated indices: the extra are copies)."""
    changed = [d for d, (a, b) in enumerate(zip(before, out, strict=False)) if a != b]
    if len(before) != len(out) or len(changed) > 1:
        raise Untraced(f"aten.{name}")
    result = list(origins)
    for d in changed:
        kinds = {kind for _, kind in origins[d]}
        if len(kinds) > 1:
            raise Untraced(f"aten.{name}")
        kind = kinds.pop() if kinds else POSITIONS
        if name in ("index", "index_select") and out[d] > before[d]:
            if out[d] % before[d]:
                raise Untraced(f"aten.{name}")
            result[d] = ([(before[d], kind)] if before[d] > 1 else []) + [(out[d] // before[d], COPIES)]
        else:
            result[d] = [(out[d], kind)] if out[d] > 1 else []
    return result


def einsum_letters(node: fx.Node) -> tuple[tuple[str, str], str] | None:
    """The index letters of a two-operand einsum's operands and of its result, an ellipsis
    spelled out as one stand-in letter per dimension it covers; None if the equation cannot be
    read."""
    equation = node.args[0] if node.args else None
    operands = node.args[1] if len(node.args) > 1 else None
    if (
        not isinstance(equation, str)
        or not isinstance(operands, (list, tuple))
        or len(operands) != 2
        or not all(isinstance(o, fx.Node) for o in operands)
    ):
        return None
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    covered = [operand.meta["val"].dim() - len(term.replace("...", "")) for term, operand in zip(terms, operands)]
    stand_ins = "".join(c for c in "0123456789" if c not in equation)[: max(covered)]
    spelled = [term.replace("...", stand_ins[len(stand_ins) - n :]) for term, n in zip(terms, covered)]
    if arrow:
        out = out.replace("...", stand_ins)
    else:  # implicit output: the ellipsis, then the letters used once, in alphabetical order
        letters = "".join(spelled)
        out = stand_ins + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in stand_ins))
    if any(len(term) != operand.meta["val"].dim() for term, operand in zip(spelled, operands)):
        return None
    return (spelled[0], spelled[1]), out


__all__ = ["COPIES", "FEATURES", "POSITIONS", "Untraced", "count", "dimension_origins", "einsum_letters"]

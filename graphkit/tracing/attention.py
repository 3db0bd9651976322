"""Attention becomes one node: where an attention core is, which ops belong to it, and its
attributes (heads, kv_heads, head_dim, causal, window, rope, alibi, softcap, variant, and where
true talking_heads, class_attention, latent_query, shifted).

Each SDPA call, or eager ``softmax(q k^T) v`` pattern, is an anchor; the ops feeding it inside
the same module scope, up to the projections (rotary application, head reshapes, scaling,
masking, GQA K/V repetition, talking-heads maps over the scores), are fused into one
``attention`` node. docs/tracer.md gives the rules with their reasons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from graphkit.trace.naming import MATMUL_ATEN, SDPA_ATEN, SHAPE_ONLY_ATEN, functional_name, is_float
from graphkit.trace.spatial import is_identity, spatial_op

if TYPE_CHECKING:
    from graphkit.trace.builder import _Group

_NORM_ATEN = {"layer_norm", "native_layer_norm", "rms_norm", "group_norm", "batch_norm"}
_PARAM_ATEN = {"linear", "addmm", "embedding", "conv1d", "conv2d", "conv3d", "convolution"} | _NORM_ATEN
_LINEAR_ATEN = {"linear", "addmm"}  # a projection called functionally (SwinV2's F.linear(x, qkv.weight))
_SOFTMAX_ATEN = {"softmax", "_softmax", "_safe_softmax"}
# ops an eager attention passes through between q k^T, softmax and the product with v
_ATTN_PASS = SHAPE_ONLY_ATEN | {"mul", "div", "add", "sub", "where", "masked_fill", "tanh", "clamp", "_to_copy"}


class AttentionRules:
    """The attention half of the graph builder (:class:`graphkit.trace.builder._GraphBuilder`),
    which provides ``model``, ``groups``, ``prod``, ``param_names``, ``INPUT``, ``_scope`` and
    ``_leaf``."""

    scores_of: dict[fx.Node, fx.Node]  # eager anchor (the product with V) -> its q k^T product

    def _attention_scope(self, anchor: fx.Node) -> str:
        """The module an attention anchor belongs to. A graphkit attention core (which has an
        ``attention_variant``) is part of the attention module around it: rotary application and
        head reshapes live there, and so do ``is_causal`` and the sliding window."""
        scope = self._scope(anchor)
        try:
            module = self.model.get_submodule(scope)
        except AttributeError:
            return scope
        return scope.rpartition(".")[0] if hasattr(module, "attention_variant") else scope

    # -- attention regions ----------------------------------------------------------------------
    def _attention_regions(self, nodes: list[fx.Node]) -> dict[fx.Node, fx.Node]:
        """Map every FX op that belongs to an attention core to its anchor op. An eager core also
        takes the linear maps it applies to its scores or probabilities (talking heads), with
        their parameters; ``self.scores_of`` keeps its ``q k^T`` product."""
        region_of: dict[fx.Node, fx.Node] = {}
        self.scores_of: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            if node.op != "call_function" or self._leaf(node) is not None:
                continue
            name = functional_name(node.target)
            mixers: set[fx.Node] = set()
            if name in MATMUL_ATEN:
                path = self._eager_path(node)
                if path is None:
                    continue
                self.scores_of[node] = path[-1]
                mixers = {n for n in path if self._is_score_linear(n)}
            elif name not in SDPA_ATEN:
                continue
            scope = self._attention_scope(node)
            region_of[node] = node
            stack = [a for a in node.all_input_nodes]
            while stack:
                u = stack.pop()
                if u in mixers and u not in region_of:  # talking heads: with their parameters
                    region_of[u] = node
                    stack.extend(u.all_input_nodes)
                    continue
                if u in region_of or u.op != "call_function" or self._leaf(u) is not None:
                    continue
                uname = functional_name(u.target)
                if uname in _PARAM_ATEN or any(a.name in self.param_names for a in u.all_input_nodes):
                    continue
                uscope = self._scope(u)
                if scope and not (uscope == scope or uscope.startswith(scope + ".")):
                    continue
                region_of[u] = node
                stack.extend(u.all_input_nodes)
        return region_of

    def _eager_path(self, node: fx.Node) -> list[fx.Node] | None:
        """For a matmul whose left operand is a softmax of a matmul (``softmax(q k^T) v``), the ops
        from it back to ``q k^T``; else None. The path may cross linear maps over the scores
        (talking heads: CaiT mixes the heads before and after the softmax)."""
        probs = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        to_softmax = _path_back(probs, lambda n: functional_name(n.target) in _SOFTMAX_ATEN, self._score_op)
        if to_softmax is None:
            return None
        to_scores = _path_back(to_softmax[-1].args[0], lambda n: functional_name(n.target) in MATMUL_ATEN, self._score_op)
        return None if to_scores is None else [node, *to_softmax, *to_scores]

    def _score_op(self, node: fx.Node) -> bool:
        """Whether an op can lie between ``q k^T``, the softmax and the product with V: masking,
        scaling and reshapes, or a linear module over the (batch, heads, queries, keys) scores."""
        return functional_name(node.target) in _ATTN_PASS or self._is_score_linear(node)

    def _is_score_linear(self, node: fx.Node) -> bool:
        """An op of a linear module over 4-D (batch, heads, queries, keys) scores: talking heads."""
        leaf = self._leaf(node)
        value = node.meta.get("val")
        return leaf is not None and leaf[1] == "linear" and isinstance(value, torch.Tensor) and value.dim() >= 4


    # -- attention attributes -------------------------------------------------------------------
    def _attention_attrs(self, anchor: fx.Node, group: "_Group") -> dict[str, Any]:
        name = functional_name(anchor.target)
        sdpa = name in SDPA_ATEN
        if sdpa:
            q, v = anchor.args[0], anchor.args[2]
            heads_t, value = q.meta["val"], v
            causal = bool(anchor.kwargs.get("is_causal", anchor.args[5] if len(anchor.args) > 5 else False))
        else:
            heads_t, value = anchor.args[0].meta["val"], anchor.args[1]
            causal = False
        v_val = value.meta["val"]
        heads = int(heads_t.shape[-3]) if heads_t.dim() >= 4 else None
        head_dim = int(v_val.shape[-1])
        kv_heads = heads
        if v_val.dim() >= 4:
            kv_heads = round(int(v_val.shape[-3]) * _min_numel_back(value) / v_val.numel())
        try:
            module = self.model.get_submodule(group.module)
        except AttributeError:
            module = None
        if heads is None and module is not None:
            heads = first_attr(module, ("num_heads", "n_head", "num_attention_heads"))
            kv_heads = first_attr(module, ("num_kv_heads", "num_key_value_heads", "n_kv_head")) or heads
        inputs_ops = {self.groups[i].op for i in group.inputs}
        ops_inside = {functional_name(n.target) for n in group.fx}
        # causal: SDPA's flag, the module's own is_causal (HF), or a tril/triu mask built inside
        causal = causal or bool(getattr(module, "is_causal", False)) or bool(ops_inside & {"tril", "triu"})
        query, key = (anchor.args[0], anchor.args[1]) if sdpa else self.scores_of[anchor].args[:2]
        # (queries, keys) per window: SDPA's q and k are (..., length, head_dim), eager probs (..., q, k)
        lengths = (int(query.meta["val"].shape[-2]), int(key.meta["val"].shape[-2])) if sdpa else tuple(
            int(d) for d in heads_t.shape[-2:])
        attrs: dict[str, Any] = {
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "causal": causal,
            "window": _window(self.model, group.module, lengths[1]),
            "rope": "rotary_embedding" in inputs_ops or bool(ops_inside & {"neg", "view_as_complex", "complex"}),
            "alibi": "alibi" in inputs_ops,
            "softcap": "tanh" in ops_inside,
        }
        core = next((m for m in (module.modules() if module is not None else ()) if hasattr(m, "attention_variant")), None)
        if core is not None:  # graphkit.attention: GQA and the key-driven variants
            attrs["variant"] = core.attention_variant
        if group.attrs.get("tied"):
            attrs["tied"] = group.attrs["tied"]
        # the rarer forms are flagged only where they occur, so other graphs keep their attrs
        attrs.update({flag: True for flag, on in self._rarer_forms(group, query, key, lengths, attrs).items() if on})
        return attrs

    def _rarer_forms(self, group: "_Group", query: fx.Node, key: fx.Node, lengths: tuple[int, ...],
                     attrs: dict[str, Any]) -> dict[str, bool]:
        """talking_heads, latent_query, class_attention and shifted (docs/tracer.md says why each
        is read this way), from the ``query`` and ``key`` ops and the (queries, keys) ``lengths``."""
        query_from, key_from = self._sources(query, group), self._sources(key, group)
        from_tokens = self._from_input(query_from)
        same_tokens = bool(query_from & key_from or self._feeds(query_from) & self._feeds(key_from))
        return {
            "talking_heads": any(self._is_score_linear(n) for n in group.fx),
            "latent_query": not from_tokens,
            "class_attention": lengths[0] == 1 < lengths[1] and not attrs["causal"] and from_tokens and same_tokens,
            "shifted": isinstance(attrs["window"], list) and self._rolled(query, group),
        }

    def _rolled(self, query: fx.Node, group: "_Group") -> bool:
        """Whether the tokens were rolled on their grid before being split into windows (Swin's
        shifted windows): a roll by something upstream of the queries, through reshapes,
        padding and the query projection (a module or F.linear). Read off the ops, not off a
        ``shift_size`` attribute: HF's Swin drops the shift at forward time where one window
        covers the grid."""
        inside = set(group.fx)

        def passes(node: fx.Node) -> bool:
            name = functional_name(node.target)
            if node in inside or name in SHAPE_ONLY_ATEN or name in _LINEAR_ATEN or spatial_op(node) == "pad":
                return True
            leaf = self._leaf(node)
            return leaf is not None and leaf[1] == "linear"

        return _path_back(query, _rolls_tokens, passes, depth=32) is not None

    def _sources(self, value: fx.Node, group: "_Group") -> set[int]:
        """The groups outside the attention ``group`` that ``value``, an op inside it, is computed from."""
        inside, seen, found = set(group.fx), set(), set()
        stack = [value]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node in inside:
                stack.extend(node.all_input_nodes)
            else:
                found |= self.prod.get(node, frozenset())
        return found

    def _feeds(self, gids: set[int]) -> set[int]:
        """The groups that feed any of ``gids``."""
        return set().union(*(self.groups[g].inputs for g in gids))

    def _from_input(self, gids: set[int]) -> bool:
        """Whether any of ``gids`` is computed from the model input (not from parameters alone:
        a pooling head's learned latent query is not)."""
        stack, seen = list(gids), set()
        while stack:
            gid = stack.pop()
            if gid == self.INPUT:
                return True
            if gid not in seen:
                seen.add(gid)
                stack.extend(self.groups[gid].inputs)
        return False


def _path_back(start: Any, match: Callable[[fx.Node], bool], passes: Callable[[fx.Node], bool],
               depth: int = 8) -> list[fx.Node] | None:
    """The ops from ``start`` up to the nearest upstream op that matches (both included),
    crossing only ops that ``passes``; None if there is none within ``depth`` steps."""
    if not isinstance(start, fx.Node):
        return None
    came_from: dict[fx.Node, fx.Node | None] = {start: None}
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if n.op != "call_function":
                continue
            if match(n):
                path = [n]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if passes(n):
                for a in n.all_input_nodes:
                    if a not in came_from and is_float(a.meta.get("val")):
                        came_from[a] = n
                        nxt.append(a)
        frontier = nxt
    return None


def _rolls_tokens(node: fx.Node) -> bool:
    return spatial_op(node) == "roll" and not is_identity(node)


def _min_numel_back(value: fx.Node) -> int:
    """Smallest tensor on the shape-only path into ``value``: K/V before any repeat for GQA."""
    best = value.meta["val"].numel()
    cur = value
    while cur.op == "call_function" and functional_name(cur.target) in SHAPE_ONLY_ATEN:
        src = next((a for a in cur.all_input_nodes), None)
        if src is None:
            break
        val = src.meta.get("val")
        if isinstance(val, torch.Tensor):
            best = min(best, val.numel())
        cur = src
    return best


def first_attr(obj: Any, names: Sequence[str]) -> Any:
    """The first of ``names`` that ``obj`` has and is not None (libraries name one setting many ways)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _window(model: nn.Module, path: str, keys: int) -> int | list[int] | None:
    """Window of the attention module at ``path``: a sliding-window size (an int) from its own
    attributes or its HF config, or the sides of the windows an image is partitioned into
    (Swin's [7, 7]), set on the module or the block around it. A partition window counts only
    when it holds exactly the ``keys`` each query sees: BEiT's ``window_size`` is its whole patch
    grid (for a relative-position table) and its queries also see the class token."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    own = first_attr(module, ("sliding_window", "window_size", "window"))
    if isinstance(own, int) and own > 0:
        return own
    return _config_sliding_window(module) or _partition(own, keys) or _partition(
        _nearest_attr(model, path, "window_size"), keys)


def _config_sliding_window(module: nn.Module) -> int | None:
    """The sliding window an HF config gives this layer (respecting ``use_sliding_window`` and
    per-layer ``layer_types``)."""
    config = getattr(module, "config", None)
    size = getattr(config, "sliding_window", None)
    if not isinstance(size, int) or size <= 0 or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    if layer_types and isinstance(idx, int) and idx < len(layer_types):
        return size if "sliding" in str(layer_types[idx]) else None
    return size


def _partition(window: Any, keys: int) -> list[int] | None:
    """``window`` as the sides of an image window of exactly ``keys`` tokens (an int is a square)."""
    sides = [window, window] if isinstance(window, int) else window
    if not isinstance(sides, (tuple, list)) or not sides or not all(isinstance(d, int) and d > 0 for d in sides):
        return None
    return list(sides) if math.prod(sides) == keys else None


def _nearest_attr(model: nn.Module, path: str, name: str) -> Any:
    """Attribute ``name`` of the module at ``path`` or, failing that, of the nearest module
    around it that has it (HF's Swin keeps the window on the block)."""
    while True:
        value = getattr(model.get_submodule(path), name, None)
        if value is not None or not path:
            return value
        path = path.rpartition(".")[0]


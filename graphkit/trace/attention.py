"""Attention becomes one node: where an attention core is, which ops belong to it, and its
attributes (heads, kv_heads, head_dim, causal, window, rope, alibi, softcap, variant).

Each SDPA call, or eager ``softmax(q k^T) v`` pattern, is an anchor; the ops feeding it inside
the same module scope, up to the projections (rotary application, head reshapes, scaling,
masking, GQA K/V repetition), are fused into one ``attention`` node. docs/tracer.md gives the
rules with their reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from graphkit.trace.naming import MATMUL_ATEN, SDPA_ATEN, SHAPE_ONLY_ATEN, functional_name, is_float

if TYPE_CHECKING:
    from graphkit.trace.builder import _Group

_NORM_ATEN = {"layer_norm", "native_layer_norm", "rms_norm", "group_norm", "batch_norm"}
_PARAM_ATEN = {"linear", "addmm", "embedding", "conv1d", "conv2d", "conv3d", "convolution"} | _NORM_ATEN
_SOFTMAX_ATEN = {"softmax", "_softmax", "_safe_softmax"}
# ops an eager attention passes through between q k^T, softmax and the product with v
_ATTN_PASS = SHAPE_ONLY_ATEN | {"mul", "div", "add", "sub", "where", "masked_fill", "tanh", "clamp", "_to_copy"}


class AttentionRules:
    """The attention half of the graph builder (:class:`graphkit.trace.builder._GraphBuilder`),
    which provides ``model``, ``groups``, ``param_names``, ``_scope`` and ``_leaf``."""

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
        """Map every FX op that belongs to an attention core to its anchor op."""
        region_of: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            if node.op != "call_function" or self._leaf(node) is not None:
                continue
            name = functional_name(node.target)
            if not (name in SDPA_ATEN or (name in MATMUL_ATEN and self._is_eager_attention(node))):
                continue
            scope = self._attention_scope(node)
            region_of[node] = node
            stack = [a for a in node.all_input_nodes]
            while stack:
                u = stack.pop()
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

    def _is_eager_attention(self, node: fx.Node) -> bool:
        probs = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        softmax = probs and _find_back(probs, lambda n: functional_name(n.target) in _SOFTMAX_ATEN)
        if softmax is None:
            return False
        scores = _find_back(softmax.args[0], lambda n: functional_name(n.target) in MATMUL_ATEN)
        return scores is not None


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
        attrs: dict[str, Any] = {
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "causal": causal,
            "window": _window(module),
            "rope": "rotary_embedding" in inputs_ops or bool(ops_inside & {"neg", "view_as_complex", "complex"}),
            "alibi": "alibi" in inputs_ops,
            "softcap": "tanh" in ops_inside,
        }
        core = next((m for m in (module.modules() if module is not None else ()) if hasattr(m, "attention_variant")), None)
        if core is not None:  # graphkit.attention: GQA and the key-driven variants
            attrs["variant"] = core.attention_variant
        if group.attrs.get("tied"):
            attrs["tied"] = group.attrs["tied"]
        return attrs


def _find_back(start: Any, match, depth: int = 8) -> fx.Node | None:
    """Search upstream from ``start`` through attention pass-through ops for a node that matches."""
    frontier = [start] if isinstance(start, fx.Node) else []
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if n.op != "call_function":
                continue
            if match(n):
                return n
            if functional_name(n.target) in _ATTN_PASS:
                nxt.extend(a for a in n.all_input_nodes if is_float(a.meta.get("val")))
        frontier = nxt
    return None


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


def _window(module: nn.Module | None) -> int | None:
    """Sliding-window size of an attention module, from its own attributes or its HF config."""
    if module is None:
        return None
    own = first_attr(module, ("sliding_window", "window_size", "window"))
    if isinstance(own, int) and own > 0:
        return own
    config = getattr(module, "config", None)
    size = getattr(config, "sliding_window", None)
    if not isinstance(size, int) or size <= 0 or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    if layer_types and isinstance(idx, int) and idx < len(layer_types):
        return size if "sliding" in str(layer_types[idx]) else None
    return size

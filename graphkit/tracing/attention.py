"""Attention becomes one node: where an attention core is, which ops belong to it, and its
attributes (heads, kv_heads, head_dim, causal, window, rope, alibi, softcap, variant, and where
true talking_heads, class_attention, latent_query, shifted).

Each SDPA call, or eager ``softmax(q k^T) v`` pattern, is an anchor; the ops feeding it inside
the same module scope, up to the projections (rotary application, head reshapes, scaling,
masking, GQA K/V repetition, talking-heads maps over the scores), are fused into one
``attention`` node. docs/tracer.md gives the rules with their reasons.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from graphkit.compat import call_arguments
from graphkit.errors import NeedsValuesError, TraceError
from graphkit.tracing.masks import Unknown, hidden_keys, is_causal_pattern, upstream
from graphkit.tracing.naming import (
    EXPERTS_CHILD,
    MATMUL_ATEN,
    SDPA_ATEN,
    SHAPE_ONLY_ATEN,
    functional_name,
    in_module,
    is_float,
)
from graphkit.tracing.spatial import is_identity, spatial_op
from graphkit.tracing.state import Group

_NORM_ATEN = {"layer_norm", "native_layer_norm", "rms_norm", "group_norm", "batch_norm"}
_PARAM_ATEN = {"linear", "addmm", "embedding", "conv1d", "conv2d", "conv3d", "convolution"} | _NORM_ATEN
_LINEAR_ATEN = {"linear", "addmm"}  # a projection called functionally (SwinV2's F.linear(x, qkv.weight))
_SOFTMAX_ATEN = {"softmax", "_softmax", "_safe_softmax"}
# ops an eager attention passes through between q k^T, softmax and the product with v
_ATTN_PASS = SHAPE_ONLY_ATEN | {"mul", "div", "add", "sub", "where", "masked_fill", "tanh", "clamp", "_to_copy"}
# a concatenation on the scores' way to the softmax: learned sink logits (GPT-OSS), one more
# "key" per head that takes probability and is dropped before the product with V
_ATTN_PASS |= {"cat", "concat"}
# an elementwise max with the dtype's lowest value, where masking adds -inf (XGLM), and the max
# a stable softmax subtracts
_ATTN_PASS |= {"max", "maximum"}
#: ops that give rotary embeddings away: rotate_half's negation, or complex rotation
_ROPE_ATEN = frozenset({"neg", "view_as_complex", "complex"})


@dataclass(frozen=True)
class _Core:
    """An attention core as its anchor shows it: where its queries, keys and values come from,
    its sizes, and what masks it (SDPA's flag and ``attn_mask``, or the eager path from the
    scores to their softmax)."""

    query: fx.Node
    key: fx.Node
    value: fx.Node
    heads: int | None  # None when the heads are folded into the batch (3-D bmm)
    value_heads: int | None  # V's head dimension before any repeat is undone (kv_heads' numerator)
    head_dim: int
    lengths: tuple[int, int]  # (queries, keys) each query sees
    is_causal: bool = False  # SDPA's flag
    mask: fx.Node | None = None  # SDPA's attn_mask
    scores: fx.Node | None = None  # eager: the q k^T product...
    softmax: fx.Node | None = None  # ...and the softmax over it
    readable: bool = True  # False for a kernel whose masking is code, not a tensor (flex_attention's block mask)


class AttentionRules:
    """The attention half of the graph builder (:class:`graphkit.tracing.builder._GraphBuilder`),
    which provides ``model``, ``graph``, ``groups``, ``prod``, ``param_names``, ``aliases``,
    ``constants``, ``INPUT``, ``_scope``, ``_leaf`` and ``_is_parameter``."""

    cores: dict[fx.Node, _Core]  # anchor (SDPA, or the product of probabilities with V) -> its core

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
        their parameters; ``self.cores`` keeps what each anchor's attributes are read from."""
        region_of: dict[fx.Node, fx.Node] = {}
        self.cores: dict[fx.Node, _Core] = {}
        for node in nodes:
            if node.op != "call_function" or self._leaf(node) is not None:
                continue
            name = functional_name(node.target)
            mixers: set[fx.Node] = set()
            path: list[fx.Node] = []  # eager: the ops from q k^T through the softmax to the anchor
            if name in MATMUL_ATEN:
                found = self._eager_core(node)
                if found is None:
                    continue
                self.cores[node], path = found
                mixers = {n for n in path if self._is_score_linear(n)}
            elif name in SDPA_ATEN:
                self.cores[node] = _sdpa_core(node)
            else:
                continue
            scope = self._attention_scope(node)
            experts = f"{scope}.{EXPERTS_CHILD}" if scope else EXPERTS_CHILD
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
                if scope and not in_module(uscope, scope):
                    continue
                if in_module(uscope, experts):  # JetMoE: a mixture of attention heads
                    continue
                region_of[u] = node
                stack.extend(u.all_input_nodes)
                stack.extend(self.aliases.writers(u, node))  # K assembled by copies into slices (DeepSeek-V3)
            for u in self._output_scaling(node, set(path) - {node}, region_of, scope):
                region_of[u] = node
        return region_of

    def _output_scaling(
        self, anchor: fx.Node, inside: set[fx.Node], region_of: dict[fx.Node, fx.Node], scope: str
    ) -> set[fx.Node]:
        """Ops that compute a factor from the scores (``inside``: the ops from ``q k^T`` to the
        product with V) beside the softmax and multiply the attention's output by it, with the
        product: a learned sink applied after the product with V (Granite's
        ``sigmoid(logsumexp(scores) - sink)``, the same extra softmax-denominator logit GPT-OSS
        concatenates). Empty where the scores feed nothing else. A gate computed from the
        queries' projection (Qwen3-Next's gated attention) reads no score and stays its own nodes."""

        branch: set[fx.Node] = set()
        frontier = [(u.meta["_gk_pos"], u) for n in inside for u in n.users if u not in region_of]
        heapq.heapify(frontier)  # in graph order: a node after every input it takes from the branch
        while frontier:
            _, u = heapq.heappop(frontier)
            if u in branch or u.op != "call_function" or self._leaf(u) is not None:
                continue
            if scope and not in_module(self._scope(u), scope):
                return set()
            sources = [
                a for a in u.all_input_nodes if a not in inside and a not in branch and not self._is_parameter(a)
            ]
            if functional_name(u.target) == "mul" and len(sources) == 1:
                output = _path_back(
                    sources[0], lambda n: n is anchor, lambda n: functional_name(n.target) in SHAPE_ONLY_ATEN
                )
                return set() if output is None else branch | set(output[:-1]) | {u}
            if sources:
                return set()
            branch.add(u)
            for user in u.users:
                heapq.heappush(frontier, (user.meta["_gk_pos"], user))
        return set()

    def _eager_core(self, node: fx.Node) -> tuple[_Core, list[fx.Node]] | None:
        """For a matrix product of a softmax of a matrix product with V (``softmax(q k^T) v``,
        spelled with ``@``, ``bmm`` or ``einsum``), its core and the ops from it back to ``q k^T``;
        else None. The path may cross linear maps over the scores (talking heads: CaiT mixes the
        heads before and after the softmax)."""
        operands = _product_operands(node)
        if operands is None:
            return None
        for side, probs in enumerate(operands):
            to_softmax = _path_back(probs, lambda n: functional_name(n.target) in _SOFTMAX_ATEN, self._score_op)
            if to_softmax is None:
                continue
            to_scores = _path_back(
                to_softmax[-1].args[0], lambda n: functional_name(n.target) in MATMUL_ATEN, self._score_op
            )
            core = None if to_scores is None else _eager_layout(node, side, to_softmax[-1], to_scores[-1])
            if core is not None:
                return core, [node, *to_softmax, *to_scores]
        return None

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
    def _attention_attrs(self, anchor: fx.Node, group: Group) -> dict[str, Any]:
        core = self.cores[anchor]
        v_val = core.value.meta["val"]
        heads, kv_heads = core.heads, core.heads
        if core.value_heads is not None:
            kv_heads = round(core.value_heads * _min_numel_back(core.value) / v_val.numel())
        try:
            module = self.model.get_submodule(group.module)
        except AttributeError:
            module = None
        if heads is None and module is not None:
            heads = first_attr(module, ("num_heads", "n_head", "num_attention_heads"))
            kv_heads = first_attr(module, ("num_kv_heads", "num_key_value_heads", "n_kv_head")) or heads
        inputs_ops = {self.groups[i].op for i in group.inputs}
        ops_inside = {functional_name(n.target) for n in group.fx}
        window = _window(self.model, group.module, core.lengths[1])
        attrs: dict[str, Any] = {
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": core.head_dim,
            "causal": self._causal(anchor, core, group, module, window),
            "window": window,
            "rope": "rotary_embedding" in inputs_ops or bool(ops_inside & _ROPE_ATEN) or self._rotates(group.module),
            "alibi": "alibi" in inputs_ops,
            "softcap": "tanh" in ops_inside,
        }
        core_module = next(
            (m for m in (module.modules() if module is not None else ()) if hasattr(m, "attention_variant")), None
        )
        if core_module is not None:  # graphkit.attention: GQA, the key-driven variants, MLA
            attrs["variant"] = core_module.attention_variant
            attrs.update(getattr(core_module, "attention_attrs", {}))  # MLA's kv_rank
        if group.attrs.get("tied"):
            attrs["tied"] = group.attrs["tied"]
        # the rarer forms are flagged only where they occur, so other graphs keep their attrs
        attrs.update(
            {
                flag: True
                for flag, on in self._rarer_forms(group, core.query, core.key, core.lengths, attrs).items()
                if on
            }
        )
        return attrs

    def _causal(
        self, anchor: fx.Node, core: _Core, group: Group, module: nn.Module | None, window: int | list[int] | None
    ) -> bool:
        """Whether no query sees a later key: SDPA's flag, else the values of whatever masks the
        scores (:mod:`graphkit.tracing.masks`). Where those have no values (a mask buffer of a model
        on the meta device), the module's own ``is_causal`` (transformers), a ``tril``/``triu``
        in the mask's ops, or image windows (never causal) decide; with none of them the model
        is refused rather than given a guess."""
        if core.is_causal:
            return True
        if not core.readable:
            return self._causal_without_values(group, module, window, core, "it is a block mask, which is code")
        gid = self.attention_group[anchor]

        def live(node: fx.Node) -> str | None:  # an activation: computed by another node of the graph
            other = self.prod.get(node, frozenset()) - {self.INPUT, gid}
            return None if not other else f"it depends on the output of {self.groups[min(other)].module or 'the model'}"

        try:
            if core.softmax is not None:  # eager: the softmax's input with q and k set to zero
                zeros = {o: _zeros(o) for o in _product_operands(core.scores)}  # baddbmm keeps the mask it adds
                values = self.constants.evaluate(core.softmax.args[0], zeros, live)
                dim = core.softmax.args[1] if len(core.softmax.args) > 1 else -1
                hidden = hidden_keys(values.movedim(dim, -1))
            elif core.mask is not None:
                mask = self.constants.evaluate(core.mask, {}, live)
                hidden = ~mask if mask.dtype == torch.bool else hidden_keys(mask)
            else:
                return False
        except Unknown as e:
            return self._causal_without_values(group, module, window, core, str(e))
        causal = is_causal_pattern(hidden, *core.lengths)
        if causal is None:
            return self._causal_without_values(group, module, window, core, "its shape does not match the scores")
        return causal

    def _causal_without_values(
        self, group: Group, module: nn.Module | None, window: int | list[int] | None, core: _Core, reason: str
    ) -> bool:
        """The fallbacks of :meth:`_causal` where the mask's values cannot be computed."""
        flag = getattr(module, "is_causal", None)
        if isinstance(flag, bool):
            return flag
        mask = core.mask if core.softmax is None else core.softmax.args[0]
        mask_ops = {functional_name(n.target) for n in upstream(mask) if n.op == "call_function"}
        if mask_ops & {"tril", "triu"} or {functional_name(n.target) for n in group.fx} & {"tril", "triu"}:
            return True
        if isinstance(window, list):  # attention inside image windows (Swin's shifted-window mask)
            return False
        error = NeedsValuesError if "meta device" in reason else TraceError
        raise error(
            f"cannot tell whether the attention in module '{group.module or type(self.model).__name__}' "
            f"is causal: its mask cannot be computed ({reason}); build the model on the CPU, or pass "
            "example inputs that hold values"
        )

    def _rotates(self, module: str) -> bool:
        """Whether the attention module ``module`` rotates activations where its node does not
        reach: before a query/key norm, which ends the node (nanochat, Llama 4 rotate, then
        normalise q and k)."""
        return any(in_module(s, module) for s in self._rotating_scopes)

    @functools.cached_property
    def _rotating_scopes(self) -> set[str]:
        """The modules that rotate activations (read once the builder has seen every op)."""
        return {
            self._scope(n)
            for n in self.graph.nodes
            if n.op == "call_function" and functional_name(n.target) in _ROPE_ATEN and self.prod.get(n)
        }

    def _rarer_forms(
        self, group: Group, query: fx.Node, key: fx.Node, lengths: tuple[int, ...], attrs: dict[str, Any]
    ) -> dict[str, bool]:
        """talking_heads, latent_query, class_attention, shifted and sinks (docs/tracer.md says why
        each is read this way), from the ``query`` and ``key`` ops and the (queries, keys) ``lengths``."""
        query_from, key_from = self._sources(query, group), self._sources(key, group)
        from_tokens = self._from_input(query_from)
        same_tokens = bool(query_from & key_from or self._feeds(query_from) & self._feeds(key_from))
        return {
            "talking_heads": any(self._is_score_linear(n) for n in group.fx),
            "latent_query": not from_tokens,
            "class_attention": lengths[0] == 1 < lengths[1] and not attrs["causal"] and from_tokens and same_tokens,
            "shifted": isinstance(attrs["window"], list) and self._rolled(query, group),
            "sinks": any(self._is_sink(n) for n in group.fx),
        }

    def _is_sink(self, node: fx.Node) -> bool:
        """Whether ``node`` sets a learned logit beside the keys: a parameter concatenated to the
        scores as one more key (GPT-OSS), or combined with their logsumexp (Granite's
        ``sigmoid(logsumexp(scores) - sink)``). Any parameter and any ``cat`` will not do: RoPE's
        ``rotate_half`` is a ``cat``, and talking heads or a learned bias are parameters."""
        name = functional_name(node.target)
        if name in ("cat", "concat"):
            return any(isinstance(a, fx.Node) and self._is_parameter(a) for a in node.args[0])
        if name == "logsumexp":
            return any(self._is_parameter(a) for user in node.users for a in user.all_input_nodes)
        return False

    def _rolled(self, query: fx.Node, group: Group) -> bool:
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

    def _sources(self, value: fx.Node, group: Group) -> set[int]:
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


def _sdpa_core(anchor: fx.Node) -> _Core:
    """The core of an SDPA call: q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev). Its
    arguments are read by their schema names; a kernel without a schema (``flex_attention``, a
    higher-order op) takes q, k, v first and masks by code the tracer cannot read."""
    arguments = call_arguments(anchor)
    query, key, value = (
        arguments.get(n, anchor.args[i] if i < len(anchor.args) else None)
        for i, n in enumerate(("query", "key", "value"))
    )
    q, v = query.meta["val"], value.meta["val"]
    mask = arguments.get("attn_mask")
    return _Core(
        query=query,
        key=key,
        value=value,
        heads=int(q.shape[-3]) if q.dim() >= 4 else None,
        value_heads=int(v.shape[-3]) if v.dim() >= 4 else None,
        head_dim=int(v.shape[-1]),
        lengths=(int(q.shape[-2]), int(key.meta["val"].shape[-2])),
        is_causal=bool(arguments.get("is_causal", False)),
        mask=mask if isinstance(mask, fx.Node) else None,
        readable=bool(arguments),
    )


def _eager_layout(anchor: fx.Node, side: int, softmax: fx.Node, scores: fx.Node) -> _Core | None:
    """The core of ``probs @ v`` (``probs`` the operand on ``side``) whose probabilities are
    ``softmax`` of ``scores = q k^T``, with the dimensions read from the products: leading
    batch dimensions for ``@`` and ``bmm``, the letters of the equation for ``einsum``; None for
    a product that is not shaped like attention."""
    anchor_ops, score_ops = _product_operands(anchor), _product_operands(scores)
    probs, value = anchor_ops[side], anchor_ops[1 - side]
    p, v = probs.meta["val"], value.meta["val"]
    if functional_name(anchor.target) != "einsum":
        if side != 0:
            return None
        query, key = score_ops
        return _Core(
            query=query,
            key=key,
            value=value,
            heads=int(p.shape[-3]) if p.dim() >= 4 else None,
            value_heads=int(v.shape[-3]) if v.dim() >= 4 else None,
            head_dim=int(v.shape[-1]),
            lengths=(int(p.shape[-2]), int(p.shape[-1])),
            scores=scores,
            softmax=softmax,
        )
    letters = _einsum_letters(anchor)
    if letters is None:
        return None
    p_letters, v_letters, out = letters[0][side], letters[0][1 - side], letters[1]
    size = dict(zip(p_letters, p.shape, strict=True)) | dict(zip(v_letters, v.shape, strict=True))
    keys = [c for c in p_letters if c in v_letters and c not in out]
    features = [c for c in v_letters if c in out and c not in p_letters]
    queries = [c for c in p_letters if c in out and c not in v_letters]
    shared = [c for c in p_letters if c in v_letters and c in out]
    if len(keys) != 1 or len(queries) != 1 or not features:
        return None
    query, key = score_ops
    if functional_name(scores.target) == "einsum":  # the query operand carries the scores' query letter
        score_letters = _einsum_letters(scores)
        if score_letters is not None and len(score_letters[1]) >= 2 and score_letters[1][-2] not in score_letters[0][0]:
            query, key = key, query
    head = shared[-1] if len(shared) >= 2 else None  # (batch, heads) are the dimensions all three share
    return _Core(
        query=query,
        key=key,
        value=value,
        heads=size[head] if head else None,
        value_heads=size[head] if head else None,
        head_dim=math.prod(size[c] for c in features),
        lengths=(size[queries[0]], size[keys[0]]),
        scores=scores,
        softmax=softmax,
    )


def _zeros(node: fx.Node) -> torch.Tensor:
    """Zeros, on the CPU, of the shape and type ``node`` has in the exported program."""
    fake = node.meta["val"]
    return torch.zeros(tuple(fake.shape), dtype=fake.dtype, device="cpu")


def _product_operands(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """The two tensors a matrix product multiplies (``baddbmm``'s batches, ``einsum``'s
    operands), or None for another op or an einsum of other than two tensors."""
    name = functional_name(node.target)
    if name == "einsum":
        operands = node.args[1] if len(node.args) > 1 else ()
        ok = (
            isinstance(operands, (list, tuple)) and len(operands) == 2 and all(isinstance(o, fx.Node) for o in operands)
        )
        return tuple(operands) if ok else None
    args = node.args[1:3] if name == "baddbmm" else node.args[:2]
    return tuple(args) if len(args) == 2 and all(isinstance(a, fx.Node) for a in args) else None


def _einsum_letters(node: fx.Node) -> tuple[tuple[str, str], str] | None:
    """The index letters of a two-operand einsum's operands and of its result, an ellipsis
    spelled out as one stand-in letter per dimension it covers; None if the equation cannot be
    read."""
    equation, operands = node.args[0], _product_operands(node)
    if not isinstance(equation, str) or operands is None:
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


def _path_back(
    start: Any, match: Callable[[fx.Node], bool], passes: Callable[[fx.Node], bool], depth: int = 8
) -> list[fx.Node] | None:
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
    return (
        _config_sliding_window(module)
        or _partition(own, keys)
        or _partition(_nearest_attr(model, path, "window_size"), keys)
    )


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

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
from typing import Any, cast

import torch
from torch import fx, nn

from graphkit.compat import call_arguments
from graphkit.errors import NeedsValuesError, TraceError
from graphkit.tracing.dims import POSITIONS, Untraced, count, dimension_origins, einsum_letters
from graphkit.tracing.masks import Pattern, Unknown, Visibility, read_pattern, upstream, visibility
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
from graphkit.tracing.state import BuildContext, Group

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
# a softmax written out (exp, then a division by the sum over the keys), and the zeros that
# replace the NaN of a row with every key masked
_ATTN_PASS |= {"exp", "nan_to_num"}
#: ops on the way from a softmax's exponentials to the sum that normalises them
_NORMALISER = _ATTN_PASS | {"sum", "reciprocal"}
#: ops that give rotary embeddings away: rotate_half's negation, or complex rotation
_ROPE_ATEN = frozenset({"neg", "view_as_complex", "complex"})


@dataclass(frozen=True)
class _Core:
    """An attention core as its anchor shows it: where its queries, keys and values come from,
    its sizes, and what masks it (SDPA's flag and ``attn_mask``, or the eager path from the
    scores to the probabilities multiplied with V)."""

    query: fx.Node
    key: fx.Node
    value: fx.Node
    # the dimensions of the query, and of V, other than their tokens and per-head features:
    # batch and heads, told apart by where their sizes come from (graphkit.tracing.dims)
    query_dims: tuple[int, ...]
    value_dims: tuple[int, ...]
    head_dim: int
    lengths: tuple[int, int]  # (queries, keys) each query sees
    is_causal: bool = False  # SDPA's flag
    mask: fx.Node | None = None  # SDPA's attn_mask
    scores: fx.Node | None = None  # eager: the q k^T product, its softmax (or exp)...
    softmax: fx.Node | None = None
    probs: fx.Node | None = None  # ...and the probabilities multiplied with V
    probs_dims: tuple[int, int] = (-2, -1)  # their (queries, keys) dimensions
    readable: bool = True  # False for a kernel whose masking is code, not a tensor (flex_attention's block mask)


class AttentionRules:
    """The tracer's attention rules, reading the graph being built through ``ctx`` (a
    :class:`~graphkit.tracing.state.BuildContext`): :meth:`regions` finds the cores and the ops
    each fuses, :meth:`group` makes an anchor's node, :meth:`attrs` reads its attributes."""

    def __init__(self, ctx: BuildContext) -> None:
        self.ctx = ctx
        self.cores: dict[fx.Node, _Core] = {}  # anchor (SDPA, or the product of probabilities with V) -> its core
        self.group_of: dict[fx.Node, int] = {}  # anchor -> the index of its node in ctx.groups

    def group(self, anchor: fx.Node) -> int:
        """The index in ``ctx.groups`` of ``anchor``'s attention node, made the first time."""
        if anchor not in self.group_of:
            self.ctx.groups.append(Group("attention", self._attention_scope(anchor), live=True))
            self.group_of[anchor] = len(self.ctx.groups) - 1
        return self.group_of[anchor]

    def _attention_scope(self, anchor: fx.Node) -> str:
        """The module an attention anchor belongs to. A graphkit attention core (which has an
        ``attention_variant``) is part of the attention module around it: rotary application and
        head reshapes live there, and so do ``is_causal`` and the sliding window."""
        scope = self.ctx.scope(anchor)
        try:
            module = self.ctx.model.get_submodule(scope)
        except AttributeError:
            return scope
        return scope.rpartition(".")[0] if hasattr(module, "attention_variant") else scope

    # -- attention regions ----------------------------------------------------------------------
    def regions(self, nodes: list[fx.Node]) -> dict[fx.Node, fx.Node]:
        """Map every FX op that belongs to an attention core to its anchor op. An eager core also
        takes the linear maps it applies to its scores or probabilities (talking heads), with
        their parameters; ``self.cores`` keeps what each anchor's attributes are read from."""
        region_of: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            if node.op != "call_function" or self.ctx.leaf(node) is not None:
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
                if u in region_of or u.op != "call_function" or self.ctx.leaf(u) is not None:
                    continue
                uname = functional_name(u.target)
                if uname in _PARAM_ATEN or any(a.name in self.ctx.param_names for a in u.all_input_nodes):
                    continue
                uscope = self.ctx.scope(u)
                if scope and not in_module(uscope, scope):
                    continue
                if in_module(uscope, experts):  # JetMoE: a mixture of attention heads
                    continue
                region_of[u] = node
                stack.extend(u.all_input_nodes)
                stack.extend(self.ctx.aliases.writers(u, node))  # K assembled by copies into slices (DeepSeek-V3)
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
            if u in branch or u.op != "call_function" or self.ctx.leaf(u) is not None:
                continue
            if scope and not in_module(self.ctx.scope(u), scope):
                return set()
            sources = [
                a for a in u.all_input_nodes if a not in inside and a not in branch and not self.ctx.is_parameter(a)
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
        spelled with ``@``, ``bmm`` or ``einsum``, the softmax as such or written out as
        ``exp`` divided by its sum over the keys), its core and the ops from it back to
        ``q k^T``; else None. The path may cross linear maps over the scores (talking heads:
        CaiT mixes the heads before and after the softmax)."""
        operands = _product_operands(node)
        if operands is None:
            return None
        for side, probs in enumerate(operands):
            to_softmax = _path_back(probs, _is_softmax, self._score_op)
            if to_softmax is None or not _normalised(to_softmax):
                continue
            if side == 1 and functional_name(node.target) != "einsum" and _keys_moved_to(to_softmax) != -2:
                continue  # V on the left (``v @ probs.mT``) contracts the keys only when they are moved there
            logits = cast(fx.Node, to_softmax[-1].args[0])
            through = [logits] if _is_log_softmax(logits) else []  # exp(log_softmax(s)) is softmax(s)
            to_scores = _path_back(
                logits.args[0] if through else logits,
                lambda n: functional_name(n.target) in MATMUL_ATEN,
                self._score_op,
            )
            core = None if to_scores is None else _eager_layout(node, side, to_softmax[-1], to_scores[-1])
            if core is not None and to_scores is not None:
                return core, [node, *to_softmax, *through, *to_scores]
        return None

    def _score_op(self, node: fx.Node) -> bool:
        """Whether an op can lie between ``q k^T``, the softmax and the product with V: masking,
        scaling and reshapes, or a linear module over the (batch, heads, queries, keys) scores."""
        return functional_name(node.target) in _ATTN_PASS or self._is_score_linear(node)

    def _is_score_linear(self, node: fx.Node) -> bool:
        """An op of a linear module over 4-D (batch, heads, queries, keys) scores: talking heads."""
        leaf = self.ctx.leaf(node)
        value = node.meta.get("val")
        return leaf is not None and leaf[1] == "linear" and isinstance(value, torch.Tensor) and value.dim() >= 4

    # -- attention attributes -------------------------------------------------------------------
    def attrs(self, anchor: fx.Node, group: Group) -> dict[str, Any]:
        core = self.cores[anchor]
        try:
            module = self.ctx.model.get_submodule(group.module)
        except AttributeError:
            module = None
        inputs_ops = {self.ctx.groups[i].op for i in group.inputs}
        ops_inside = {functional_name(n.target) for n in group.fx}
        causal, window = self._mask_attrs(anchor, core, group, module)
        where = group.module or type(self.ctx.model).__name__
        attrs: dict[str, Any] = {
            "heads": _head_count(core.query, core.query_dims, where, "queries"),
            "kv_heads": _head_count(core.value, core.value_dims, where, "values"),
            "head_dim": core.head_dim,
            "causal": causal,
            "window": window,
            "rope": "rotary_embedding" in inputs_ops or bool(ops_inside & _ROPE_ATEN) or self._rotates(group.module),
            "alibi": "alibi" in inputs_ops,
            "softcap": "tanh" in ops_inside,
        }
        if attrs["heads"] % attrs["kv_heads"]:  # each K/V head serves whole query heads: a misread layout
            raise TraceError(
                f"cannot tell how many heads the attention in module '{where}' has: its queries hold "
                f"{attrs['heads']} and its values {attrs['kv_heads']}, which do not group (a layout the tracer "
                "does not read, such as XLNet's sequence-first one)"
            )
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

    def _mask_attrs(
        self, anchor: fx.Node, core: _Core, group: Group, module: nn.Module | None
    ) -> tuple[bool, int | list[int] | None]:
        """``causal`` and ``window``, read off what the attention lets each query see
        (:mod:`graphkit.tracing.masks`): SDPA's flag or ``attn_mask``, or the probabilities an
        eager attention multiplies with V, computed with the queries and keys at zero, so that a
        mask counts wherever it is applied (before the softmax or after it, by ``masked_fill``,
        addition, multiplication or ``where``). A sliding window the module or its config names
        counts only where the values cannot show it: where they cannot be computed (a mask buffer
        of a model on the meta device), or where the keys are no more than the window (8 tokens
        cannot show a window of 16) and the values show a causal attention. Image windows
        (Swin's ``[7, 7]``) are the sides of the partition a bidirectional attention runs in."""
        where = group.module or type(self.ctx.model).__name__
        if core.lengths[1] == 1 and not core.is_causal:
            raise TraceError(
                f"cannot tell whether the attention in module '{where}' is causal: the example inputs give it "
                "a single key, which no mask hides; pass inputs of at least 2 tokens"
            )
        claimed, partition = _claimed_windows(self.ctx.model, group.module, core.lengths[1])
        pattern = self._pattern(anchor, core)
        if isinstance(pattern, str):  # no values: what the code says
            if partition is not None:  # image windows, never causal
                return False, partition
            causal = self._causal_without_values(group, module, core, pattern)
            return causal, claimed if causal else None
        if not pattern.causal:
            return False, partition
        if pattern.window is None and claimed is not None and claimed >= core.lengths[1]:
            return True, claimed  # too few keys to show this window, and nothing against it
        return True, pattern.window

    def _pattern(self, anchor: fx.Node, core: _Core) -> Pattern | str:
        """What the attention at ``anchor`` lets each query see, or why that cannot be computed."""
        if core.is_causal:
            return Pattern(causal=True, window=None)
        if not core.readable:
            return "it is a block mask, which is code"
        gid = self.group_of[anchor]

        def live(node: fx.Node) -> str | None:  # an activation: computed by another node of the graph
            other = self.ctx.prod.get(node, frozenset()) - {self.ctx.INPUT, gid}
            return (
                None
                if not other
                else f"it depends on the output of {self.ctx.groups[min(other)].module or 'the model'}"
            )

        try:
            if core.probs is not None:  # eager: the probabilities with q and k set to zero
                probs = self._probabilities(core, self.ctx.groups[gid], live)
                # nan_to_num copies: the logarithm can be taken in place
                seen = visibility(probs.movedim(core.probs_dims, (-2, -1)).float().nan_to_num(0.0).log_())
            elif core.mask is not None:
                mask = self.ctx.constants.evaluate(core.mask, {}, live)
                seen = Visibility.of_mask(mask) if mask.dtype == torch.bool else visibility(mask)
            else:
                return Pattern(causal=False, window=None)
        except Unknown as e:
            return str(e)
        if not bool(seen.some.any()):
            return "its values hide every key"
        pattern = read_pattern(seen, *core.lengths)
        return "its shape does not match the scores" if pattern is None else pattern

    def _probabilities(self, core: _Core, group: Group, live: Callable[[fx.Node], str | None]) -> torch.Tensor:
        """The probabilities an eager attention multiplies with V, computed with the queries and
        keys at zero, in two passes: each softmax (or the exponentials of a written-out one) from
        its input, where learned values and activations count as zero (a learned bias is no mask)
        and a linear map over the heads of the scores (talking heads) passes its input on; then
        the probabilities from those, where they count as one (a learned gate that mixes two
        softmaxes, ConViT's, or a talking-heads map after the softmax, hides no key), so that only
        what masks the probabilities after the softmax hides more."""
        assert core.scores is not None and core.softmax is not None and core.probs is not None, "an eager core"
        zeros = {o: _zeros(o) for o in _product_operands(core.scores) or ()}  # baddbmm keeps the mask it adds
        heads_maps = {n for n in group.fx if self._is_score_linear(n) and _keeps_shape(n)}
        softmaxes = {n for n in group.fx if functional_name(n.target) in _SOFTMAX_ATEN} | {core.softmax}
        normalised = {s: self.ctx.constants.evaluate(s, zeros, live, through=heads_maps) for s in softmaxes}
        return self.ctx.constants.evaluate(core.probs, normalised, live, fill=1.0)

    def _causal_without_values(self, group: Group, module: nn.Module | None, core: _Core, reason: str) -> bool:
        """Whether the attention is causal where its mask's values cannot be computed (``reason``
        says why): the module's own ``is_causal`` (transformers), or a ``tril``/``triu`` in the
        mask's ops; with neither, the model is refused rather than given a guess."""
        flag = getattr(module, "is_causal", None)
        if isinstance(flag, bool):
            return flag
        mask = core.mask if core.probs is None else core.probs
        mask_ops = {functional_name(n.target) for n in upstream(mask) if n.op == "call_function"}
        if mask_ops & {"tril", "triu"} or {functional_name(n.target) for n in group.fx} & {"tril", "triu"}:
            return True
        error = NeedsValuesError if "meta device" in reason else TraceError
        raise error(
            f"cannot tell whether the attention in module '{group.module or type(self.ctx.model).__name__}' "
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
            self.ctx.scope(n)
            for n in self.ctx.graph.nodes
            if n.op == "call_function" and functional_name(n.target) in _ROPE_ATEN and self.ctx.prod.get(n)
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
            return any(isinstance(a, fx.Node) and self.ctx.is_parameter(a) for a in cast(Sequence, node.args[0]))
        if name == "logsumexp":
            return any(self.ctx.is_parameter(a) for user in node.users for a in user.all_input_nodes)
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
            leaf = self.ctx.leaf(node)
            return leaf is not None and leaf[1] == "linear"

        return _path_back(query, _rolls_tokens, passes, depth=32) is not None

    def _sources(self, value: fx.Node, group: Group) -> set[int]:
        """The groups outside the attention ``group`` that ``value``, an op inside it, is computed from."""
        inside, seen, found = set(group.fx), set[fx.Node](), set[int]()
        stack = [value]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node in inside:
                stack.extend(node.all_input_nodes)
            else:
                found |= self.ctx.prod.get(node, frozenset())
        return found

    def _feeds(self, gids: set[int]) -> set[int]:
        """The groups that feed any of ``gids``."""
        return set().union(*(self.ctx.groups[g].inputs for g in gids))

    def _from_input(self, gids: set[int]) -> bool:
        """Whether any of ``gids`` is computed from the model input (not from parameters alone:
        a pooling head's learned latent query is not)."""
        stack, seen = list(gids), set()
        while stack:
            gid = stack.pop()
            if gid == self.ctx.INPUT:
                return True
            if gid not in seen:
                seen.add(gid)
                stack.extend(self.ctx.groups[gid].inputs)
        return False


def _sdpa_core(anchor: fx.Node) -> _Core:
    """The core of an SDPA call: q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev), or any
    other number of leading dimensions. Its arguments are read by their schema names; a kernel
    without a schema (``flex_attention``, a higher-order op) takes q, k, v first and masks by
    code the tracer cannot read."""
    arguments = call_arguments(anchor)
    query, key, value = (
        cast(fx.Node, arguments.get(n, anchor.args[i] if i < len(anchor.args) else None))
        for i, n in enumerate(("query", "key", "value"))
    )
    q, v = query.meta["val"], value.meta["val"]
    mask = arguments.get("attn_mask")
    return _Core(
        query=query,
        key=key,
        value=value,
        query_dims=tuple(range(q.dim() - 2)),
        value_dims=tuple(range(v.dim() - 2)),
        head_dim=int(v.shape[-1]),
        lengths=(int(q.shape[-2]), int(key.meta["val"].shape[-2])),
        is_causal=bool(arguments.get("is_causal", False)),
        mask=mask if isinstance(mask, fx.Node) else None,
        readable=bool(arguments),
    )


def _eager_layout(anchor: fx.Node, side: int, softmax: fx.Node, scores: fx.Node) -> _Core | None:
    """The core of ``probs @ v`` (``probs`` the operand on ``side``) whose probabilities come from
    ``softmax`` (or the ``exp`` of a written-out one) of ``scores = q k^T``, with the dimensions
    read from the products: for ``@`` and ``bmm``, keys last and queries before them; for
    ``einsum``, the letter the probabilities and V contract is the key, the letters V and the
    output share (and the probabilities lack) are the per-head features, and the query is the
    letter the scores take from the query's tokens. None for a product that is not shaped like
    attention."""
    operands = _product_operands(anchor)
    if operands is None:
        return None
    probs, value = operands[side], operands[1 - side]
    p, v = probs.meta["val"], value.meta["val"]
    if functional_name(anchor.target) != "einsum":  # probs @ v, or v @ probs.mT (keys at -2 of probs)
        p_letters = None
        key_dim, value_dims, head_dim = p.dim() - 1 - side, tuple(range(v.dim() - 2)), int(v.shape[-1 - side])
    else:
        letters = einsum_letters(anchor)
        if letters is None:
            return None
        p_letters, v_letters, out = letters[0][side], letters[0][1 - side], letters[1]
        keys = [c for c in p_letters if c in v_letters and c not in out]
        features = [c for c in v_letters if c in out and c not in p_letters]
        if len(keys) != 1 or not features:
            return None
        key_dim = p_letters.index(keys[0])
        value_dims = tuple(d for d, c in enumerate(v_letters) if c not in keys and c not in features)
        head_dim = math.prod(int(v.shape[v_letters.index(c)]) for c in features)
    layout = _score_layout(scores, p, key_dim)
    if layout is None:
        return None
    query, key, query_dims, score_query = layout
    if p_letters is None:
        query_dim = p.dim() - 2 + side
    else:  # the scores' query dimension, where the probabilities keep the scores' layout
        free = [d for d, c in enumerate(p_letters) if c in out and c not in v_letters]
        if not free:
            return None
        same = tuple(p.shape) == tuple(scores.meta["val"].shape)
        query_dim = score_query if same and score_query in free else free[-1]
    return _Core(
        query=query,
        key=key,
        value=value,
        query_dims=query_dims,
        value_dims=value_dims,
        head_dim=head_dim,
        lengths=(int(p.shape[query_dim]), int(p.shape[key_dim])),
        scores=scores,
        softmax=softmax,
        probs=probs,
        probs_dims=(query_dim, key_dim),
    )


def _score_layout(
    scores: fx.Node, probs: torch.Tensor, key_dim: int
) -> tuple[fx.Node, fx.Node, tuple[int, ...], int] | None:
    """The query and key operands of ``scores = q k^T``, the query's dimensions other than its
    tokens and the features it contracts (batch and heads), and the scores' query dimension.
    For an einsum, the key is the operand with the scores' key letter (at ``key_dim`` of the
    probabilities, ``probs``, where they keep the scores' layout), and the query letter is, of
    the query's letters the key lacks, the last whose dimension holds token positions
    (``bhqd,bkd->bhqk``: q, not h; :mod:`graphkit.tracing.dims`)."""
    operands = _product_operands(scores)
    if operands is None:
        return None
    first, second = operands
    s = scores.meta["val"]
    if functional_name(scores.target) != "einsum":  # the query's last dimension is contracted
        return first, second, tuple(range(first.meta["val"].dim() - 2)), s.dim() - 2
    letters = einsum_letters(scores)
    if letters is None:
        return None
    (a, b), out = letters
    key_letter = out[key_dim] if tuple(s.shape) == tuple(probs.shape) else out[-1]
    if key_letter in a:
        first, second, a, b = second, first, b, a
    if key_letter not in b or key_letter in a:
        return None
    free = [c for c in a if c in out and c not in b]
    if not free:
        return None
    try:
        origins = dimension_origins(first)
        tokens = [c for c in free if {kind for _, kind in origins[a.index(c)]} == {POSITIONS}]
    except Untraced:
        tokens = []
    query_letter = (tokens or free)[-1]
    return first, second, tuple(d for d, c in enumerate(a) if c in out and c != query_letter), out.index(query_letter)


def _head_count(tensor: fx.Node, dims: tuple[int, ...], module: str, what: str) -> int:
    """How many heads an attention's ``tensor`` (its queries, or V) holds in ``dims`` (its
    dimensions other than tokens and per-head features): the factors of their sizes carved out
    of the features of the projection that computed it, copies (GQA's repeated K/V) excluded
    (:mod:`graphkit.tracing.dims`). Where an op on the way cannot be followed, SDPA's layout
    (batch first, then heads) is taken, unless a single dimension holds both."""
    try:
        return count(dimension_origins(tensor), dims)
    except Untraced as e:
        if len(dims) != 1:
            shape = tensor.meta["val"].shape
            return math.prod(int(shape[d]) for d in dims[1:])
        raise TraceError(
            f"cannot tell how many heads the attention in module '{module}' has: its {what} fold heads into "
            f"the batch through {e}, which the tracer does not follow"
        ) from e


def _keeps_shape(node: fx.Node) -> bool:
    """Whether ``node``'s value has its first input's shape (a linear map over the heads of the
    scores, not ConViT's projection of 3 coordinates to the heads)."""
    source = node.args[0] if node.args else None
    return isinstance(source, fx.Node) and tuple(source.meta["val"].shape) == tuple(node.meta["val"].shape)


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
        if not isinstance(operands, (list, tuple)):
            return None
        args = tuple(operands)
    else:
        args = node.args[1:3] if name == "baddbmm" else node.args[:2]
    return (
        cast(tuple[fx.Node, fx.Node], tuple(args))
        if len(args) == 2 and all(isinstance(a, fx.Node) for a in args)
        else None
    )


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
                while (came := came_from[path[-1]]) is not None:
                    path.append(came)
                return path[::-1]
            if passes(n):
                for a in n.all_input_nodes:
                    if a not in came_from and is_float(a.meta.get("val")):
                        came_from[a] = n
                        nxt.append(a)
        frontier = nxt
    return None


def _is_softmax(node: fx.Node) -> bool:
    """A softmax, or the exponentials of one written out (``exp``; :func:`_normalised` checks
    that they are divided by their sum)."""
    return functional_name(node.target) in _SOFTMAX_ATEN or functional_name(node.target) == "exp"


def _is_log_softmax(node: Any) -> bool:
    return isinstance(node, fx.Node) and functional_name(node.target) in ("log_softmax", "_log_softmax")


def _normalised(path: list[fx.Node]) -> bool:
    """Whether ``path``, from the probabilities back to a softmax or an ``exp``, normalises: a
    softmax does, and so do the exponentials of a log-softmax; other exponentials must be divided
    (or multiplied by the reciprocal of) a sum of themselves on the way, masked or not, so that
    each query's weights add up to one."""
    if functional_name(path[-1].target) != "exp" or _is_log_softmax(path[-1].args[0]):
        return True
    numerator = set(path)
    for node in path[:-1]:
        if functional_name(node.target) not in ("div", "mul"):
            continue
        for other in node.all_input_nodes:
            if other in numerator:
                continue
            to_numerator = _path_back(
                other, lambda n: n in numerator, lambda n: functional_name(n.target) in _NORMALISER
            )
            if to_numerator is not None and any(functional_name(n.target) == "sum" for n in to_numerator):
                return True
    return False


#: ops that keep every dimension where it is, on the way from a softmax to the probabilities
_KEEPS_DIMS = {"mul", "div", "where", "masked_fill", "nan_to_num", "_to_copy", "to", "clone", "contiguous"}
_KEEPS_DIMS |= {"alias", "detach", "dropout", "type_as"}


def _keys_moved_to(path: list[fx.Node]) -> int | None:
    """Where the keys dimension of the softmax at the end of ``path`` lies in the probabilities
    at its start (negative, from the last), following transposes and permutes; None where an op
    on the way reshapes or is not followed. A written-out softmax normalises its last dimension."""
    softmax = path[-1]
    rank = softmax.meta["val"].dim()
    key = softmax.args[1] if functional_name(softmax.target) in _SOFTMAX_ATEN and len(softmax.args) > 1 else -1
    key %= rank
    for node in reversed(path[:-1]):
        name, args = functional_name(node.target), node.args
        if node.meta["val"].dim() != rank:
            return None
        if name in ("transpose", "swapaxes", "swapdims"):
            a, b = args[1] % rank, args[2] % rank
            key = b if key == a else a if key == b else key
        elif name == "permute":
            key = [d % rank for d in cast(list[int], args[1])].index(key)
        elif name not in _KEEPS_DIMS:
            return None
    return key - rank


def _rolls_tokens(node: fx.Node) -> bool:
    return spatial_op(node) == "roll" and not is_identity(node)


def first_attr(obj: Any, names: Sequence[str]) -> Any:
    """The first of ``names`` that ``obj`` has and is not None (libraries name one setting many ways)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _claimed_windows(model: nn.Module, path: str, keys: int) -> tuple[int | None, list[int] | None]:
    """The windows the attention module at ``path`` names, which its mask's values confirm or
    overrule (:meth:`AttentionRules._mask_attrs`): a sliding-window size (an int) from its own
    attributes or its HF config, and the sides of the windows an image is partitioned into
    (Swin's [7, 7]), set on the module or the block around it. A partition window counts only
    when it holds exactly the ``keys`` each query sees: BEiT's ``window_size`` is its whole patch
    grid (for a relative-position table) and its queries also see the class token."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None, None
    own = first_attr(module, ("sliding_window", "window_size", "window"))
    sliding = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else None
    partition = _partition(own, keys) or _partition(_nearest_attr(model, path, "window_size"), keys)
    return sliding or _config_sliding_window(module), partition


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

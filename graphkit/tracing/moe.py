"""Mixture of experts becomes one node: which module is an MoE block, which of its ops are the
router, the top-k gating and the experts, and the node's attributes (num_experts, top_k,
intermediate_size).

An MoE block is recognised by its layout, not by its class: a module with a child named
``experts`` that holds parameters (Mixtral's and DeepSeek-V3's blocks in transformers, Qwen-MoE,
a hand-written block with an ``nn.ModuleList`` of expert MLPs). Inside one call of it, the
``moe`` node fuses

- everything inside ``experts`` (a ModuleList of MLPs, or the 3-D weights of transformers'
  grouped-matmul experts with their sort/gather/scatter bookkeeping);
- the router: every op the expert-choosing ``topk`` depends on inside the block (router
  projection, softmax or sigmoid scores, DeepSeek-V3's group-limited selection), back to the
  tokens the experts read too (a pre-norm inside the block stays its own node);
- the gating and combine: ops of the block that read the node's values and nothing else (weight
  normalisation, scaling, the weighted sum of expert outputs).

It stops at anything that mixes in another value: DeepSeek-V3's and Qwen-MoE's shared experts
are a dense MLP every token goes through, and stay ordinary ``linear``/``silu``/``mul`` nodes
whose output is added to the ``moe`` node's (docs/tracer.md says why).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Set
from dataclasses import dataclass
from typing import Any, cast

from torch import fx, nn

from graphkit.tracing.attention import first_attr
from graphkit.tracing.naming import (
    EXPERTS_CHILD,
    MATMUL_ATEN,
    SHAPE_ONLY_ATEN,
    functional_name,
    in_module,
    is_float,
    moves_data,
)
from graphkit.tracing.state import BuildContext

#: matrix products an expert applies its weights with: nn.Linear, x @ W, and the grouped
#: matmuls (or their fallback) transformers runs its 3-D expert weights with
_PRODUCT_ATEN = MATMUL_ATEN | {"linear", "addmm", "_grouped_mm", "grouped_mm", "grouped_mm_fallback"}


def is_moe_block(module: nn.Module) -> bool:
    """True for a module with a child named ``experts`` holding parameters. The layout is what
    every MoE implementation shares (transformers' Mixtral, DeepSeek, Qwen-MoE, OLMoE blocks and
    hand-written ones), so a user's block needs no registration."""
    experts = module._modules.get(EXPERTS_CHILD)
    return experts is not None and next(experts.parameters(), None) is not None


def _selects(node: fx.Node) -> bool:
    """True for an op that picks experts: ``topk``, or a ``max``/``argmax`` over a dim whose
    indices are read (PhiMoE's sparse mixer picks its two experts with two maxes)."""
    name = functional_name(node.target)
    if name == "topk":
        return True
    if name not in ("max", "argmax") or len(node.args) < 2 or isinstance(node.args[1], fx.Node):
        return False
    return name == "argmax" or any(u.args[1:2] == (1,) for u in node.users if u.op == "call_function")


def topk_k(node: fx.Node) -> int | None:
    """The k of an ATen ``topk`` call (positional or keyword), None if it is not a plain int."""
    k = node.args[1] if len(node.args) > 1 else node.kwargs.get("k")
    return int(k) if isinstance(k, int) else None


@dataclass(eq=False)  # one per call, hashed by identity
class _MoeCall:
    """One call of an MoE block: the topk that picks the experts, the ops that are the node
    whatever they read (router and experts), and the group they become once one is met."""

    path: str
    router: fx.Node
    experts: list[fx.Node]
    core: set[fx.Node]
    group: int | None = None
    open: bool = False  # the block returns its pieces (expert outputs, weights) for its caller to combine


class MoeRules:
    """The tracer's mixture-of-experts rules, reading the graph being built through ``ctx`` (a
    :class:`~graphkit.tracing.state.BuildContext`): :meth:`calls` finds each call of an MoE block
    and its router and experts, :meth:`joins` and :meth:`continues` say which ops its node takes,
    :meth:`attrs` reads its attributes."""

    def __init__(self, ctx: BuildContext) -> None:
        self.ctx = ctx
        self.open_groups: set[int] = set()  # the nodes of blocks that return their pieces, still being combined

    def calls(self, nodes: list[fx.Node], attention: Collection[fx.Node]) -> dict[fx.Node, _MoeCall]:
        """Map every FX op inside a call of an MoE block (the outermost one) to that call. A block
        that picks no experts (a soft or dense mixture) has no router to fuse and is traced op by op,
        and so is one holding an attention core (an op in ``attention``, the cores' anchors)."""
        ops_of: dict[str, list[fx.Node]] = {}  # by call: a block a looped model runs twice is two calls
        is_block: dict[str, bool] = {}
        for node in nodes:
            if node.op != "call_function":
                continue
            for call in self.ctx.calls(node):
                path = call.split("@")[0]
                if path not in is_block:
                    is_block[path] = _is_moe_path(self.ctx.model, path)
                if is_block[path]:
                    ops_of.setdefault(call, []).append(node)
                    break
        call_of: dict[fx.Node, _MoeCall] = {}
        for call_path, ops in ops_of.items():
            path = call_path.split("@")[0]
            experts_path = f"{path}.{EXPERTS_CHILD}" if path else EXPERTS_CHILD
            selections = [n for n in ops if _selects(n)] or [  # hash routing (DeepSeek-V4's first layers)
                n
                for n in ops
                if functional_name(n.target) == "gather" and not in_module(self.ctx.scope(n), experts_path)
            ]
            if not selections or any(n in attention for n in ops):
                # no router (a soft or dense mixture), or a mixture of attention heads (JetMoE's
                # experts are the attention's projections): traced op by op around the attention
                continue
            inside = set(ops)
            experts = [n for n in ops if any(in_module(p, experts_path) for p in self.ctx.stack(n))]
            # group-limited routing (DeepSeek-V3) calls topk over groups first, sparse mixing
            # (PhiMoE) picks one expert at a time: the last selection is the one whose indices
            # the experts read, and it depends on the others
            router = selections[-1]
            routed = _closure([router], lambda n: [u for u in n.users if u in inside])
            routing = _closure(
                [router], lambda n: [a for a in n.all_input_nodes if a in inside], stop=_tokens_read(experts, routed)
            )
            # a router module (Llama 4's is an nn.Linear that also picks and gates; Inkling's scales
            # its weights by a parameter) is part of the node, whatever it computes after the pick
            scope = self.ctx.scope(router)
            if scope != path and not in_module(scope, experts_path):
                routing |= {n for n in ops if in_module(self.ctx.scope(n), scope)}
            # what the experts read of the pick besides its indices (Llama 4 scales the tokens by
            # their router scores before the experts)
            feeding = _closure(experts, lambda n: [a for a in n.all_input_nodes if a in inside])
            returned = {n for n in ops if is_float(n.meta.get("val")) and any(u not in inside for u in n.users)}
            moe = _MoeCall(path, router, experts, set(experts) | routing | (routed & feeding), open=len(returned) > 1)
            for n in ops:
                call_of[n] = moe
        return call_of

    def joins(
        self, call: _MoeCall, node: fx.Node, in_leaf: bool, in_prod: frozenset[int], in_params: frozenset[str]
    ) -> bool:
        """Whether ``node`` is part of its MoE call's node. Router and expert ops are, except data
        movement at the block's own level (the block input's reshape also feeds shared experts);
        other ops of the block are if they read the MoE node alone and no parameter (gating,
        combine), so the node ends where another value comes in (shared experts, a residual)."""
        if node in call.core:
            return in_leaf or not moves_data(functional_name(node.target), node.meta.get("val"))
        return not in_leaf and not in_params and call.group is not None and in_prod == {call.group}

    def continues(self, in_leaf: bool, in_prod: frozenset[int], in_params: frozenset[str]) -> int | None:
        """The MoE node an op outside every MoE block belongs to, or None: a block that returns
        its pieces (expert outputs and their weights) leaves the weighted sum to its caller, and
        the caller's ops that read those pieces alone and no parameter are that combine."""
        if in_leaf or in_params or len(in_prod) != 1:
            return None
        (gid,) = in_prod
        return gid if gid in self.open_groups else None

    def attrs(self, call: _MoeCall) -> dict[str, Any]:
        """num_experts (the dim the expert-choosing topk ranks), top_k (its k) and
        intermediate_size (the width entering each expert's last matrix product with a weight:
        the MLP's hidden size, after gating for SwiGLU experts)."""
        router = call.router
        name = functional_name(router.target)
        if name == "topk":
            dim = router.args[2] if len(router.args) > 2 else router.kwargs.get("dim", -1)
        else:  # max(x, dim), argmax(x, dim), gather(x, dim, index)
            dim = router.args[1]
        products = [
            n
            for n in call.experts
            if functional_name(n.target) in _PRODUCT_ATEN and any(self.ctx.is_parameter(a) for a in n.all_input_nodes)
        ]
        last = products[-1] if products else None
        width = (
            None
            if last is None
            else next(
                (a for a in last.all_input_nodes if not self.ctx.is_parameter(a) and is_float(a.meta.get("val"))), None
            )
        )
        k = topk_k(router) if name == "topk" else None
        if name == "gather":  # a table picked the experts: as many as the index holds
            k = int(cast(fx.Node, router.args[2]).meta["val"].shape[dim])
        if k is None:  # picked by maxes: the block says how many
            k = first_attr(self.ctx.model.get_submodule(call.path), ("top_k", "num_experts_per_tok"))
        return {
            "num_experts": int(cast(fx.Node, router.args[0]).meta["val"].shape[dim]),
            "top_k": k,
            "intermediate_size": int(width.meta["val"].shape[-1]) if width is not None else None,
        }


def _closure(
    start: list[fx.Node], step: Callable[[fx.Node], list[fx.Node]], stop: Set[fx.Node] = frozenset()
) -> set[fx.Node]:
    """``start`` and every node reached from it by ``step``, not entering ``stop``."""
    seen, todo = set(), [n for n in start if n not in stop]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(m for m in step(n) if m not in stop)
    return seen


def _tokens_read(experts: list[fx.Node], routed: set[fx.Node]) -> set[fx.Node]:
    """The activations the experts read from outside them that do not come from the routing
    (the block input, or a norm inside the block), back through reshapes to their first
    computing op: the router's walk back stops there, so a pre-norm inside the block stays its
    own node. Indices and masks are not followed: they come from the router."""
    inside, found = set(experts), set()
    todo = [a for n in experts for a in n.all_input_nodes if a not in inside]
    while todo:
        n = todo.pop()
        if n in found or n in routed or n.op != "call_function" or not is_float(n.meta.get("val")):
            continue
        found.add(n)
        if functional_name(n.target) in SHAPE_ONLY_ATEN:
            todo.extend(n.all_input_nodes)
    return found


def _is_moe_path(model: nn.Module, path: str) -> bool:
    try:
        return is_moe_block(model.get_submodule(path))
    except AttributeError:
        return False

"""ExportedProgram -> ArchGraph: from ATen ops to architecture nodes, in three steps.

1. **Modules become nodes.** Every op inside a call of a module that :func:`graphkit.tracing.naming.module_op`
   names (Linear, HF Conv1D, LayerNorm, any library ``*RMSNorm``, GELU variants, rotary tables,
   ...), or whose class name claims an op its call could compute
   (:func:`graphkit.tracing.naming.could_compute`), is fused into one node that owns the
   module's parameters.
2. **Attention becomes one node.** Each SDPA call, or eager ``softmax(q k^T) v`` pattern, is an
   anchor; the ops feeding it inside the same module scope, up to the projections (rotary
   application, head reshapes, scaling, masking, GQA K/V repetition), are fused into one
   ``attention`` node whose attrs say heads, kv_heads, head_dim, causal, window and rope.
   Likewise a mixture-of-experts block's router, gating and experts become one ``moe`` node
   (:mod:`graphkit.tracing.moe`).
3. **Only data flow that matters stays.** Shape-only ops pass their inputs through; ops on
   values that depend on neither the input nor a parameter (position ids, causal masks) are
   constants and vanish; scaling by a constant is folded. A node left with no input (a
   positional embedding looked up by ``arange``) gets an edge from the input, because it
   depends on the input's length. Anything else unknown is kept as ``other:<aten op>``.

docs/tracer.md gives every rule with its reason.
"""

from __future__ import annotations

import heapq
from typing import Any, ClassVar

import torch
from torch import fx, nn

from graphkit.errors import TraceError, UnusedParameterError
from graphkit.graph import ArchGraph, Node
from graphkit.tracing.attention import AttentionRules, first_attr
from graphkit.tracing.masks import ConstantEvaluator
from graphkit.tracing.moe import MoeRules, topk_k
from graphkit.tracing.mutation import Aliases
from graphkit.tracing.naming import (
    ATEN_OPS,
    MATMUL_ATEN,
    SHAPE_DEPENDENT_ATEN,
    SHAPE_ONLY_ATEN,
    claimed_op,
    could_compute,
    functional_name,
    is_float,
    module_op,
    moves_data,
)
from graphkit.tracing.spatial import is_identity, spatial_attrs, spatial_op
from graphkit.tracing.state import Group

_SCALAR_ARITH = {"mul", "div", "add", "sub", "rsub", "true_divide", "neg"}
#: powers by a constant: ATen name -> its exponent, or None where an argument holds it
_POWERS: dict[str, float | None] = {"sqrt": 0.5, "rsqrt": -0.5, "reciprocal": -1.0, "pow": None}
_LEAF_KEEP_WITHOUT_INPUT = {"rotary_embedding", "alibi"}


def graph_from_export(
    model: nn.Module, program: torch.export.ExportedProgram, inputs: tuple[tuple, dict] | None = None
) -> ArchGraph:
    """The architecture graph of an exported ``model`` (unvalidated, without meta). ``inputs``,
    the ``(args, kwargs)`` it was exported with, lets the tracer read a mask passed in as an
    argument (:mod:`graphkit.tracing.masks`)."""
    return _GraphBuilder(model, program, inputs).build()


#: parameter names (their last part) that a model holds for a use its forward never makes for the
#: inputs it is traced and predicted with: the masked-image-modelling token of DINOv2, BEiT, ViT
#: with ``use_mask_token``, read only where the forward is given ``bool_masked_pos``, and XLNet's
#: ``mask_emb``, its query stream's start, read only where it is given a permutation target
SPARE_NAMES = ("mask_token", "mask_emb")


def is_spare(name: str) -> bool:
    """Whether the parameter ``name`` (a state-dict name) is spare when its forward does not read
    it: its last part is one of :data:`SPARE_NAMES`. The tracer records a spare parameter in
    ``graph.meta["spare"]`` instead of refusing the model, and ``predict`` leaves it at the
    model's own init; any other parameter the forward never reads is refused
    (:class:`~graphkit.errors.UnusedParameterError`), since it may be one a branch not taken reads."""
    return name.rpartition(".")[2] in SPARE_NAMES


def _reading_inputs(program: torch.export.ExportedProgram, user_inputs: set[str]) -> frozenset[str]:
    """The user inputs that say how to read the images rather than hold them: every integer or
    boolean input of a model that also takes a floating-point one (SigLIP 2's patch grid shapes
    and padding mask beside its patches). The values computed from them alone are constants, like
    position ids: the position table resized to each image's grid is the table, whatever the grid,
    and a mask that weights the patches is a constant factor. A language model's token ids are its
    data, so a model with no floating-point input keeps every input as data."""
    values = {
        node.name: node.meta.get("val")
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs
    }
    if not any(is_float(value) for value in values.values()):
        return frozenset()
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    return frozenset(
        name
        for name, value in values.items()
        if isinstance(value, torch.Tensor) and not is_float(value) and not _looks_up_a_table(placeholders[name])
    )


def _looks_up_a_table(node: fx.Node) -> bool:
    """Whether ``node`` (an integer input), or a view of it, indexes an embedding table: token
    ids, which are data even beside a floating-point input (TrOCR's decoder takes its encoder's
    states beside them; read as a constant, its token table became a position table)."""
    views = [node]
    while views:
        value = views.pop()
        for user in value.users:
            name = functional_name(user.target) if user.op == "call_function" else None
            if name == "embedding" and len(user.args) > 1 and user.args[1] is value:
                return True
            if name in SHAPE_ONLY_ATEN and user.args and user.args[0] is value:
                views.append(user)
    return False


class _GraphBuilder:
    """Builds one exported model's graph; it is the :class:`~graphkit.tracing.state.BuildContext`
    its attention and MoE rules read."""

    INPUT: ClassVar[int] = 0

    def __init__(
        self, model: nn.Module, program: torch.export.ExportedProgram, inputs: tuple[tuple, dict] | None
    ) -> None:
        self.model = model
        self.program = program
        self.inputs = inputs
        self.graph = program.graph
        self.groups: list[Group] = [Group("input", "", live=True)]
        self.prod: dict[fx.Node, frozenset[int]] = {}  # value -> groups it comes from
        self.param_src: dict[fx.Node, frozenset[str]] = {}  # value -> parameters it is a view of
        self.owner: dict[str, int] = {}
        self._module_ops: dict[str, str | None] = {}
        self.inside: dict[str, list[tuple[str, bool]]] = {}  # filled by _index_calls
        self.param_names: dict[str, str] = {}
        self.user_inputs: set[str] = set()
        # a tied tensor has several names; the graph uses the one named_parameters() reports
        canonical = {id(p): n for n, p in model.named_parameters()}
        alias = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
        for spec in program.graph_signature.input_specs:
            kind = spec.kind.name
            if kind == "PARAMETER":
                self.param_names[spec.arg.name] = alias.get(spec.target, spec.target)
            elif kind == "USER_INPUT":
                self.user_inputs.add(spec.arg.name)
        self.reading_inputs = _reading_inputs(program, self.user_inputs)
        self.attention = AttentionRules(self)
        self.moe = MoeRules(self)

    # -- helpers --------------------------------------------------------------------------------
    def _module_op(self, path: str) -> str | None:
        if path not in self._module_ops:
            try:
                module = self.model.get_submodule(path)
            except AttributeError:
                module = None
            op = None if module is None else module_op(module)
            if module is not None and op is None:
                claim = claimed_op(module)
                if claim is not None and could_compute(claim, module, self.inside.get(path, [])):
                    op = claim
            self._module_ops[path] = op
        return self._module_ops[path]

    def _index_calls(self, nodes: list[fx.Node]) -> None:
        """Per module path, the ATen ops run inside its calls, each with whether it reads the
        model's input or a parameter (through any chain of ops): what :func:`could_compute`
        checks a class name's claim against."""
        reads: set[fx.Node] = set()
        for node in nodes:
            if node.op == "placeholder":
                if node.name in self.param_names or node.name in self.user_inputs:
                    reads.add(node)
                continue
            if node.op != "call_function":
                continue
            name = functional_name(node.target)
            reading = any(arg in reads for arg in node.all_input_nodes)
            if reading and name not in SHAPE_DEPENDENT_ATEN:
                reads.add(node)
            for path in dict.fromkeys(self.stack(node)):
                self.inside.setdefault(path, []).append((name, reading))

    @staticmethod
    def stack(node: fx.Node) -> list[str]:
        return [p.split("@")[0] for p in _GraphBuilder.calls(node)]

    @staticmethod
    def calls(node: fx.Node) -> list[str]:
        """The module calls ``node`` runs in, outermost first: each module's path, with ``@k`` for
        its k-th call after the first (a looped model runs its blocks again; torch marks the
        call on the stack's key, or on the path)."""
        return [
            path if "@" in path or "@" not in key else f"{path}@{key.rpartition('@')[2]}"
            for key, (path, _) in (node.meta.get("nn_module_stack") or {}).items()
        ]

    def is_parameter(self, value: fx.Node) -> bool:
        """True for a parameter or a view of one (transformers' experts transpose their 3-D
        weights; Granite reshapes its sinks)."""
        while value.op == "call_function" and functional_name(value.target) in SHAPE_ONLY_ATEN and value.args:
            if not isinstance(value.args[0], fx.Node):
                return False
            value = value.args[0]
        return value.op == "placeholder" and value.name in self.param_names

    def leaf(self, node: fx.Node) -> tuple[str, str] | None:
        for path in self.stack(node):
            op = self._module_op(path)
            if op is not None:
                return path, op
        return None

    def scope(self, node: fx.Node) -> str:
        stack = self.stack(node)
        return stack[-1] if stack else ""

    # -- main pass ------------------------------------------------------------------------------
    def build(self) -> ArchGraph:
        nodes = list(self.graph.nodes)
        for pos, node in enumerate(nodes):
            node.meta["_gk_pos"] = pos
        self._index_calls(nodes)
        self.aliases = Aliases(nodes)
        self.discarded = self._discarded(nodes)
        self.constants = ConstantEvaluator(self.program, self.inputs, self.aliases)
        self.region_of = self.attention.regions(nodes)
        self.moe_call_of = self.moe.calls(nodes, self.attention.cores)
        self.open_leaf: tuple[str, int] | None = None
        output_node = None
        for node in nodes:
            if node.op == "placeholder":
                if node.name in self.param_names:
                    name = self.param_names[node.name]
                    self.param_src[node] = frozenset() if name in self.discarded else frozenset({name})
                    self.prod[node] = frozenset()
                elif node.name in self.user_inputs:  # a reading input is a constant (positions, masks)
                    self.prod[node] = frozenset() if node.name in self.reading_inputs else frozenset({self.INPUT})
                continue
            if node.op == "output":
                output_node = node
                continue
            if node.op != "call_function":
                continue
            self._visit(node)
            for root in self.aliases.written.get(node, ()):
                self._write_through(root, node)
        for anchor, gid in self.attention.group_of.items():
            self.groups[gid].attrs = self.attention.attrs(anchor, self.groups[gid])
        for call in set(self.moe_call_of.values()):
            if call.group is not None:
                self.groups[call.group].attrs.update(self.moe.attrs(call))
        self._check_all_parameters_used()
        graph = self._assemble(output_node)
        if self.discarded:
            graph.meta["discarded"] = sorted(self.discarded)
        return graph

    def _discarded(self, nodes: list[fx.Node]) -> set[str]:
        """The parameters the forward reads only into values it then discards: CLIP's image
        classifier runs its vision tower's ``post_layernorm`` and pools without it, SigLIP's runs a
        MAP head it does not use. They cannot change the output, so no node owns them (the ops
        that read them are left parameter-free and dropped as dead code) and the tracer records
        them as spare. Liveness is read off the exported program itself, not off the graph being
        built, so a value the builder fails to connect is still refused as unconnected; a write
        into a live tensor's storage (``copy_``, ``index_put_``) is live, through its aliases."""
        output = next((node for node in reversed(nodes) if node.op == "output"), None)
        if output is None:
            return set()
        live: set[fx.Node] = set()
        stack = [output]
        while stack:
            node = stack.pop()
            if node in live:
                continue
            live.add(node)
            stack.extend(node.all_input_nodes)
            stack.extend(self.aliases.writers(node, output))
        read: dict[str, bool] = {}  # a tied parameter has one placeholder per name; one live read suffices
        for node in nodes:
            if node.op == "placeholder" and node.name in self.param_names and node.users:
                name = self.param_names[node.name]
                read[name] = read.get(name, False) or node in live
        return {name for name, live_read in read.items() if not live_read}

    def _visit(self, node: fx.Node) -> None:
        """Give one op its place: part of a module's node, an attention or MoE node, passed
        through (data movement, constants, folded scalars) or a node of its own."""
        in_nodes = node.all_input_nodes
        in_prod = frozenset().union(*(self.prod.get(a, frozenset()) for a in in_nodes))
        in_params = frozenset().union(*(self.param_src.get(a, frozenset()) for a in in_nodes))
        leaf = None if node in self.region_of else self.leaf(node)  # talking heads join their attention
        call = self.moe_call_of.get(node)
        if call is not None and self.moe.joins(call, node, leaf is not None, in_prod, in_params):
            if call.group is None:
                self.groups.append(Group("moe", call.path, live=True))
                call.group = len(self.groups) - 1
                if call.open:
                    self.moe.open_groups.add(call.group)
            self._absorb(call.group, node, in_prod, in_params)
            return
        combine = None if call is not None else self.moe.continues(leaf is not None, in_prod, in_params)
        if combine is not None and not moves_data(functional_name(node.target), node.meta.get("val")):
            self._absorb(combine, node, in_prod, in_params)
            return
        if leaf is not None:
            path, op = leaf
            if self.open_leaf is None or self.open_leaf[0] != path:
                self.groups.append(Group(op, path, live=op in _LEAF_KEEP_WITHOUT_INPUT))
                self.open_leaf = (path, len(self.groups) - 1)
            gid = self.open_leaf[1]
            self._absorb(gid, node, in_prod, in_params)
            if (
                in_prod
                and gid not in in_prod
                and not in_params
                and moves_data(functional_name(node.target), node.meta.get("val"))
            ):
                # an alias of what enters the module (an RMSNorm's x.to(float32) on float32 x):
                # a residual read through it reads the module's input, not the module
                self.prod[node] = in_prod
            return
        self.open_leaf = None
        if node in self.region_of:
            anchor = self.region_of[node]
            gid = self.attention.group(anchor)
            self._absorb(gid, node, in_prod, in_params)
            if gid not in in_prod and moves_data(functional_name(node.target), node.meta.get("val")):
                # a reshape or split the attention shares with an op outside it (DeepSeek-V3 splits
                # one projection into its latent and its rotary key): still its producer's value
                self.prod[node] = in_prod
            return
        name = functional_name(node.target)
        if moves_data(name, node.meta.get("val")) or is_identity(node):
            self.prod[node], self.param_src[node] = in_prod, in_params
            return
        if (not in_prod and not in_params) or name in SHAPE_DEPENDENT_ATEN:
            self.prod[node] = frozenset()  # a constant: positions, masks, tables
            return
        if not in_prod:  # a parameter reparametrised (SwinV2's clamped logit scale, its cat of
            self.param_src[node] = in_params  # q and v biases): the op consuming it owns it
            self.prod[node] = frozenset()
            return
        single = self._single_op(node, name, in_nodes, in_params)
        if single is None:  # arithmetic with constants: folded into its input
            self.prod[node], self.param_src[node] = in_prod, in_params
            return
        self.groups.append(Group(single, self.scope(node), live=True))
        self._absorb(len(self.groups) - 1, node, in_prod, in_params)

    def _write_through(self, root: fx.Node, writer: fx.Node) -> None:
        """``writer`` wrote into ``root``'s storage (``copy_`` into a slice, ``index_put_``):
        every alias of it now also carries what was written, so the ops that read it later get
        their edges from the writer's sources (:mod:`graphkit.tracing.mutation`)."""
        written = self.prod.get(writer, frozenset())
        params = self.param_src.get(writer, frozenset())
        for alias in self.aliases.members(root):
            if alias is not writer:
                self.prod[alias] = self.prod.get(alias, frozenset()) | written
                self.param_src[alias] = self.param_src.get(alias, frozenset()) | params

    def _absorb(self, gid: int, node: fx.Node, in_prod: frozenset[int], in_params: frozenset[str]) -> None:
        group = self.groups[gid]
        group.fx.append(node)
        group.inputs |= in_prod - {gid}
        for p in sorted(in_params):
            if p not in self.owner:
                self.owner[p] = gid
                group.params[p] = tuple(self._param_shape(p))
            elif self.owner[p] != gid:
                group.attrs.setdefault("tied", [])
                if p not in group.attrs["tied"]:
                    group.attrs["tied"].append(p)
        group.live = group.live or bool(in_prod - {gid}) or bool(in_params)
        self.prod[node] = frozenset({gid}) if group.live else frozenset()
        self.param_src[node] = frozenset()

    def _param_shape(self, name: str) -> torch.Size:
        return self.model.get_parameter(name).shape

    def _single_op(self, node: fx.Node, name: str, in_nodes: list[fx.Node], in_params: frozenset[str]) -> str | None:
        live = [a for a in in_nodes if self.prod.get(a)]
        if name in ("add", "sub") and in_params:
            if all(p in self.owner for p in in_params) and live:
                # a parameter another node owns, used again as one side of a sum: CaiT adds its
                # class token back as the residual of the first class-attention block (attrs.tied)
                return "add"
            return "pos_embedding" if any(len(self._param_shape(p)) >= 2 for p in in_params) else "bias"
        if name in ("cat", "concat") and in_params:
            return "class_token"
        if name == "mul" and in_params:
            return "scale"
        if name in _SCALAR_ARITH and len(live) <= 1 and not in_params:
            return None
        if name == "add":
            return "add"
        if name == "mul":
            return "mul"
        if name == "tanh" and _softcap(node) is not None:
            return "softcap"
        exponent = _exponent(node)
        if exponent is not None:
            return "square" if exponent == 2 else "pow"
        if name in MATMUL_ATEN:  # x @ W is a linear layer; two activations multiplied, linear attention's
            return "linear" if in_params else "matmul"
        spatial = spatial_op(node)
        if spatial is not None:
            return spatial
        if name in ATEN_OPS and (name != "addmm" or in_params):
            return ATEN_OPS[name]
        return f"other:aten.{name}"

    def _check_all_parameters_used(self) -> None:
        """Refuse a model with a parameter its forward never reads for these inputs (a spare
        submodule, or a branch not taken such as ``if x.shape[1] > 8``): no node could own it,
        so neither a hypernetwork nor the compiler could account for it. A spare parameter
        (:func:`is_spare`) is let through: the tracer records it beside the graph."""
        used: dict[str, bool] = {}  # a tied parameter has one placeholder per name; one read suffices
        for node in self.graph.nodes:
            if node.op == "placeholder" and node.name in self.param_names:
                name = self.param_names[node.name]
                used[name] = used.get(name, False) or bool(node.users)
        unused = [name for name, read in used.items() if not read and not is_spare(name)]
        if unused:
            name = unused[0]
            path = name.rpartition(".")[0]
            ran = {p for node in self.graph.nodes for p in self.stack(node)}
            kind = type(self.model.get_submodule(path)).__name__ if path else ""
            where = (
                f"module '{path}' ({kind}) runs but never reads it"
                if path in ran
                else f"module '{path}' ({kind}) never runs"
                if path
                else f"the model never reads its own parameter {name!r}"
            )
            raise UnusedParameterError(
                f"parameter {name!r} is not used by forward with these inputs ({where}): remove it if "
                "it is spare, or pass example inputs that take the branch that uses it"
            )

    # -- assemble -------------------------------------------------------------------------------
    def _assemble(self, output_node: fx.Node | None) -> ArchGraph:
        out = Group("output", "", live=True)
        if output_node is not None:
            for a in output_node.all_input_nodes:
                out.inputs |= self.prod.get(a, frozenset())
        out.fx = [output_node] if output_node is not None else []
        self.groups.append(out)
        groups = self.groups
        keep = [g.live for g in groups]
        keep[0] = True
        # A node with nothing feeding it is built from the input's shape (positions, rotary and
        # ALiBi tables) and gets an edge from the input. One computed from parameters or buffers
        # alone (a relative-position MLP over coordinates, a pooling head's learned query) is a
        # subgraph rooted at them: it keeps no input edge and feeds what consumes it.
        for g in groups[1:]:
            g.inputs = {i for i in g.inputs if keep[i]}
            if not g.inputs and not (g.params and g.op not in ("embedding", *_LEAF_KEEP_WITHOUT_INPUT)):
                if g.op == "embedding":  # looked up by positions, not by the input's tokens
                    g.op = "pos_embedding"
                g.inputs = {self.INPUT}
        # drop parameter-free nodes that do not reach the output (dead code in the forward),
        # walking the groups in data-flow order: an attention group is created at its first op,
        # before groups it consumes (a relative-position bias computed inside its module)
        users: dict[int, set[int]] = {i: set() for i in range(len(groups))}
        for i, g in enumerate(groups):
            if keep[i]:
                for s in g.inputs:
                    users[s].add(i)
        reaches = {len(groups) - 1}
        for i in reversed(_topological([i for i in range(len(groups)) if keep[i]], groups)):
            if users[i] & reaches:
                reaches.add(i)
        for i, g in enumerate(groups):
            if keep[i] and i not in reaches and not g.params and i != self.INPUT:
                keep[i] = False
        for g in groups:
            g.inputs = {i for i in g.inputs if keep[i]}
        order = _topological([i for i in range(len(groups)) if keep[i]], groups)
        # an output head is a linear layer with no parametric layer after it (DeiT has two)
        parametric_after: dict[int, bool] = {}
        for gid in reversed(order):
            after = [u for u in users[gid] if keep[u]]
            parametric_after[gid] = any(
                parametric_after[u] or groups[u].params or groups[u].attrs.get("tied") for u in after
            )
            if groups[gid].op == "linear" and not parametric_after[gid]:
                groups[gid].op = "head"
        index = {gid: k for k, gid in enumerate(order)}
        names: dict[str, int] = {}
        nodes = []
        for gid in order:
            g = groups[gid]
            nodes.append(
                Node(
                    op=g.op,
                    name=_unique(self._name(g), names),
                    module=g.module,
                    params=g.params,
                    attrs=g.attrs if g.op == "attention" else {**self._attrs(g), **g.attrs},
                )
            )
        edges = sorted((index[s], index[gid]) for gid in order for s in groups[gid].inputs)
        return ArchGraph(nodes=nodes, edges=edges)

    def _name(self, g: Group) -> str:
        if g.op in ("input", "output"):
            return g.op
        if g.fx and self.leaf(g.fx[0]) is not None and g.op not in ("attention", "moe"):
            return g.module
        return f"{g.module}.{g.op}" if g.module else g.op

    def _attrs(self, g: Group) -> dict[str, Any]:
        """Op attributes worth a hypernetwork's or a compiler's attention."""
        attrs: dict[str, Any] = {}
        module: Any = None  # the leaf module, read by its attributes (kernel_size, eps, ...)
        if g.fx and self.leaf(g.fx[0]) is not None:
            module = self.model.get_submodule(g.module)
        if g.op in ("linear", "head"):
            first = next(
                (a for a in g.fx[0].all_input_nodes if is_float(a.meta.get("val")) and a.name not in self.param_names),
                None,
            )
            if first is not None:
                attrs["in_features"] = int(first.meta["val"].shape[-1])
            attrs["out_features"] = int(g.fx[-1].meta["val"].shape[-1])
            # HF Conv1D and x @ W store the weight as (in, out), nn.Linear and F.linear as (out, in)
            if type(module).__name__ == "Conv1D" or (module is None and functional_name(g.fx[0].target) != "linear"):
                attrs["transposed"] = True
        elif g.op in ("layer_norm", "rms_norm"):
            eps = first_attr(module, ("eps", "variance_epsilon")) if module is not None else None
            if eps is not None:
                attrs["eps"] = float(eps)
        elif g.op in ("conv", "patch_embed") and module is not None:
            attrs["kernel"] = list(module.kernel_size)
            attrs["stride"] = list(module.stride)
        elif g.fx and spatial_op(g.fx[0]) == g.op:  # roll, pad, an adaptive pool to one position
            attrs.update(spatial_attrs(g.fx[0], g.op))
        elif g.op == "softcap":
            attrs["cap"] = _softcap(g.fx[0])
        elif g.op == "pow":
            attrs["exponent"] = _exponent(g.fx[0])
        elif g.op == "moe_router":
            attrs["k"] = topk_k(g.fx[0])
        elif g.op == "mean_pool":
            dim = g.fx[0].args[1] if len(g.fx[0].args) > 1 else None
            attrs["dim"] = list(dim) if isinstance(dim, (list, tuple)) else dim
        return attrs


def _exponent(node: fx.Node) -> float | None:
    """The constant exponent of a power op (``sqrt``, ``rsqrt``, ``reciprocal``, ``x ** c``),
    None for other ops and for powers whose exponent is a tensor or whose base is a constant."""
    name = functional_name(node.target)
    if name not in _POWERS:
        return None
    if _POWERS[name] is not None:
        return _POWERS[name]
    base = node.args[0] if node.args else node.kwargs.get("self")
    exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    if not isinstance(base, fx.Node) or isinstance(exponent, fx.Node) or not isinstance(exponent, (int, float)):
        return None
    return float(exponent)


def _topological(ids: list[int], groups: list[Group]) -> list[int]:
    """Kahn's algorithm, ties broken by position in the exported graph (deterministic)."""
    alive = set(ids)
    indeg = {i: len(groups[i].inputs & alive) for i in ids}
    users: dict[int, list[int]] = {i: [] for i in ids}
    for i in ids:
        for s in groups[i].inputs & alive:
            users[s].append(i)
    heap = [(groups[i].order if i else -2, i) for i in ids if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (groups[u].order, u))
    if len(order) != len(ids):
        raise TraceError("the fused graph has a cycle; trace with fold_repeats=False or report this model")
    return order


def _unique(name: str, seen: dict[str, int]) -> str:
    count = seen.get(name, 0)
    seen[name] = count + 1
    return name if count == 0 else f"{name}_{count}"


def _softcap(tanh: fx.Node) -> float | None:
    """c for the pattern c * tanh(x / c), else None."""
    src = tanh.args[0]
    if not (isinstance(src, fx.Node) and functional_name(src.target) in ("div", "mul")):
        return None
    scalar = src.args[1] if len(src.args) > 1 else None
    if not isinstance(scalar, (int, float)):
        return None
    cap = float(scalar) if functional_name(src.target) == "div" else 1.0 / float(scalar)
    users = list(tanh.users)
    if len(users) != 1 or functional_name(users[0].target) != "mul":
        return None
    other = [a for a in users[0].args if a is not tanh]
    if len(other) != 1 or not isinstance(other[0], (int, float)) or abs(float(other[0]) - cap) > 1e-6 * abs(cap):
        return None
    return cap

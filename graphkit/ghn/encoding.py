"""What the hypernetwork reads: an architecture encoded once, then reused every time it is sampled.

An :class:`EncodedGraph` holds everything LoGAH needs about one architecture as small CPU
tensors and Python tuples: node op ids, shape buckets, clamped degrees, the dense directed
shortest-path matrix, the parameters to predict (:class:`Target`) and the decoder's queries, one
per parameter and chunk, already grouped by the ``(kind, role map, rows, cols)`` of the block
they decode to. A training step only concatenates and pads these; nothing is traced, walked or sorted again.
``ArchGraph.to_pyg()`` stays the export for PyG users; it is not the hypernetwork's input.

    >>> encoded = encode(graph, ghn.config)
    >>> params = ghn([encoded])[0]
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from graphkit.errors import EncodingError
from graphkit.ghn.config import ROLE_KEYS, LoGAHConfig, VariantError
from graphkit.ghn.stream import scalable_norm, stream_writers, table_params, tied_params
from graphkit.graph import ArchGraph, Node, without_block_indices
from graphkit.ops import op_id

SHAPE_BUCKETS = 128  # log2 buckets, 4 per octave: sizes up to 2^32
#: the ops whose 1-D weight is a normalisation's scale, decoded as one (``activate``: 1 at 0).
#: BatchNorm and GroupNorm belong here as much as LayerNorm: decoded as biases their scales
#: started near 0 and silenced LeViT's, FastViT's or MaxViT's every block and head
#: (docs/experiments.md, "Where training across vision families stops").
NORM_OPS = frozenset({"layer_norm", "rms_norm", "batch_norm", "group_norm"})


@dataclass(frozen=True)
class Target:
    """One parameter to predict: its state-dict name, the node (index) and slot it hangs off, its
    shape, and how its values are scaled."""

    name: str
    node: int
    slot: int
    shape: tuple[int, ...]
    kind: str  # "weight", "norm" (norm scale) or "bias" (any other 1-D parameter)
    fan_in: int
    offset: float = 0.0  # added to a 1-D parameter's output: its model's init constant less activate(kind, 0)
    # then multiplies it: 1 / the model's logit scale on its final norm (head_input_factors); a
    # weight's RMS: LoGAHConfig.table_gain on a token or position table, or 1 / it on the stream's
    # writers where the stream can be written smaller instead (targets, graphkit.ghn.stream)
    factor: float = 1.0

    @property
    def matrix_shape(self) -> tuple[int, int]:
        """The 2-D shape the decoder produces: (C, 1) for 1-D, (Cout h, Cin w) for 4-D."""
        s = self.shape
        if len(s) == 1:
            return s[0], 1
        if len(s) == 4:
            return s[0] * s[2], s[1] * s[3]
        return math.prod(s[:-1]), s[-1]

    def finish(self, matrix: Tensor) -> Tensor:
        """The decoded matrix at the parameter's shape, with the 1-D output functions applied."""
        return self.reshape(self.activate(matrix))

    def activate(self, values: Tensor) -> Tensor:
        """:func:`activate` for this parameter's kind, then :meth:`anchor`."""
        return self.anchor(activate(self.kind, values))

    def anchor(self, values: Tensor) -> Tensor:
        """Activated values with this parameter's :attr:`offset` added, then times its :attr:`factor`."""
        values = values + self.offset if self.offset else values
        return values * self.factor if self.factor != 1.0 else values

    def reshape(self, matrix: Tensor) -> Tensor:
        """The decoded (activated) matrix at the parameter's shape."""
        if len(self.shape) == 1:
            return matrix[:, 0]
        if len(self.shape) == 4:
            cout, cin, h, w = self.shape
            return matrix.view(cout, h, cin, w).permute(0, 2, 1, 3).contiguous()
        return matrix.reshape(self.shape)


#: what :func:`activate` gives a 1-D parameter of each kind at 0: the value it starts at by convention
AT_ZERO = {"norm": 1.0, "bias": 0.0}


def activate(kind: str, values: Tensor) -> Tensor:
    """GHN-3's output functions: norm scales 2 sigmoid(x / 2) (1 at x = 0), biases tanh(x / 5);
    weights are scaled by the decoder itself."""
    if kind == "norm":
        return 2 * torch.sigmoid(values / 2)
    if kind == "bias":
        return torch.tanh(values / 5)
    return values


#: module names that say a layer's type, not its role: a ``layer`` role skips them for the module that holds them
WRAPPERS = frozenset({"linear", "layer", "base_layer"})


def role_of(name: str, key: str = "name") -> str:
    """A parameter's role, as ``key`` (one of :data:`~graphkit.ghn.config.ROLE_KEYS`) reads its
    state-dict name. ``name``: the name without block indices, so that every block's query
    projection shares one (``transformer.h.3.attn.c_attn.weight`` ->
    ``transformer.h.attn.c_attn.weight``, ``blocks.11.mlp.fc1.bias`` -> ``blocks.mlp.fc1.bias``).
    ``leaf``: of that, the last module name and the parameter (``c_attn.weight``, ``fc1.bias``;
    ``model.layers.0.self_attn.q_proj.weight`` -> ``q_proj.weight``), so that families which name
    their layers alike (transformers' decoders, timm's ViTs) share roles. ``layer``: the leaf, but
    a layer that wraps its projection in a module named for its type (:data:`WRAPPERS`: Moshi's
    and Inkling 2's ``q_proj.linear.weight``, PEFT's ``q_proj.base_layer.weight``) takes its role
    from the wrapper's name (``q_proj.weight``): by leaf every projection of such a model is
    ``linear.weight``, one role without a map of its own, and Moshi's predicted blocks drowned
    what its embeddings and head predicted (docs/experiments.md, "Logit scales"). A block's own
    layer of that name (``model.layers.3.linear.weight``) keeps it. ``leaf`` stays as it was, for
    the checkpoints trained with it (the zoo-vision one trained LeViT's projections as ``linear.weight``).
    A decoder with role maps (``LoGAHConfig.roles``) decodes each role through its own map."""
    if key not in ROLE_KEYS:
        raise VariantError(f"unknown role key {key!r}; accepted: {', '.join(ROLE_KEYS)}", "role_key")
    if key == "siblings":
        raise VariantError("the siblings role key reads all of a model's parameter names: use roles_of", "role_key")
    role = without_block_indices(name)
    if key == "name":
        return role
    parts = name.split(".")
    if key == "layer" and len(parts) >= 3 and parts[-2] in WRAPPERS and not parts[-3].isdigit():
        return f"{parts[-3]}.{parts[-1]}"
    return ".".join(role.split(".")[-2:])


def siblings(names: Iterable[str]) -> dict[str, str]:
    """Per parameter name of ``names`` (one model's), the parameters of the module that holds its
    layer (the layer's parent) and of that module's layers, by their names below it, digits as
    ``*``, sorted: the holding module's signature read off names alone, as a traced graph holds them
    (``{proj.bias, proj.weight, qkv.bias, qkv.weight}`` for ``blocks.3.attn.qkv.weight``; a
    top-level parameter's is the model's own top level)."""
    names = list(names)
    below: dict[str, set[str]] = {}
    for name in names:
        parts = name.split(".")
        for depth in (len(parts) - 1, len(parts) - 2):  # the parameter's module, and that module's parent
            if depth >= 0:
                below.setdefault(".".join(parts[:depth]), set()).add(re.sub(r"\d+", "*", ".".join(parts[depth:])))
    return {name: "{" + ", ".join(sorted(below[".".join(name.split(".")[:-2])])) + "}" for name in names}


def roles_of(names: Iterable[str], key: str = "name") -> dict[str, str]:
    """The role of each parameter name of ``names``, all of one model's, as ``key`` reads it:
    :func:`role_of`'s for the keys that read a name alone; for ``siblings``, the leaf role in its
    :func:`siblings` context (``qkv.weight in {proj.bias, proj.weight, qkv.bias, qkv.weight}``).

    Why ``siblings``: trained directly on zoo-vits-mini's whole train split (36 families), one
    tensor per leaf role fits to 2.19, where one per leaf and holding module's class fits to 1.57
    and one per leaf and holding module's parameter names to 1.76: families pull a leaf's one
    tensor their own ways, and the holding module tells which way (docs/experiments.md, "Keyed by
    context"). The names are what a traced graph holds of that module; its class it does not record.
    In the hypernetwork (role factors started at the roles' means) the leaf key fits that split as
    well (1.79 against 1.85): its encoder already tells the contexts apart."""
    names = list(names)
    if key != "siblings":
        return {name: role_of(name, key) for name in names}
    return {name: f"{role_of(name, 'leaf')} in {context}" for name, context in siblings(names).items()}


def frequent_roles(graphs: Iterable[ArchGraph], key: str = "name", limit: int | None = None) -> list[str]:
    """The parameter roles (:func:`role_of` with ``key``) of ``graphs``, sorted by name; with
    ``limit``, only the ``limit`` most frequent: those that the most graphs have (a role repeated
    in every block of one graph counts once, so that roles many families share come first), ties
    broken by name, so that the choice is the same on every run."""
    seen: collections.Counter[str] = collections.Counter()
    for graph in graphs:
        seen.update(set(roles_of((name for node in graph.nodes for name in node.params), key).values()))
    ranked = sorted(seen, key=lambda role: (-seen[role], role))
    return sorted(ranked[:limit])


def targets(graph: ArchGraph, max_slots: int = 8, anchors: bool = False, table_gain: float = 1.0) -> list[Target]:
    """Every parameter of ``graph`` as a :class:`Target`, in node order. With ``anchors``, a 1-D
    parameter that the model's constructor fills with a constant (``graph.meta["init"]``, recorded
    by the tracer: :func:`~graphkit.tracing.tracer.init_constants`) is decoded around that
    constant instead of its kind's (:attr:`Target.offset`): Gemma's norm gains around 0,
    Zaya's residual gains around 1, a zero-initialised BatchNorm around 0; and the token and
    position tables at ``table_gain`` times the weights' RMS (:attr:`Target.factor`), a tied table
    only where the norm its head reads undoes the gain on the logits (:func:`head_input_factors`).
    Where the graph proves it the same function (:func:`~graphkit.ghn.stream.stream_writers`), the
    gain is written the other way round: tables at the weights' RMS and the residual stream's writers
    ``table_gain`` times smaller, a tied head's norm without the gain's inverse, the stream at the
    scale of the model's own init rather than ``table_gain`` times it.
    EncodingError when ``anchors`` are asked of a graph without that record (traced on the meta
    device): decoded without them its 1-D parameters would not be what the hypernetwork trained."""
    if anchors and "init" not in graph.meta:
        raise EncodingError(
            f"{graph.meta.get('model_class', 'the model')}: its graph records no init constants (it was traced on "
            "the meta device); this hypernetwork decodes 1-D parameters around them: trace the model with its "
            "weights, or add them with graphkit.ghn.pool.with_init_constants"
        )
    constants = graph.meta["init"] if anchors else {}
    factors = {}
    if anchors:
        tables = table_params(graph)
        tied = bool(tables & tied_params(graph))
        table_gain = applied_table_gain(graph, table_gain)
        writers = stream_writers(graph) if table_gain != 1.0 else None
        if writers is None:
            factors = head_input_factors(graph, table_gain if tied else 1.0)
            factors.update((name, table_gain) for name in tables if table_gain != 1.0)
        else:  # the tables' gain as the writers' 1 / gain; the head's norm then reads the stream it was trained for
            factors = head_input_factors(graph)
            factors.update((name, factors.get(name, 1.0) / table_gain) for name in writers - tables)
    out = []
    for i, node in enumerate(graph.nodes):
        for slot, (name, shape) in enumerate(node.params.items()):
            shape = tuple(shape)
            offset = 0.0
            if len(shape) == 1:
                kind = "norm" if node.op in NORM_OPS and name.endswith("weight") else "bias"
                anchor = constants.get(without_block_indices(name))
                if anchor is not None:
                    offset = float(anchor) - AT_ZERO[kind]
            else:
                kind = "weight"
            if len(shape) == 4:
                fan_in = shape[1] * shape[2] * shape[3]
            else:
                fan_in = shape[0] if node.attrs.get("transposed") and len(shape) == 2 else shape[-1]
            out.append(Target(name, i, min(slot, max_slots - 1), shape, kind, fan_in, offset, factors.get(name, 1.0)))
    return out


def applied_table_gain(graph: ArchGraph, table_gain: float) -> float:
    """``table_gain`` as :func:`targets` applies it to ``graph``: 1 where a head reads the token
    table and no norm before it can undo the gain on the logits (:func:`scalable_head_norm`)."""
    if table_gain != 1.0 and table_params(graph) & tied_params(graph) and scalable_head_norm(graph) is None:
        return 1.0
    return table_gain


def scalable_head_norm(graph: ArchGraph) -> Node | None:
    """The norm ``graph``'s head reads, where a factor on its gain scales the logits; None where
    the head reads something else, or a norm whose gain starts at 0 (Gemma's ``1 + w``, which a
    factor would not scale)."""
    source = graph.head_input()
    return None if source is None or not scalable_norm(graph, graph.nodes[source]) else graph.nodes[source]


def head_input_factors(graph: ArchGraph, tied_gain: float = 1.0) -> dict[str, float]:
    """1 / (``graph.meta["logit_scale"]`` times ``tied_gain``, the gain of a tied token table
    the head reads) for each parameter of the :func:`scalable_head_norm`, by name; none where that
    is 1 or there is no such norm.

    Why: a model that scales its logits by a constant (Cohere by 1/16, Inkling by 1/24) is a
    graph like any other (the tracer folds constants), and a hypernetwork that learned the logits
    of models at scale 1 predicts its logits that much too small, near uniform. The final norm's
    gain and bias, times the inverse, give the head what it would read at scale 1: the logits the
    hypernetwork meant, exactly (:func:`~graphkit.tracing.tracer.logit_scale`)."""
    scale, norm = float(graph.meta.get("logit_scale") or 1.0) * tied_gain, scalable_head_norm(graph)
    if scale == 1.0 or norm is None:
        return {}
    return {name: 1.0 / scale for name in norm.params}


@dataclass(frozen=True)
class EncodedGraph:
    """One architecture as LoGAH reads it (see the module docstring). Tensors live on the CPU;
    the model batches and moves them."""

    ops: Tensor  # (N,) op ids
    shapes: Tensor  # (N, 4) shape-bucket ids, dimension j offset by j * SHAPE_BUCKETS
    in_degree: Tensor  # (N,) clamped to max_degree
    out_degree: Tensor
    distance: Tensor  # (N, N) directed shortest paths clamped to max_distance; max_distance + 1: unreachable
    depth: Tensor  # (N,) relative depth bucket: the distance from the input over the deepest node's
    tied: Tensor  # (N,) 1 for a node that owns or reads a tied token table (tied_nodes), else 0
    targets: tuple[Target, ...]
    queries: Tensor  # (Q, 4): node, slot, row chunk, column chunk of each decoder query
    first_query: tuple[int, ...]  # per target, its first query; its chunks follow row-major
    grid: tuple[tuple[int, int], ...]  # per target, (row chunks, column chunks)
    roles: tuple[int, ...]  # per target, its role map: 0 the shared map alone, i + 1 config.roles[i]'s
    groups: dict[tuple[str, int, int, int], tuple[int, ...]]  # (kind, role, rows, cols) -> its queries

    @property
    def num_nodes(self) -> int:
        """Nodes of the architecture's graph."""
        return len(self.ops)


def relative_depth(graph: ArchGraph, distance: Tensor, buckets: int) -> Tensor:
    """Each node's unclamped distance from the input node over the deepest node's, in ``buckets``
    equal buckets (0 for nodes the input does not reach, such as position embeddings; all 0 when
    ``buckets`` is 0).

    Why: a transformer's graph is periodic. The same op in block 1 and in block 12 has the same
    degrees, shapes and neighbours at every distance the attention bias can tell apart, so without
    this feature the encoder gave them embeddings with cosine 0.9998 and every block got the same
    predicted weights; fine-tuning from identical blocks stalled on the unigram plateau. Relative
    rather than absolute depth, so that a deeper model than any seen in training still spans the
    same range from its first block to its last. Off by default (``buckets`` 0): over 8 held-out
    GPT-2s it did not yet change the 300-step verdict (docs/experiments.md)."""
    if buckets == 0:
        return torch.zeros(len(graph.nodes), dtype=torch.long)
    source = next(i for i, node in enumerate(graph.nodes) if node.op == "input")
    hops = distance[source].clamp(min=0).float()
    return (hops / hops.max().clamp(min=1) * (buckets - 1)).round().long()


def tied_nodes(graph: ArchGraph, enabled: bool = True) -> Tensor:
    """1 for each output head that reads a tied token table (its ``tied`` attribute) and for the
    node that owns that table, else 0 (all 0 when not ``enabled``).

    Why: in a tied model one table is both the input embedding and the output layer; in an untied
    one the embedding is only the input. Without this feature the two embedding nodes look the same
    to the encoder, so a hypernetwork trained on both kinds predicts one table for both jobs and
    settles on a unigram-like one (docs/experiments.md, "Tied embeddings, predicted")."""
    flags = torch.zeros(len(graph.nodes), dtype=torch.long)
    if not enabled:
        return flags
    shared = tied_params(graph)
    for i, node in enumerate(graph.nodes):
        if (node.op == "head" and node.attrs.get("tied")) or shared.intersection(node.params):
            flags[i] = 1
    return flags


def encode(graph: ArchGraph, config: LoGAHConfig) -> EncodedGraph:
    """Encode ``graph`` for a LoGAH of ``config``; EncodingError if a parameter is wider than
    ``max_chunks * max_mask`` or a node's op is newer than the vocabulary the LoGAH reads."""
    n = len(graph.nodes)
    ops = [op_id(node.op) for node in graph.nodes]
    newer = next((i for i, op in enumerate(ops) if op >= config.num_ops), None)
    if newer is not None:
        node = graph.nodes[newer]
        raise EncodingError(
            f"node {node.name!r} has op {node.op!r}, which is newer than the {config.num_ops} ops this "
            "hypernetwork reads; retrain it with `graphkit train-ghn`"
        )
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    size = torch.tensor([node.largest_shape(4) for node in graph.nodes], dtype=torch.long).reshape(n, 4).float()
    buckets = torch.where(size > 0, (torch.log2(size + 1) * 4).long().clamp(max=SHAPE_BUCKETS - 1) + 1, 0)
    dist = torch.from_numpy(graph.shortest_paths()).long()
    depth = relative_depth(graph, dist, config.depth_buckets)
    dist = torch.where(dist < 0, config.max_distance + 1, dist.clamp(max=config.max_distance))

    k = config.max_mask
    plan = targets(graph, config.max_slots, config.init_anchors, config.table_gain)
    role_index = {role: i + 1 for i, role in enumerate(config.roles)}
    role_names = roles_of((t.name for t in plan), config.role_key)
    roles = tuple(role_index.get(role_names[t.name], 0) for t in plan)  # unseen: 0, shared
    queries: list[tuple[int, int, int, int]] = []
    first: list[int] = []
    grid: list[tuple[int, int]] = []
    for t in plan:
        rows, cols = t.matrix_shape
        grid.append((math.ceil(rows / k), math.ceil(cols / k)))
        if max(grid[-1]) > config.max_chunks:
            raise EncodingError(
                f"parameter {t.name!r} {t.shape} is wider than max_chunks * K = {config.max_chunks * k:,}"
            )
        first.append(len(queries))
        queries.extend((t.node, t.slot, i // k, j // k) for i in range(0, rows, k) for j in range(0, cols, k))
    return EncodedGraph(
        ops=torch.tensor(ops, dtype=torch.long),
        shapes=buckets + torch.arange(4) * SHAPE_BUCKETS,
        in_degree=torch.from_numpy(np.bincount(edges[:, 1], minlength=n)).clamp(max=config.max_degree),
        out_degree=torch.from_numpy(np.bincount(edges[:, 0], minlength=n)).clamp(max=config.max_degree),
        distance=dist,
        depth=depth,
        tied=tied_nodes(graph, config.tie_feature),
        targets=tuple(plan),
        queries=torch.tensor(queries, dtype=torch.long).reshape(-1, 4),
        first_query=tuple(first),
        grid=tuple(grid),
        roles=roles,
        groups=query_groups(plan, roles, first, k),
    )


def query_groups(
    plan: Sequence[Target], roles: Sequence[int], first: Sequence[int], k: int
) -> dict[tuple[str, int, int, int], tuple[int, ...]]:
    """The queries of ``plan`` (each target's first at ``first``, its chunks row-major after it)
    grouped by the ``(kind, role map, rows, cols)`` of the block each decodes to: one batched
    product per group."""
    groups: dict[tuple[str, int, int, int], list[int]] = {}
    for t, role, query in zip(plan, roles, first):
        rows, cols = t.matrix_shape
        for i in range(0, rows, k):
            for j in range(0, cols, k):
                groups.setdefault((t.kind, role, min(k, rows - i), min(k, cols - j)), []).append(query)
                query += 1
    return {key: tuple(v) for key, v in groups.items()}


def with_roles(encoded: EncodedGraph, roles: Sequence[int], config: LoGAHConfig) -> EncodedGraph:
    """``encoded`` with each target decoded through the role map ``roles`` gives it instead
    (:meth:`~graphkit.ghn.model.LoGAH.nearest_roles`: a trained role for a role the checkpoint
    never saw)."""
    roles = tuple(roles)
    if len(roles) != len(encoded.targets):
        raise EncodingError(f"{len(roles)} roles for {len(encoded.targets)} parameters")
    groups = query_groups(encoded.targets, roles, encoded.first_query, config.max_mask)
    return replace(encoded, roles=roles, groups=groups)


#: a target's kind, by its index in a role signature (:func:`role_signature`)
KINDS = ("weight", "norm", "bias")


def role_signature(target: Target) -> int:
    """What a role map stands in for, as one number: the target's kind (:data:`KINDS`) and its
    number of dimensions. A parameter of a role a checkpoint never saw takes the nearest trained
    role of its own signature, so a convolution's kernel never decodes as a norm's scale."""
    return KINDS.index(target.kind) * 8 + len(target.shape)

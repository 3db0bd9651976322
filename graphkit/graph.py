"""ArchGraph: the one representation of an architecture that every part of graphkit passes around.

A graph is a list of op nodes in topological order plus directed data-flow edges between them.
It is plain data (strings, ints, lists, dicts), so it serialises losslessly to JSON with
:meth:`ArchGraph.to_dict` and can be read by any tool without graphkit.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from graphkit.errors import GraphError
from graphkit.ops import OPS_VERSION, attention_kind, is_known_op, op_id, window_text

if TYPE_CHECKING:
    from pathlib import Path

    import networkx
    from torch_geometric.data import Data

    from graphkit.draw import Drawing

Shape = tuple[int, ...]


def _plain(value: Any) -> Any:
    """Normalise an attribute value to what JSON gives back (tuples become lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    raise TypeError(f"node attribute values must be JSON data, got {type(value).__name__}: {value!r}")


@dataclass(frozen=True)
class Node:
    """One op of the graph.

    ``name`` is unique in the graph; ``module`` is the path of the nn.Module the op ran in
    (``""`` for the root); ``params`` maps the state-dict names of the parameters this node
    owns to their shapes.
    """

    op: str
    name: str
    module: str = ""
    params: dict[str, Shape] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", {k: tuple(int(d) for d in s) for k, s in self.params.items()})
        object.__setattr__(self, "attrs", _plain(dict(self.attrs)))

    @property
    def num_params(self) -> int:
        """Number of parameter elements this node owns."""
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.params.values())

    def largest_shape(self, rank: int = 4) -> list[int]:
        """The shape of this node's largest parameter (most dims, then most elements), cut or
        zero-padded to ``rank`` dims; zeros without parameters. A fixed-width node feature:
        ``to_pyg``'s ``param_shape`` and the dataset rows' ``node_feat`` use it."""
        shape = max(self.params.values(), key=lambda s: (len(s), math.prod(s)), default=())[:rank]
        return list(shape) + [0] * (rank - len(shape))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: shapes as lists."""
        return {
            "op": self.op,
            "name": self.name,
            "module": self.module,
            "params": {k: list(s) for k, s in self.params.items()},
            "attrs": self.attrs,
        }


@dataclass
class ArchGraph:
    """A computation DAG: ``nodes`` in topological order, ``edges`` as (src, dst) node indices.

    ``meta`` holds graph-level facts (family, model_class, num_params, input_shapes,
    ops_version, and ``init``: the 1-D parameters the model's constructor fills with one
    constant, :func:`graphkit.tracing.tracer.init_constants`, with ``logit_scale`` beside it
    where the model scales its logits by a constant, :func:`graphkit.tracing.tracer.logit_scale`;
    and ``spare``: the parameters that cannot change the output, owned by no node, name -> shape:
    those the forward never reads, :func:`graphkit.tracing.builder.is_spare`, and those it reads
    only into values it discards); it is not part of the :meth:`fingerprint`.
    """

    nodes: list[Node]
    edges: list[tuple[int, int]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.edges = [(int(s), int(d)) for s, d in self.edges]
        self.meta = _plain(dict(self.meta))

    # -- size and summary ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def num_params(self) -> int:
        """Total parameter elements owned by the nodes (tied parameters counted once)."""
        return sum(n.num_params for n in self.nodes)

    def head_input(self) -> int | None:
        """The node (index) the graph's one ``head`` node reads, where it has one head with one
        input; else None. Where a model's logit scale is measured and undone."""
        heads = [i for i, node in enumerate(self.nodes) if node.op == "head"]
        sources = [s for s, d in self.edges if heads and d == heads[0]]
        return sources[0] if len(heads) == 1 and len(sources) == 1 else None

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each op, most common first."""
        return dict(Counter(n.op for n in self.nodes).most_common())

    def attention_layout(self) -> list[dict[str, Any]]:
        """One entry per distinct attention configuration: kind (MHA/MQA/GQA), heads, kv_heads,
        causal, window (a sliding window's size, or an image window's sides such as [7, 7]), rope
        and how many layers use it."""
        rows: Counter[tuple] = Counter()
        for node in self.nodes:
            if node.op != "attention":
                continue
            a = node.attrs
            heads, kv, window = a.get("heads"), a.get("kv_heads"), a.get("window")
            window = tuple(window) if isinstance(window, list) else window  # Swin's [7, 7], as a key
            rows[
                (attention_kind(a), heads, kv, a.get("head_dim"), bool(a.get("causal")), window, bool(a.get("rope")))
            ] += 1
        keys = ("kind", "heads", "kv_heads", "head_dim", "causal", "window", "rope")
        return [
            dict(zip(keys, k), layers=count, window=list(k[5]) if isinstance(k[5], tuple) else k[5])
            for k, count in rows.items()
        ]

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Lossless JSON-serialisable form: ``{"nodes": [...], "edges": [[s, d], ...], "meta": {...}}``."""
        return {
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [[s, d] for s, d in self.edges],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArchGraph:
        """Inverse of :meth:`to_dict`; raises GraphError on a malformed mapping."""
        try:
            nodes = [
                Node(
                    op=n["op"],
                    name=n["name"],
                    module=n.get("module", ""),
                    params={k: tuple(v) for k, v in n.get("params", {}).items()},
                    attrs=n.get("attrs", {}),
                )
                for n in data["nodes"]
            ]
            edges = [(s, d) for s, d in data["edges"]]
        except (KeyError, TypeError, ValueError) as e:
            raise GraphError(f"not a graphkit graph: {type(e).__name__}: {e}") from e
        return cls(nodes=nodes, edges=edges, meta=dict(data.get("meta", {})))

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> ArchGraph:
        """Inverse of :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise GraphError(f"not JSON: {e}") from e
        return cls.from_dict(data)

    def fingerprint(self) -> str:
        """Stable content hash of nodes and edges (not meta): equal graphs, equal fingerprints,
        in any process and on any machine."""
        body = {"nodes": [n.to_dict() for n in self.nodes], "edges": [[s, d] for s, d in self.edges]}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    # -- checks ---------------------------------------------------------------------------------
    def validate(self, params: Mapping[str, Iterable[int]] | None = None) -> None:
        """Raise GraphError unless the graph is a well-formed computation DAG.

        Checked: known ops, unique names, edges in range and in topological order (so acyclic),
        one input node, every node reaching an output (nodes computed from parameters or buffers
        alone, such as a relative-position MLP, need not be reachable from the input), each
        parameter owned by exactly one node, and, when ``params`` (state-dict name -> shape, e.g.
        from ``model.named_parameters()``) is given, that the owned parameters are exactly those.
        """
        n = len(self.nodes)
        names: set[str] = set()
        owner: dict[str, str] = {}
        for node in self.nodes:
            if not is_known_op(node.op):
                raise GraphError(f"node {node.name!r} has unknown op {node.op!r}")
            if node.name in names:
                raise GraphError(f"node name {node.name!r} appears twice")
            names.add(node.name)
            for p in node.params:
                if p in owner:
                    raise GraphError(f"parameter {p!r} is owned by both {owner[p]!r} and {node.name!r}")
                owner[p] = node.name
        for s, d in self.edges:
            if not (0 <= s < n and 0 <= d < n):
                raise GraphError(f"edge ({s}, {d}) points outside the {n} nodes")
            if s >= d:
                raise GraphError(
                    f"edge {self.nodes[s].name!r} -> {self.nodes[d].name!r} goes backwards: "
                    "the graph has a cycle or its nodes are not in topological order"
                )
        inputs = [i for i, node in enumerate(self.nodes) if node.op == "input"]
        outputs = [i for i, node in enumerate(self.nodes) if node.op == "output"]
        if len(inputs) != 1 or not outputs:
            raise GraphError(
                f"a graph needs exactly one input node and an output node, found {len(inputs)} and {len(outputs)}"
            )
        _, pred = self._adjacency()
        seen = self._reach(outputs, pred)
        missing = [self.nodes[i].name for i in range(n) if not seen[i]]
        if missing:
            raise GraphError(f"node {missing[0]!r} is not connected to the output ({len(missing)} such nodes)")
        if params is not None:
            expected = {k: tuple(int(d) for d in s) for k, s in params.items()}
            owned = {p: s for node in self.nodes for p, s in node.params.items()}
            for p, shape in expected.items():
                if p not in owned:
                    raise GraphError(f"parameter {p!r} of the model is owned by no node")
                if owned[p] != shape:
                    raise GraphError(
                        f"parameter {p!r} has shape {list(owned[p])} in the graph but {list(shape)} in the model"
                    )
            extra = sorted(set(owned) - set(expected))
            if extra:
                raise GraphError(f"node parameter {extra[0]!r} is not a parameter of the model")

    def _adjacency(self) -> tuple[list[list[int]], list[list[int]]]:
        succ: list[list[int]] = [[] for _ in self.nodes]
        pred: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            succ[s].append(d)
            pred[d].append(s)
        return succ, pred

    @staticmethod
    def _reach(start: list[int], nbrs: list[list[int]]) -> list[bool]:
        seen = [False] * len(nbrs)
        stack = list(start)
        for i in start:
            seen[i] = True
        while stack:
            for j in nbrs[stack.pop()]:
                if not seen[j]:
                    seen[j] = True
                    stack.append(j)
        return seen

    # -- views for other libraries -----------------------------------------------------------
    def shortest_paths(self) -> np.ndarray:
        """Directed shortest-path lengths ``D[i, j]`` from node i to node j (0 on the diagonal,
        -1 where j is unreachable from i): the distance matrix Graphormer's attention bias needs.
        Its transpose gives the backward direction."""
        n = len(self.nodes)
        unreachable = np.iinfo(np.int32).max // 2
        # row j holds the distances from every source to j; filled in topological order.
        to = np.full((n, n), unreachable, dtype=np.int32)
        np.fill_diagonal(to, 0)
        _, pred = self._adjacency()
        for j in range(n):
            for p in pred[j]:
                if p >= j:
                    raise GraphError("shortest_paths needs nodes in topological order; call validate()")
                np.minimum(to[j], to[p] + 1, out=to[j])
        dist = to.T.copy()
        dist[dist >= unreachable] = -1
        return dist

    def to_networkx(self) -> networkx.DiGraph:
        """A networkx DiGraph; node i carries op, name, module, params and attrs; graph attrs are meta."""
        import networkx as nx  # noqa: PLC0415 (ArchGraph loads without networkx and torch)

        g = nx.DiGraph(**self.meta)
        for i, node in enumerate(self.nodes):
            g.add_node(
                i, op=node.op, name=node.name, module=node.module, params=dict(node.params), attrs=dict(node.attrs)
            )
        g.add_edges_from(self.edges)
        return g

    def to_pyg(self) -> Data:
        """A torch_geometric ``Data`` for Graphormer-style models.

        Fields: ``x`` (op ids, long [N], see :data:`graphkit.OPS`), ``edge_index`` (long [2, E]),
        ``in_degree`` / ``out_degree`` (long [N]), the directed shortest-path matrix of
        :meth:`shortest_paths` in COO form, ``spd_index`` (long [2, P], every reachable pair i != j)
        and ``spd_value`` (long [P], its distance), ``param_shape`` (long [N, 4]: the shape of the
        node's largest parameter, zero-padded) and ``num_nodes``. The COO form
        batches in PyG's DataLoader like ``edge_index``; ``to_dense_adj(spd_index, batch,
        spd_value)`` restores the padded [B, N, N] matrix (0 on the diagonal and where unreachable).
        """
        import torch  # noqa: PLC0415

        from graphkit.compat import pyg_data  # noqa: PLC0415

        Data = pyg_data().Data
        n = len(self.nodes)
        edge_index = torch.tensor(self.edges, dtype=torch.long).reshape(-1, 2).t().contiguous()
        shapes = [node.largest_shape(4) for node in self.nodes]
        dist = torch.from_numpy(self.shortest_paths()).long()
        spd_index = (dist > 0).nonzero().t().contiguous()
        return Data(
            x=torch.tensor([op_id(node.op) for node in self.nodes], dtype=torch.long),
            edge_index=edge_index,
            in_degree=torch.bincount(edge_index[1], minlength=n),
            out_degree=torch.bincount(edge_index[0], minlength=n),
            spd_index=spd_index,
            spd_value=dist[spd_index[0], spd_index[1]],
            param_shape=torch.tensor(shapes, dtype=torch.long).reshape(n, 4),
            num_nodes=n,
        )

    def draw(self, path: str | Path, *, expand: bool = False) -> Drawing:
        """Draw the graph top to bottom to ``path`` (.svg, .png or .pdf), repeated blocks folded
        into one frame marked "x N" unless ``expand``; see :func:`graphkit.draw.draw`."""
        from graphkit.draw import draw  # noqa: PLC0415 (matplotlib and grandalf, loaded on use)

        return draw(self, path, expand=expand)

    def summary(self) -> str:
        """A few readable lines: size, op counts, attention layout and mixture-of-experts layers."""
        meta = self.meta
        head = meta.get("model_class", "model").rsplit(".", 1)[-1]
        lines = [
            f"{head} ({meta.get('family', 'custom')}): {self.num_params:,} parameters, "
            f"{len(self.nodes)} nodes, {len(self.edges)} edges, input {meta.get('input_shapes')}",
            "ops: " + ", ".join(f"{op} {c}" for op, c in self.op_counts().items()),
        ]
        for row in self.attention_layout():
            extra = [
                x
                for x in (
                    "causal" if row["causal"] else "bidirectional",
                    f"window {window_text(row['window'])}" if row["window"] else "",
                    "rope" if row["rope"] else "",
                )
                if x
            ]
            lines.append(
                f"attention: {row['layers']} x {row['kind']} heads={row['heads']} kv_heads={row['kv_heads']} "
                f"head_dim={row['head_dim']} " + " ".join(extra)
            )
        experts = Counter(
            (n.attrs.get("num_experts"), n.attrs.get("top_k"), n.attrs.get("intermediate_size"))
            for n in self.nodes
            if n.op == "moe"
        )
        for (num_experts, top_k, width), layers in experts.items():
            lines.append(f"moe: {layers} x experts={num_experts} top_k={top_k} intermediate_size={width}")
        spare: dict[str, list[str]] = {}  # module -> its spare parameters, each "name [shape]"
        for name, shape in meta.get("spare", {}).items():
            module, _, short = name.rpartition(".")
            spare.setdefault(module, []).append(f"{short} {list(shape)}")
        for module, held in spare.items():
            lines.append(
                f"spare: {module or 'the model'} ({', '.join(held)}), cannot change the output "
                "(predict leaves it at its init)"
            )
        return "\n".join(lines)


def without_block_indices(name: str) -> str:
    """A state-dict name without its block indices (``transformer.h.3.attn.c_attn.weight`` ->
    ``transformer.h.attn.c_attn.weight``): the name every block's copy of a parameter shares."""
    return re.sub(r"\.\d+(?=\.)", "", name)


def graph_meta(**meta: Any) -> dict[str, Any]:
    """Graph metadata with the vocabulary version recorded."""
    return {"ops_version": OPS_VERSION, **meta}

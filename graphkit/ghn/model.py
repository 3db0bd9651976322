"""LoGAH: a Graphormer over an architecture's graph and a low-rank decoder that predicts every
parameter at full shape (arXiv 2405.16287). One file, top to bottom: config, targets, encoder,
decoders, the hypernetwork.

Encoder (as GHN-3): each node starts as its op embedding plus an encoding of its parameter shape
(log-scale buckets per dimension, so 3 and 50,257 both have a place) plus in- and out-degree
embeddings; pre-LayerNorm transformer layers attend over the nodes of each graph (a batch of
graphs is padded and masked) with a learned bias per head for the shortest-path distance in the
forward and in the backward direction.

Decoder (section 3.1, eq. 5): an MLP d -> 4d -> 8d -> 2 r^2 gives two r x r matrices per query;
one linear map r -> K (K = 2048 * 16) turns them into A and B^T (K x r), and a parameter of
shape (Cout, Cin, h, w) is A[:Cout h] B[:, :Cin w], reshaped. Only the rows a parameter needs
are computed (``weight[:rows] @ M``), never the full K, and every query of every graph goes
through the MLP in one call.

Choices beyond the paper:
- **Wider than K.** A dimension larger than K (a 50,257-row embedding) is cut into chunks of K;
  each chunk is decoded from the node embedding plus a learned chunk embedding, so chunks differ
  instead of repeating (GHN-3 tiles a 2,048-row block).
- **Several parameters per node** (weight and bias) are told apart by a slot embedding added to
  the node embedding; a 1-D parameter of size C is the column A[:C] B[:, :1].
- **Output scaling.** Each weight is normalised to RMS g 2 sigmoid(s / 2) / sqrt(fan-in), with
  g = INIT_GAIN and s a scalar the decoder predicts per parameter (0 at init): the scale stays
  bounded, so the early training steps can neither blow it up nor collapse it to zero, a dead
  state where gradients vanish (GHN-3's plain 1/sqrt(fan-in) factor did both here). The RMS comes
  from r x r Gram matrices and is folded into A, so no pass over the full matrix is needed.
  Norm weights 2 sigmoid(p / 2) and biases tanh(p / 5), as GHN-3.

``LoGAHConfig(decoder="ghn3")`` swaps in GHN-3's decoder (eq. 2: a d x d x 16 x 16 block,
cropped and tiled to the target shape) as the baseline the paper compares against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from graphkit.errors import GraphkitError
from graphkit.graph import ArchGraph
from graphkit.ops import OPS

SHAPE_BUCKETS = 128  # log2 buckets, 4 per octave: sizes up to 2^32
DECODERS = ("low_rank", "ghn3")
INIT_GAIN = 0.3  # predicted weights start at RMS INIT_GAIN / sqrt(fan-in): timm's 0.02 at width 256


class VariantError(GraphkitError, ValueError):
    """An unknown LoGAH variant or decoder."""


@dataclass(frozen=True)
class LoGAHConfig:
    """Sizes of a LoGAH model (defaults: LoGAH-tiny)."""

    hidden: int = 64         # d
    layers: int = 3
    heads: int = 8
    rank: int = 32           # r
    max_mask: int = 2048 * 16  # K
    max_degree: int = 64
    max_distance: int = 32
    max_chunks: int = 64     # rows or columns up to max_chunks * K
    max_slots: int = 8       # parameters per node
    decoder: str = "low_rank"  # or "ghn3", the tiling baseline
    spatial: int = 16        # the ghn3 decoder's block is d x d x spatial x spatial

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise VariantError(f"unknown decoder {self.decoder!r}; accepted: {', '.join(DECODERS)}")


#: the variants of the paper's Table 1 (d, layers, heads, r)
VARIANTS: dict[str, LoGAHConfig] = {
    "tiny": LoGAHConfig(hidden=64, layers=3, heads=8, rank=32),
    "small": LoGAHConfig(hidden=128, layers=5, heads=16, rank=90),
    "base": LoGAHConfig(hidden=256, layers=5, heads=16, rank=128),
    "large": LoGAHConfig(hidden=256, layers=12, heads=16, rank=256),
}


# -- what to predict ---------------------------------------------------------------------------
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

    @property
    def matrix_shape(self) -> tuple[int, int]:
        """The 2-D shape the decoder produces: (C, 1) for 1-D, (Cout h, Cin w) for 4-D."""
        s = self.shape
        if len(s) == 1:
            return s[0], 1
        if len(s) == 4:
            return s[0] * s[2], s[1] * s[3]
        return math.prod(s[:-1]), s[-1]

    def finish(self, matrix: torch.Tensor) -> torch.Tensor:
        """The decoded matrix at the parameter's shape, with the 1-D output functions applied."""
        if self.kind == "norm":
            return 2 * torch.sigmoid(matrix[:, 0] / 2)
        if self.kind == "bias":
            return torch.tanh(matrix[:, 0] / 5)
        if len(self.shape) == 4:
            cout, cin, h, w = self.shape
            return matrix.view(cout, h, cin, w).permute(0, 2, 1, 3).contiguous()
        return matrix.reshape(self.shape)


def targets(graph: ArchGraph, max_slots: int = 8) -> list[Target]:
    """Every parameter of ``graph`` as a :class:`Target`, in node order."""
    out = []
    for i, node in enumerate(graph.nodes):
        for slot, (name, shape) in enumerate(node.params.items()):
            shape = tuple(shape)
            if len(shape) == 1:
                kind = "norm" if node.op in ("layer_norm", "rms_norm") and name.endswith("weight") else "bias"
            else:
                kind = "weight"
            if len(shape) == 4:
                fan_in = shape[1] * shape[2] * shape[3]
            else:
                fan_in = shape[0] if node.attrs.get("transposed") and len(shape) == 2 else shape[-1]
            out.append(Target(name, i, min(slot, max_slots - 1), shape, kind, fan_in))
    return out


# -- encoder -----------------------------------------------------------------------------------
class GraphormerLayer(nn.Module):
    """Pre-LayerNorm self-attention with an additive per-head bias, then a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class GraphEncoder(nn.Module):
    """Node embeddings of a batch of graphs (GHN-3's Graphormer)."""

    def __init__(self, c: LoGAHConfig) -> None:
        super().__init__()
        d, self.config = c.hidden, c
        self.op_embed = nn.Embedding(len(OPS), d)
        self.shape_embed = nn.Embedding(4 * SHAPE_BUCKETS, d)
        self.in_degree_embed = nn.Embedding(c.max_degree + 1, d)
        self.out_degree_embed = nn.Embedding(c.max_degree + 1, d)
        # distance buckets: 0..max_distance, then "farther", then "unreachable"
        self.forward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.backward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.layers = nn.ModuleList(GraphormerLayer(d, c.heads) for _ in range(c.layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, graphs: Sequence[Data]) -> list[torch.Tensor]:
        """(N_i, d) node embeddings for each graph (``ArchGraph.to_pyg()`` data)."""
        c, device = self.config, self.op_embed.weight.device
        n = max(g.num_nodes for g in graphs)
        x = torch.zeros(len(graphs), n, c.hidden, device=device)
        dist = torch.full((len(graphs), n, n), c.max_distance + 1, dtype=torch.long, device=device)  # unreachable
        for b, g in enumerate(graphs):
            x[b, :g.num_nodes] = self._node_features(g)
            i, j = g.spd_index.to(device)
            dist[b, i, j] = g.spd_value.to(device).clamp(max=c.max_distance)
        dist[:, torch.arange(n), torch.arange(n)] = 0
        bias = (self.forward_distance(dist) + self.backward_distance(dist.transpose(1, 2))).permute(0, 3, 1, 2)
        pad = torch.ones(len(graphs), n, dtype=torch.bool, device=device)
        for b, g in enumerate(graphs):
            pad[b, :g.num_nodes] = False
        bias = bias.masked_fill(pad[:, None, None, :], float("-inf"))
        for layer in self.layers:
            x = layer(x, bias)
        x = self.norm(x)
        return [x[b, :g.num_nodes] for b, g in enumerate(graphs)]

    def _node_features(self, g: Data) -> torch.Tensor:
        c, device = self.config, self.op_embed.weight.device
        shape = g.param_shape.to(device).float()
        buckets = torch.where(shape > 0, (torch.log2(shape + 1) * 4).long().clamp(max=SHAPE_BUCKETS - 1) + 1, 0)
        return (self.op_embed(g.x.to(device))
                + self.shape_embed(buckets + torch.arange(4, device=device) * SHAPE_BUCKETS).sum(1)
                + self.in_degree_embed(g.in_degree.to(device).clamp(max=c.max_degree))
                + self.out_degree_embed(g.out_degree.to(device).clamp(max=c.max_degree)))


# -- decoders ----------------------------------------------------------------------------------
class LowRankDecoder(nn.Module):
    """LoGAH's decoder: per query two r x r matrices, mapped to A and B^T by one r -> K linear."""

    def __init__(self, c: LoGAHConfig) -> None:
        super().__init__()
        d, self.config = c.hidden, c
        self.slot_embed = nn.Embedding(c.max_slots, d)
        self.row_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.col_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, 8 * d), nn.GELU(),
                                 nn.Linear(8 * d, 2 * c.rank * c.rank))
        # r -> K, shared by A and B^T, without bias as in eq. 5 (r x K parameters): a bias adds the
        # same column to every A and B^T, and their product is then one rank-1 term r b b^T that
        # swamps the rest (every predicted matrix at init had 97% of its energy in one direction)
        self.low_rank = nn.Linear(c.rank, c.max_mask, bias=False)
        # one scalar per parameter for its scale (see forward); zero: every weight starts at INIT_GAIN
        self.gain = nn.Linear(d, 1)
        nn.init.zeros_(self.gain.weight)
        nn.init.zeros_(self.gain.bias)

    def forward(self, nodes: torch.Tensor, plan: Sequence[Target]) -> dict[str, torch.Tensor]:
        """Every target's values from the node embeddings ``nodes`` (N, d)."""
        k, r = self.config.max_mask, self.config.rank
        queries = [(t.node, t.slot, i, j) for t in plan
                   for i in range(math.ceil(t.matrix_shape[0] / k)) for j in range(math.ceil(t.matrix_shape[1] / k))]
        if max(max(q[2], q[3]) for q in queries) >= self.config.max_chunks:
            raise ValueError(f"a parameter is wider than max_chunks * K = {self.config.max_chunks * k:,}")
        node, slot, row, col = torch.tensor(queries, device=nodes.device).t()
        query = nodes[node] + self.slot_embed(slot) + self.row_chunk_embed(row) + self.col_chunk_embed(col)
        factors = self.mlp(query).view(-1, 2, r, r)
        gains = 2 * torch.sigmoid(self.gain(query)[:, 0] / 2)  # in (0, 2), 1 at init
        w = self.low_rank.weight
        out, q = {}, 0
        for t in plan:
            rows, cols = t.matrix_shape
            first = q
            chunks = []  # (A[:h], B^T[:width]) per chunk, row-major
            for i in range(0, rows, k):
                for j in range(0, cols, k):
                    chunks.append((w[:min(k, rows - i)] @ factors[q, 0], w[:min(k, cols - j)] @ factors[q, 1]))
                    q += 1
            if t.kind == "weight":  # RMS from r x r Grams (|A B^T|^2 = sum(A^T A * B B^T)), folded into A
                square = sum(((a.t() @ a) * (bt.t() @ bt)).sum() for a, bt in chunks)
                rms = torch.sqrt(square / (rows * cols) + 1e-12)
                scale = INIT_GAIN * gains[first] / (math.sqrt(t.fan_in) * rms)
                chunks = [(a * scale, bt) for a, bt in chunks]
            per_row = math.ceil(cols / k)
            lines = [[a @ bt.t() for a, bt in chunks[i:i + per_row]] for i in range(0, len(chunks), per_row)]
            blocks = [line[0] if len(line) == 1 else torch.cat(line, 1) for line in lines]
            out[t.name] = t.finish(blocks[0] if len(blocks) == 1 else torch.cat(blocks, 0))
        return out


class TiledDecoder(nn.Module):
    """GHN-3's decoder (eq. 2), the baseline: d -> 4d x s x s, cropped to the target's spatial
    size, 1x1 convolutions 4d -> 8d -> d^2, giving a d x d x h x w block that is tiled (repeated)
    along both channel dimensions; 1-D parameters take the block's first column."""

    def __init__(self, c: LoGAHConfig) -> None:
        super().__init__()
        d, self.config = c.hidden, c
        self.slot_embed = nn.Embedding(c.max_slots, d)
        self.fc = nn.Linear(d, 4 * d * c.spatial ** 2)
        self.conv = nn.Sequential(nn.Conv2d(4 * d, 8 * d, 1), nn.ReLU(), nn.Conv2d(8 * d, d * d, 1))

    def forward(self, nodes: torch.Tensor, plan: Sequence[Target]) -> dict[str, torch.Tensor]:
        """Every target's values from the node embeddings ``nodes`` (N, d)."""
        d, s = self.config.hidden, self.config.spatial
        node, slot = torch.tensor([(t.node, t.slot) for t in plan], device=nodes.device).t()
        hidden = self.fc(nodes[node] + self.slot_embed(slot)).view(len(plan), 4 * d, s, s)
        out = {}
        for q, t in enumerate(plan):
            h, w = (min(t.shape[2], s), min(t.shape[3], s)) if len(t.shape) == 4 else (1, 1)
            block = self.conv(hidden[q:q + 1, :, :h, :w]).view(d, d, h, w)
            if len(t.shape) == 4:
                cout, cin, kh, kw = t.shape
                value = block.repeat(-(-cout // d), -(-cin // d), -(-kh // h), -(-kw // w))[:cout, :cin, :kh, :kw]
            else:
                rows, cols = t.matrix_shape
                value = t.finish(block[:, :, 0, 0].repeat(-(-rows // d), -(-cols // d))[:rows, :cols])
            out[t.name] = value / math.sqrt(t.fan_in) if t.kind == "weight" else value
        return out


# -- the hypernetwork --------------------------------------------------------------------------
class LoGAH(nn.Module):
    """Graph hypernetwork: graphs -> node embeddings -> every parameter of each model."""

    def __init__(self, config: LoGAHConfig = LoGAHConfig()) -> None:
        super().__init__()
        self.config = config
        self.encoder = GraphEncoder(config)
        self.decoder = LowRankDecoder(config) if config.decoder == "low_rank" else TiledDecoder(config)

    @classmethod
    def from_variant(cls, name: str, decoder: str = "low_rank") -> LoGAH:
        """LoGAH-tiny, -small, -base or -large (Table 1); ``decoder="ghn3"`` for the baseline."""
        if name not in VARIANTS:
            raise VariantError(f"unknown LoGAH variant {name!r}; known: {', '.join(VARIANTS)}")
        return cls(LoGAHConfig(**{**asdict(VARIANTS[name]), "decoder": decoder}))

    def config_dict(self) -> dict:
        """The config as plain data (saved beside checkpoints)."""
        return asdict(self.config)

    def forward(self, graphs: Sequence[Data], plans: Sequence[Sequence[Target]]) -> list[dict[str, torch.Tensor]]:
        """The parameters of several models at once: one encoder pass over the padded batch of
        graphs, then each model's targets (see :func:`targets`)."""
        return [self.decoder(nodes, plan) for nodes, plan in zip(self.encoder(graphs), plans)]

    def predict(self, graph: ArchGraph) -> dict[str, torch.Tensor]:
        """Every parameter of the graph's model, by state-dict name, at full shape."""
        return self([graph.to_pyg()], [targets(graph, self.config.max_slots)])[0]

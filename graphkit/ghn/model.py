"""LoGAH: a Graphormer over an architecture's graph and a low-rank decoder that predicts every
parameter at full shape (arXiv 2405.16287). One file, top to bottom: config, encoder, decoder.

Encoder (as GHN-3): each node starts as its op embedding plus an encoding of its parameter shape
(log-scale buckets per dimension, so 3 and 50,257 both have a place) plus in- and out-degree
embeddings; pre-LayerNorm transformer layers attend over all nodes of a graph with a learned
bias per head for the shortest-path distance in the forward and in the backward direction.

Decoder (section 3.1, eq. 5): an MLP d -> 4d -> 8d -> 2 r^2 gives two r x r matrices per query;
one linear map r -> K (K = 2048 * 16) turns them into A and B^T (K x r), and a parameter of
shape (Cout, Cin, h, w) is A[:Cout h] B[:, :Cin w], reshaped. Only the rows a parameter needs
are computed (``weight[:rows] @ M``), never the full K.

Choices beyond the paper:
- **Wider than K.** A dimension larger than K (a 50,257-row embedding) is cut into chunks of K;
  each chunk is decoded from the node embedding plus a learned chunk embedding, so chunks differ
  instead of repeating (GHN-3 tiles a 2,048-row block).
- **Several parameters per node** (weight and bias) are told apart by a slot embedding added to
  the node embedding; a 1-D parameter of size C is the column A[:C] B[:, :1].
- **Output scaling** as GHN-3: weights scaled by 1/sqrt(fan-in), norm weights 2 sigmoid(p / 2),
  biases tanh(p / 5).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.graph import ArchGraph
from graphkit.ops import OPS

SHAPE_BUCKETS = 128  # log2 buckets, 4 per octave: sizes up to 2^32


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


#: the variants of the paper's Table 1 (d, layers, heads, r)
VARIANTS: dict[str, LoGAHConfig] = {
    "tiny": LoGAHConfig(hidden=64, layers=3, heads=8, rank=32),
    "small": LoGAHConfig(hidden=128, layers=5, heads=16, rank=90),
    "base": LoGAHConfig(hidden=256, layers=5, heads=16, rank=128),
    "large": LoGAHConfig(hidden=256, layers=12, heads=16, rank=256),
}


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


class LoGAH(nn.Module):
    """Graph hypernetwork: graph -> node embeddings -> every parameter of the model."""

    def __init__(self, config: LoGAHConfig = LoGAHConfig()) -> None:
        super().__init__()
        self.config = c = config
        d = c.hidden
        self.op_embed = nn.Embedding(len(OPS), d)
        self.shape_embed = nn.Embedding(4 * SHAPE_BUCKETS, d)
        self.in_degree_embed = nn.Embedding(c.max_degree + 1, d)
        self.out_degree_embed = nn.Embedding(c.max_degree + 1, d)
        # distance buckets: 0..max_distance, then "farther", then "unreachable"
        self.forward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.backward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.layers = nn.ModuleList(GraphormerLayer(d, c.heads) for _ in range(c.layers))
        self.norm = nn.LayerNorm(d)
        self.slot_embed = nn.Embedding(c.max_slots, d)
        self.row_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.col_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.decoder = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, 8 * d), nn.GELU(),
                                     nn.Linear(8 * d, 2 * c.rank * c.rank))
        self.low_rank = nn.Linear(c.rank, c.max_mask)  # r -> K, shared by A and B^T

    @classmethod
    def from_variant(cls, name: str) -> LoGAH:
        """LoGAH-tiny, -small, -base or -large (Table 1)."""
        if name not in VARIANTS:
            raise ValueError(f"unknown LoGAH variant {name!r}; known: {', '.join(VARIANTS)}")
        return cls(VARIANTS[name])

    def config_dict(self) -> dict:
        """The config as plain data (saved beside checkpoints)."""
        return asdict(self.config)

    # -- encoder -------------------------------------------------------------------------------
    def encode(self, graph: ArchGraph) -> torch.Tensor:
        """Node embeddings (N, d) of one graph."""
        c, device = self.config, self.low_rank.weight.device
        data = graph.to_pyg()
        n = data.num_nodes
        shape = data.param_shape.to(device).float()
        buckets = torch.where(shape > 0, (torch.log2(shape + 1) * 4).long().clamp(max=SHAPE_BUCKETS - 1) + 1, 0)
        x = (self.op_embed(data.x.to(device))
             + self.shape_embed(buckets + torch.arange(4, device=device) * SHAPE_BUCKETS).sum(1)
             + self.in_degree_embed(data.in_degree.to(device).clamp(max=c.max_degree))
             + self.out_degree_embed(data.out_degree.to(device).clamp(max=c.max_degree)))
        dist = torch.full((n, n), c.max_distance + 1, dtype=torch.long, device=device)  # unreachable
        dist[data.spd_index[0], data.spd_index[1]] = data.spd_value.to(device).clamp(max=c.max_distance)
        dist.fill_diagonal_(0)
        bias = (self.forward_distance(dist) + self.backward_distance(dist.t())).permute(2, 0, 1).unsqueeze(0)
        x = x.unsqueeze(0)
        for layer in self.layers:
            x = layer(x, bias)
        return self.norm(x)[0]

    # -- decoder -------------------------------------------------------------------------------
    def _factors(self, query: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.config.rank
        m = self.decoder(query).view(2, r, r)
        w, b = self.low_rank.weight, self.low_rank.bias
        a = w[:rows] @ m[0] + b[:rows, None]      # A[:rows], (rows, r)
        bt = w[:cols] @ m[1] + b[:cols, None]     # B^T[:cols], (cols, r)
        return a, bt

    def _matrix(self, node: torch.Tensor, slot: int, rows: int, cols: int) -> torch.Tensor:
        """A (rows x cols) matrix, in chunks of at most K rows and columns."""
        k = self.config.max_mask
        row_blocks = []
        for i in range(math.ceil(rows / k)):
            h = min(k, rows - i * k)
            col_blocks = []
            for j in range(math.ceil(cols / k)):
                w = min(k, cols - j * k)
                query = node + self.slot_embed.weight[slot] + self.row_chunk_embed.weight[i] + self.col_chunk_embed.weight[j]
                a, bt = self._factors(query, h, w)
                col_blocks.append(a @ bt.t())
            row_blocks.append(torch.cat(col_blocks, dim=1))
        return torch.cat(row_blocks, dim=0)

    def predict(self, graph: ArchGraph) -> dict[str, torch.Tensor]:
        """Every parameter of the graph's model, by state-dict name, at full shape."""
        embeddings = self.encode(graph)
        out: dict[str, torch.Tensor] = {}
        for i, node in enumerate(graph.nodes):
            for slot, (name, shape) in enumerate(node.params.items()):
                out[name] = self._decode(embeddings[i], min(slot, self.config.max_slots - 1), name, shape, node)
        return out

    def _decode(self, node_embedding: torch.Tensor, slot: int, name: str, shape: tuple[int, ...], node) -> torch.Tensor:
        if len(shape) == 1:
            p = self._matrix(node_embedding, slot, shape[0], 1)[:, 0]
            if node.op in ("layer_norm", "rms_norm") and name.endswith("weight"):
                return 2 * torch.sigmoid(p / 2)
            return torch.tanh(p / 5)
        if len(shape) == 4:  # (Cout, Cin, h, w) as (Cout h) x (Cin w)
            cout, cin, h, w = shape
            matrix = self._matrix(node_embedding, slot, cout * h, cin * w).view(cout, h, cin, w).permute(0, 2, 1, 3)
            fan_in = cin * h * w
        else:  # (out, in); 3-D tokens and positions (1, N, D) as (N, D)
            rows, cols = math.prod(shape[:-1]), shape[-1]
            matrix = self._matrix(node_embedding, slot, rows, cols).reshape(shape)
            fan_in = shape[0] if node.attrs.get("transposed") else cols
        return matrix / math.sqrt(fan_in)

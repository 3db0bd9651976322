"""LoGAH: a Graphormer over an architecture's graph and a low-rank decoder that predicts every
parameter at full shape (arXiv 2405.16287). One file, top to bottom: encoder, decoders, the
hypernetwork; its config (:class:`~graphkit.ghn.config.LoGAHConfig`) sits beside it in ``config.py``.

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
- **Levels of 1-D parameters** (``LoGAHConfig.level_head``; ``train-ghn --level-head``). A 1-D
  parameter's values are a raw product of factors that the weights' much larger gradients shape;
  a level head adds one learned scalar per 1-D parameter after its output function, in the
  parameter's units (before its init anchor and factor): a head on its query plus a level per
  role map, which Adam moves at their own pace (a LayerScale gain that starts near 0 can open
  its block).
- **Role factors** (``LoGAHConfig.role_factors``; ``train-ghn --role-factors``). Each role map has
  a pair of r x r factors of its own, zero at init, added to what the MLP gives each of its
  weights: a path on which the role's weights train as weights trained directly do, with the MLP
  left to tell architectures, blocks and widths apart (:meth:`LowRankDecoder.factors`).
- **Role vectors** (``LoGAHConfig.role_vectors``; ``train-ghn --role-vectors``). Each role map has
  a vector of its own, zero at init, added to the activated values of each of its 1-D parameters
  (their first ``role_rows`` entries), beside a level head's level: the role's norm gains and
  biases then have a free path that every architecture reads, as one tensor per role trained
  directly has (:func:`role_vector_rows`).
- **Role maps** (``LoGAHConfig.roles``, off by default; ``train-ghn --role-maps``). One shared r -> K
  map makes every matrix live in the same row and column subspaces: a GPT-2's query projection,
  MLP and embedding all get the same ``W[:rows]``. With role maps each parameter role (its name
  without the block index, :func:`~graphkit.ghn.encoding.role_of`) has its own first ``role_rows``
  rows of the map, drawn independently (rows beyond them, a vocabulary's, stay shared); a role
  the checkpoint never saw (a hand-written model's names) uses the shared map. On one GPT-2 this
  left the unigram plateau where the shared map did not; a residual on the shared map, zero or
  random at init, did not (``experiments/ghn_controls.py``, docs/experiments.md). Across
  families, ``role_key="leaf"`` (``train-ghn --role-key leaf``) keys a role by the last module
  name and parameter (``q_proj.weight``), which families that name their layers alike share, so
  that a pool of many families has few roles and an unseen family finds most of its own;
  ``--max-roles`` keeps maps for the most frequent roles only (docs/hypernetwork.md).

``LoGAHConfig(decoder="ghn3")`` swaps in GHN-3's decoder (eq. 2: a d x d x 16 x 16 block,
cropped and tiled to the target shape) as the baseline the paper compares against.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from graphkit.errors import TrainError
from graphkit.ghn.config import LOGAH_VARIANTS, LoGAHConfig, VariantError
from graphkit.ghn.encoding import (
    SHAPE_BUCKETS,
    EncodedGraph,
    Target,
    activate,
    encode,
    role_signature,
    roles_of,
    with_roles,
)
from graphkit.graph import ArchGraph
from graphkit.params import first_non_finite

INIT_GAIN = 0.3  # predicted weights start at RMS INIT_GAIN / sqrt(fan-in): timm's 0.02 at width 256


def weight_rms(gain: torch.Tensor | float, sqrt_fan_in: torch.Tensor | float) -> torch.Tensor | float:
    """The RMS the decoder gives a predicted weight: ``INIT_GAIN gain / sqrt(fan-in)``, where
    ``gain = 2 sigmoid(s / 2)`` is in (0, 2) and 1 at init, so a weight starts at the scale timm
    and Hugging Face initialise transformers with and can never leave (0, 2 INIT_GAIN / sqrt(fan-in))."""
    return INIT_GAIN * gain / sqrt_fan_in


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
        self.op_embed = nn.Embedding(c.num_ops, d)
        self.shape_embed = nn.Embedding(4 * SHAPE_BUCKETS, d)
        self.in_degree_embed = nn.Embedding(c.max_degree + 1, d)
        self.out_degree_embed = nn.Embedding(c.max_degree + 1, d)
        self.depth_embed = nn.Embedding(c.depth_buckets, d) if c.depth_buckets else None
        self.tie_embed = nn.Embedding(2, d) if c.tie_feature else None
        # distance buckets: 0..max_distance, then "farther", then "unreachable"
        self.forward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.backward_distance = nn.Embedding(c.max_distance + 2, c.heads)
        self.layers = nn.ModuleList(GraphormerLayer(d, c.heads) for _ in range(c.layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, graphs: Sequence[EncodedGraph]) -> torch.Tensor:
        """Node embeddings of every graph, concatenated in graph order: (sum of N_i, d). The
        graphs are padded to a batch on the CPU and moved with one copy per tensor."""
        c, device = self.config, self.op_embed.weight.device
        sizes = [g.num_nodes for g in graphs]
        b, n = len(graphs), max(sizes)
        dist = torch.full((b, n, n), c.max_distance + 1, dtype=torch.long)  # padding: unreachable
        for i, g in enumerate(graphs):
            dist[i, : sizes[i], : sizes[i]] = g.distance
        slots = torch.cat(
            [i * n + torch.arange(size) for i, size in enumerate(sizes)]
        )  # real nodes in the padded batch
        pad = torch.ones(b * n, dtype=torch.bool)
        pad[slots] = False
        ops, shapes, in_degree, out_degree, dist, slots, pad = (
            t.to(device, non_blocking=True)
            for t in (
                torch.cat([g.ops for g in graphs]),
                torch.cat([g.shapes for g in graphs]),
                torch.cat([g.in_degree for g in graphs]),
                torch.cat([g.out_degree for g in graphs]),
                dist,
                slots,
                pad,
            )
        )
        features = (
            self.op_embed(ops)
            + self.shape_embed(shapes).sum(1)
            + self.in_degree_embed(in_degree)
            + self.out_degree_embed(out_degree)
        )
        if self.depth_embed is not None:
            features = features + self.depth_embed(torch.cat([g.depth for g in graphs]).to(device, non_blocking=True))
        if self.tie_embed is not None:
            features = features + self.tie_embed(torch.cat([g.tied for g in graphs]).to(device, non_blocking=True))
        x = features.new_zeros(b * n, c.hidden).index_copy(0, slots, features).view(b, n, c.hidden)
        bias = (self.forward_distance(dist) + self.backward_distance(dist.transpose(1, 2))).permute(0, 3, 1, 2)
        bias = bias.masked_fill(pad.view(b, 1, 1, n), float("-inf"))
        for layer in self.layers:
            x = layer(x, bias)
        return self.norm(x).view(b * n, c.hidden).index_select(0, slots)


# -- decoders ----------------------------------------------------------------------------------
class Decoded(NamedTuple):
    """What a decoder gives for a batch of graphs."""

    params: list[dict[str, torch.Tensor]]  # per graph, every parameter by state-dict name
    norms: torch.Tensor  # (graphs,) the sum of each model's parameter L2 norms: GHN-3's regulariser
    # the mean inverse participation ratio of the weight queries' r x r products (1 for rank 1,
    # 1/r when flat): how far predicted blocks are from one shared direction (train-ghn --spread)
    spread: torch.Tensor
    # the queries' mean share of their factors' squared norm that the decoder's MLP gives, beside
    # their role's own factors (1 without them): what train-ghn --correction weighs
    correction: torch.Tensor


def inverse_participation(m: torch.Tensor) -> torch.Tensor:
    """Per matrix of ``m`` (n, r, r), ``sum s^4 / (sum s^2)^2`` of its singular values, from its
    Gram matrix without an SVD: 1 for a rank-1 matrix, 1/r for one whose singular values are equal."""
    gram = m.float().mT @ m.float()
    return gram.square().sum((1, 2)) / gram.diagonal(dim1=1, dim2=2).sum(1).square().clamp_min(1e-30)


class LowRankDecoder(nn.Module):
    """LoGAH's decoder: per query two r x r matrices, mapped to A and B^T by one r -> K linear."""

    def __init__(self, c: LoGAHConfig) -> None:
        super().__init__()
        d, self.config = c.hidden, c
        self.slot_embed = nn.Embedding(c.max_slots, d)
        self.row_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.col_chunk_embed = nn.Embedding(c.max_chunks, d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, 8 * d), nn.GELU(), nn.Linear(8 * d, 2 * c.rank * c.rank)
        )
        # r -> K, shared by A and B^T, without bias as in eq. 5 (r x K parameters): a bias adds the
        # same column to every A and B^T, and their product is then one rank-1 term r b b^T that
        # swamps the rest (every predicted matrix at init had 97% of its energy in one direction)
        self.low_rank = nn.Linear(c.rank, c.max_mask, bias=False)
        # per role its own first rows of the map (see the module docstring), drawn as the map is
        self.role_maps = None
        if c.roles:
            bound = 1 / math.sqrt(c.rank)  # nn.Linear's init of the shared map
            self.role_maps = nn.Parameter(
                torch.empty(len(c.roles), min(c.role_rows, c.max_mask), c.rank).uniform_(-bound, bound)
            )
        # one scalar per parameter for its scale (see forward); zero: every weight starts at INIT_GAIN
        self.gain = nn.Linear(d, 1)
        nn.init.zeros_(self.gain.weight)
        nn.init.zeros_(self.gain.bias)
        # one scalar per 1-D parameter added after its output function (see products): a head on its
        # query plus one level per role map (0: the shared map's); zero: decodes as without
        self.level = self.role_levels = None
        if c.level_head:
            self.level = nn.Linear(d, 1)
            nn.init.zeros_(self.level.weight)
            nn.init.zeros_(self.level.bias)
            self.role_levels = nn.Parameter(torch.zeros(len(c.roles) + 1))
        # per role map (0: the shared map's) a pair of factors added to the MLP's (see factors); zero:
        # decodes as without
        self.role_factors = None
        if c.role_factors:
            self.role_factors = nn.Parameter(torch.zeros(len(c.roles) + 1, 2 * c.rank * c.rank))
        # per role map (0: the shared map's) a vector added to its 1-D parameters' values (see forward);
        # zero: decodes as without
        self.role_vectors = None
        if c.role_vectors:
            self.role_vectors = nn.Parameter(torch.zeros(len(c.roles) + 1, min(c.role_rows, c.max_mask)))

    def forward(self, nodes: torch.Tensor, graphs: Sequence[EncodedGraph]) -> Decoded:
        """Every parameter of each graph from the node embeddings ``nodes`` (sum of N_i, d), per
        graph the sum of its parameters' L2 norms (GHN-3's regulariser), and the weight queries'
        mean :func:`inverse_participation`.

        The work is batched so that its kernel count does not grow with the number of parameters:
        weights are decoded one ``(role, rows, cols)`` group at a time across graphs, ``W[:rows] M
        W[:cols]^T`` as two batched matmuls; every 1-D parameter at once (one run per role map),
        since ``W[:C] M W[:1]^T = W[:C] (M w_0)`` is a row of one (n, max C) product. The norms take
        no pass over the decoded weights: a weight's norm is fixed by its predicted scale (see :meth:`products`)."""
        batch = _DecodeBatch(graphs)
        index = batch.on(nodes.device)
        products, head, norms, levels, share = self.products(nodes, batch)
        blocks: list[torch.Tensor] = [None] * len(batch.queries)  # type: ignore[list-item]
        if batch.weight_groups:
            grouped = products[index["weight_order"]].split([len(m) for m in batch.weight_groups.values()])
            for ((role, rows, cols), members), m in zip(batch.weight_groups.items(), grouped):
                for q, block in zip(members, (head(role, rows) @ m @ head(role, cols).t()).unbind(0)):
                    blocks[q] = block
        if batch.vector_queries:
            width = max(batch.vector_lengths)
            runs = products[index["vector_queries"]].split([n for _, n in batch.vector_roles])
            parts = [(m @ head(role, 1)[0]) @ head(role, width).t() for (role, _), m in zip(batch.vector_roles, runs)]
            values = parts[0] if len(parts) == 1 else torch.cat(parts)
            values = torch.where(index["is_norm"].unsqueeze(1), activate("norm", values), activate("bias", values))
            if levels is not None:
                values = values + levels.index_select(0, index["vector_queries"]).unsqueeze(1).to(values.dtype)
            if self.role_vectors is not None:
                own = self.role_vectors.index_select(0, index["role"].index_select(0, index["vector_queries"]))
                # a chunk past the first starts at a multiple of K >= the vectors' length: nothing of them
                own = role_vector_rows(own, 0, width) * index["vector_first"].unsqueeze(1)
                values = values + own.to(values.dtype)
            flat = values.flatten()[index["vector_entries"]]  # each query's first C values, end to end
            square = torch.zeros_like(norms).index_add(0, index["entry_owner"], flat.float().square())
            norms = torch.where(index["is_vector"], square.clamp_min(1e-30).sqrt(), norms)
            for q, block in zip(batch.vector_queries, flat.split(batch.vector_lengths)):
                blocks[q] = block
        out: list[dict[str, torch.Tensor]] = [{} for _ in graphs]
        for (graph, t), q, (nr, nc) in zip(batch.targets, batch.first_query, batch.grid):
            # one copy at most: a row of one block is not concatenated on its own first
            pieces = [
                blocks[q + i * nc] if nc == 1 else torch.cat(blocks[q + i * nc : q + (i + 1) * nc], -1)
                for i in range(nr)
            ]
            matrix = pieces[0] if nr == 1 else torch.cat(pieces, 0)
            out[graph][t.name] = t.anchor(matrix) if matrix.dim() == 1 else t.reshape(matrix)
        norms = torch.zeros(len(graphs), device=nodes.device).index_add(0, index["graph_of_target"], norms)
        weights = products[index["is_weight_query"]]
        spread = inverse_participation(weights).mean() if len(weights) else nodes.new_zeros(())
        return Decoded(out, norms, spread, share.mean())

    def products(
        self, nodes: torch.Tensor, batch: _DecodeBatch
    ) -> tuple[torch.Tensor, Callable[[int, int], torch.Tensor], torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per query of ``batch`` (in query order) the r x r matrix ``M = F_A F_B^T``, a weight's
        scale folded in; ``head(role, size)``, the first ``size`` rows of role map ``role`` (0: the
        shared map; a block is ``head(role, rows) @ M @ head(role, cols).t()``); per target the
        L2 norm of a weight (float32; a 1-D target's entry is left for :meth:`forward` to fill);
        with a level head, per query the level added to a 1-D parameter's values after their output
        function, in the parameter's own units (None without one); and per query the MLP's share
        of its factors (:meth:`factors`).

        Why the level: a 1-D value is ``W[:C] M w_0``, a raw product of factors that the weights'
        gradients shape, while a weight is normalised to its predicted scale, which amplifies its
        gradient; the 1-D gradients were about 40 times smaller at the role maps, and after
        4,000 steps every 1-D output sat where a fresh LoGAH put it (layer-scale gains at 0.006, so
        the blocks behind them were silent; docs/experiments.md). The level is a path of their own:
        a head on the query, and one level per role map, which only that role's 1-D parameters move
        (the head alone, shared by every bias and norm, did not follow the gains' own direction).

        All queries of all graphs go through the MLP at once. A weight's RMS needs no pass over
        its values: ``|A B^T|^2 = sum(A^T A * B^T B)`` with ``A^T A = F_A^T (W[:rows]^T W[:rows]) F_A``,
        one r x r Gram matrix per distinct (role, size), gathered per query. It is scaled to RMS
        ``INIT_GAIN g / sqrt(fan-in)`` (times its :attr:`~graphkit.ghn.encoding.Target.factor`: a
        token table's ``table_gain``), so its norm is that times ``sqrt(size)``: exact (up to the
        1e-12 guard), with the same gradient."""
        r, device = self.config.rank, nodes.device
        index = batch.on(device)
        query = self.queries(nodes, batch.queries)
        factors, share = self.factors(query, index["role"])
        fa, fb = factors.view(-1, 2, r, r).unbind(1)
        gains = 2 * torch.sigmoid(self.gain(query)[:, 0] / 2)  # in (0, 2), 1 at init
        # every use below slices this once-made tensor, never the K-row map again: each slice of a
        # large tensor costs a full-size zero gradient in the backward
        w, maps = self.low_rank.weight[: batch.max_size], cast(torch.Tensor | None, self.role_maps)
        if torch.is_autocast_enabled(device.type):  # one cast of each map, not one per slice and product
            dtype = torch.get_autocast_dtype(device.type)
            w, maps = w.to(dtype), (None if maps is None else maps.to(dtype))
        tables = () if maps is None else maps.unbind(0)  # one backward op, not one per role
        rows_of: dict[tuple[int, int], torch.Tensor] = {}

        def head(role: int, size: int) -> torch.Tensor:  # role map ``role``'s first rows, made once per (role, size)
            if (role, size) not in rows_of:
                rows = w[:size]
                if role:
                    own = tables[role - 1][: len(rows)]
                    rows = own if len(own) == len(rows) else torch.cat([own, rows[len(own) :]])
                rows_of[role, size] = rows
            return rows_of[role, size]

        # gathers that repeat an index use index_select: its backward is a deterministic index_add,
        # where advanced indexing's accumulates in a thread-dependent order on the CPU
        grams = torch.stack([head(role, size).t() @ head(role, size) for role, size in batch.sizes])
        row_grams, col_grams = (grams.index_select(0, index[key]) for key in ("row_size", "col_size"))
        square = ((fa.mT @ row_grams @ fa) * (fb.mT @ col_grams @ fb)).sum((1, 2))
        square = torch.zeros(len(batch.targets), device=device, dtype=square.dtype).index_add(0, index["owner"], square)
        rms = weight_rms(gains[index["first"]], index["sqrt_fan_in"]) * index["weight_factor"]
        scale = rms / torch.sqrt(square / index["size"] + 1e-12)
        scale = torch.where(index["is_weight_query"], scale.index_select(0, index["owner"]), 1.0)
        levels = None
        if self.level is not None and self.role_levels is not None:
            levels = self.level(query)[:, 0] + self.role_levels.index_select(0, index["role"])
        return (fa * scale.view(-1, 1, 1)) @ fb.mT, head, (rms * index["size"].sqrt()).float(), levels, share

    def scratch_bytes(self, plan: Sequence[Target], destinations: dict[str, torch.Tensor]) -> int:
        """Memory :meth:`LowRankDecoding.write_into` needs beyond the destinations: the largest
        parameter it cannot write in place (see :func:`writes_in_place`)."""
        w = self.low_rank.weight
        return max(
            (
                w.element_size() * math.prod(t.matrix_shape)
                for t in plan
                if not writes_in_place(destinations[t.name], t, w.dtype, w.device)
            ),
            default=0,
        )

    @torch.no_grad()
    def decoding(self, nodes: torch.Tensor, graph: EncodedGraph) -> LowRankDecoding:
        """One graph's parameters, ready to be written block by block (see :class:`LowRankDecoding`)."""
        products, head, _, levels, _ = self.products(nodes, _DecodeBatch([graph]))
        return LowRankDecoding(graph, products, head, self.config.max_mask, levels, self.role_vectors)

    def factors(self, query: torch.Tensor, role: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query (its MLP input ``query`` and role map ``role``) the two r x r factors, flat:
        the MLP's output, plus the role's own factors where the decoder has them; and per query
        the MLP's share of their squared norms, ``|mlp|^2 / (|mlp|^2 + |role's|^2)`` (float32; 1
        without role factors), which ``train-ghn --correction`` weighs.

        Why role factors: on one architecture, free factors per query trained as directly trained
        weights fit to a training CE of 0.11 where the MLP's fit to 0.47; across architectures one
        weight per role trained directly fits 8 to 0.39 where the MLP fits them to 1.56
        (docs/experiments.md, "What the hypernetwork fails to share"). The MLP maps similar queries
        to similar factors and moves them together at its fan-in-scaled rate; a role's factors
        move at the base rate, by the sum of its weights' gradients, and the MLP keeps what tells
        one architecture, block or width from another.

        Why the share: trained that way, the role factors alone predicted nothing (3.0-4.0 at step
        0, the MLP's last layer zeroed; docs/experiments.md): the MLP carried each architecture's
        whole fit, and what the roles share stayed in it, where an unseen architecture's queries
        do not reach. A penalty on the share leaves the MLP only what tells architectures apart.
        It is a ratio, so that it cannot be met by shrinking the MLP's output alone (a weight's
        scale is set apart from its factors')."""
        out = self.mlp(query)
        if self.role_factors is None:
            return out, out.new_ones(len(out), dtype=torch.float32)
        own = self.role_factors.index_select(0, role).to(out.dtype)
        mine = out.float().square().sum(1)
        return out + own, mine / (mine + own.float().square().sum(1)).clamp_min(1e-30)

    def queries(self, nodes: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """The MLP's input per query (node, slot, row chunk, column chunk): the node's embedding
        plus the slot's and the chunks'."""
        node, slot, row, col = queries.to(nodes.device, non_blocking=True).t()
        return nodes[node] + self.slot_embed(slot) + self.row_chunk_embed(row) + self.col_chunk_embed(col)

    @torch.no_grad()
    def factor_similarity(self, nodes: torch.Tensor, graphs: Sequence[EncodedGraph]) -> float:
        """Mean pairwise cosine between the factor vectors of different queries: near 1, every
        parameter gets nearly the same factors (the collapse this decoder once fell into)."""
        batch = _DecodeBatch(graphs)
        factors, _ = self.factors(self.queries(nodes, batch.queries), batch.on(nodes.device)["role"])
        factors = F.normalize(factors, dim=1)
        n = len(factors)
        return ((factors.sum(0).square().sum() - n) / max(n * (n - 1), 1)).item()


def role_vector_rows(vectors: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """Entries ``[start, start + length)`` of the last dimension of ``vectors`` (role vectors, one
    per row), zero past its end: what a 1-D parameter's rows ``start`` on get from their role's
    vector, which covers a role's first ``role_rows`` rows only (a longer bias, a vocabulary's,
    keeps its decoded values beyond them)."""
    part = vectors[..., start : start + length]
    return F.pad(part, (0, length - part.shape[-1]))


class _DecodeBatch:
    """The queries of several encoded graphs as one batch, and the index tensors that let the
    decoder treat them together: node indices offset into the concatenated node embeddings; the
    weight queries grouped by (role map, rows, cols) across graphs; the 1-D queries, in runs of one
    role map, with their lengths and where their values lie in one padded product; per query its
    target and the Gram matrices of its (role, size)s; per target its graph, first query, chunk
    grid, fan-in and size. Built on the CPU from the graphs' cached encodings (Python over groups
    and targets, no tensor work per parameter); :meth:`on` moves the index tensors once per device."""

    def __init__(self, graphs: Sequence[EncodedGraph]) -> None:
        queries: list[torch.Tensor] = []
        self.targets: list[tuple[int, Target]] = []
        self.first_query: list[int] = []
        self.grid: list[tuple[int, int]] = []
        self.weight_groups: dict[tuple[int, int, int], list[int]] = {}
        vectors: list[tuple[int, int, int, bool]] = []  # role, query, length, is a norm scale
        owner: list[int] = []
        shape_of: dict[int, tuple[int, int, int]] = {}
        nodes = 0
        for index, g in enumerate(graphs):
            offset = len(owner)
            queries.append(g.queries + torch.tensor([nodes, 0, 0, 0]))
            for t, first, (nr, nc) in zip(g.targets, g.first_query, g.grid):
                owner.extend([len(self.targets)] * (nr * nc))
                self.targets.append((index, t))
                self.first_query.append(offset + first)
                self.grid.append((nr, nc))
            for (kind, role, rows, cols), members in g.groups.items():
                shape_of.update((offset + m, (role, rows, cols)) for m in members)
                if kind == "weight":
                    self.weight_groups.setdefault((role, rows, cols), []).extend(offset + m for m in members)
                else:
                    vectors.extend((role, offset + m, rows, kind == "norm") for m in members)
            nodes += g.num_nodes
        vectors.sort(key=lambda v: v[0])  # stable: runs of one role map, each in query order
        self.vector_queries = [q for _, q, _, _ in vectors]
        self.vector_lengths = [length for _, _, length, _ in vectors]
        is_norm = [norm for _, _, _, norm in vectors]
        self.vector_roles = [
            (role, len(list(run))) for role, run in itertools.groupby(v[0] for v in vectors)
        ]  # (role, queries)
        self.queries = torch.cat(queries)
        shapes = [shape_of[q] for q in range(len(owner))]
        # the (role, size)s with a Gram matrix
        self.sizes = sorted({(role, size) for role, rows, cols in shapes for size in (rows, cols)})
        self.max_size = max(size for _, size in self.sizes)
        position = {key: i for i, key in enumerate(self.sizes)}
        owner_t = torch.tensor(owner, dtype=torch.long)
        vector = torch.tensor(self.vector_queries, dtype=torch.long)
        lengths = torch.tensor(self.vector_lengths, dtype=torch.long)
        ends = lengths.cumsum(0)
        within = torch.arange(int(ends[-1]) if len(ends) else 0) - torch.repeat_interleave(ends - lengths, lengths)
        kinds = [t.kind for _, t in self.targets]
        self._cpu = {
            "owner": owner_t,
            "role": torch.tensor([role for role, _, _ in shapes], dtype=torch.long),
            "row_size": torch.tensor([position[role, rows] for role, rows, _ in shapes], dtype=torch.long),
            "col_size": torch.tensor([position[role, cols] for role, _, cols in shapes], dtype=torch.long),
            "is_weight_query": torch.tensor([kinds[o] == "weight" for o in owner]),
            "weight_order": torch.tensor(
                [q for members in self.weight_groups.values() for q in members], dtype=torch.long
            ),
            "vector_queries": vector,
            "vector_first": self.queries[vector, 2] == 0,  # the query holds its parameter's first rows
            "is_norm": torch.tensor(is_norm, dtype=torch.bool),
            "vector_entries": torch.repeat_interleave(
                torch.arange(len(vector)) * max(self.vector_lengths, default=0), lengths
            )
            + within,
            "entry_owner": torch.repeat_interleave(owner_t[vector], lengths),
            "first": torch.tensor(self.first_query, dtype=torch.long),
            "sqrt_fan_in": torch.tensor([math.sqrt(t.fan_in) for _, t in self.targets]),
            "weight_factor": torch.tensor([t.factor if t.kind == "weight" else 1.0 for _, t in self.targets]),
            "size": torch.tensor([float(math.prod(t.matrix_shape)) for _, t in self.targets]),
            "is_vector": torch.tensor([kind != "weight" for kind in kinds]),
            "graph_of_target": torch.tensor([graph for graph, _ in self.targets], dtype=torch.long),
        }
        self._moved: dict[torch.device, dict[str, torch.Tensor]] = {}

    def on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The index tensors on ``device``, moved once."""
        if device not in self._moved:
            self._moved[device] = {k: v.to(device, non_blocking=True) for k, v in self._cpu.items()}
        return self._moved[device]


#: a bound on |values| past which a decoded block could overflow float32 (3.4e38) on the way
SAFE_BOUND = 2.0**100


class LowRankDecoding:
    """One graph's predicted parameters, decoded block by block into their destinations.

    ``first_non_finite`` proves every value finite *before* anything is written, without
    decoding: a block is ``A M B^T`` with ``A = W[:rows]``, ``B = W[:cols]`` (``W`` the
    parameter's role map), so each value, and each value of ``A M``, is at most
    ``max|A_i| |M|_F max|B_j|`` (Cauchy-Schwarz, in float64). A NaN or Inf anywhere in ``W`` or
    ``M`` makes that bound NaN or Inf; a finite bound below :data:`SAFE_BOUND` means no float32
    product can overflow. A 1-D parameter's level (a level head's) and its role's vector are checked
    themselves; the 1-D output functions (sigmoid, tanh) are finite on finite input. So a model is
    either written whole or not touched.

    ``write_into`` then decodes each parameter's blocks straight into the destination's memory
    when it is a float32 matrix view on the hypernetwork's device (``matmul(out=...)``), or into
    one parameter-sized buffer that is copied over (another dtype or device, 4-D weights):
    never a second copy of the whole model. A meta destination gets a new tensor."""

    def __init__(
        self,
        graph: EncodedGraph,
        products: torch.Tensor,
        head: Callable[[int, int], torch.Tensor],
        chunk: int,
        levels: torch.Tensor | None = None,
        vectors: torch.Tensor | None = None,
    ) -> None:
        self.targets, self.graph, self.products, self.head, self.chunk = graph.targets, graph, products, head, chunk
        self.levels = levels  # per query, the level a 1-D value gets after its output function (see products)
        self.vectors = vectors  # per role map, the vector its 1-D values get after it (role_vector_rows)

    def _blocks(self, index: int) -> list[tuple[int, slice, slice]]:
        """The queries of target ``index`` with the rows and columns of its matrix each one fills."""
        (nr, nc), first = self.graph.grid[index], self.graph.first_query[index]
        rows, cols = self.targets[index].matrix_shape
        k = self.chunk
        return [
            (first + i * nc + j, slice(i * k, min(rows, (i + 1) * k)), slice(j * k, min(cols, (j + 1) * k)))
            for i in range(nr)
            for j in range(nc)
        ]

    def first_non_finite(self) -> str | None:
        """The first parameter some value of which could be NaN or Inf (see the class), or None."""
        # per role map, reach[n - 1]: the largest of its first n row norms
        reaches = {
            role: self.head(role, self.chunk).double().norm(dim=1).cummax(0).values for role in set(self.graph.roles)
        }
        frobenius = self.products.double().flatten(1).norm(dim=1)
        # the role maps whose vector (role vectors') holds a NaN or Inf: each checked once
        unsafe = set() if self.vectors is None else {r for r in reaches if not torch.isfinite(self.vectors[r]).all()}
        for index, target in enumerate(self.targets):
            reach = reaches[self.graph.roles[index]]
            for q, rows, cols in self._blocks(index):
                inner = reach[rows.stop - rows.start - 1] * frobenius[q]
                if not (inner < SAFE_BOUND and inner * reach[cols.stop - cols.start - 1] < SAFE_BOUND):
                    return target.name
                if self.levels is not None and target.kind != "weight" and not torch.isfinite(self.levels[q]):
                    return target.name
            if target.kind != "weight" and self.graph.roles[index] in unsafe:
                return target.name
        return None

    @torch.no_grad()
    def write_into(
        self, destinations: dict[str, torch.Tensor], onto: Collection[str] = frozenset()
    ) -> dict[str, torch.Tensor]:
        """Decode every parameter into ``destinations[name]`` (a tensor of the parameter's shape;
        a meta one gets a new tensor of its dtype on the hypernetwork's device); those named in
        ``onto`` get the prediction added to what they hold (``keep_init``), block by block.
        Returns the tensors written, by name."""
        dtype, device = self.products.dtype, self.products.device
        written = {}
        for index, target in enumerate(self.targets):
            destination = destinations[target.name]
            add = target.name in onto
            if destination.is_meta:
                destination = torch.empty(destination.shape, dtype=destination.dtype, device=device)
            written[target.name] = destination
            direct = writes_in_place(destination, target, dtype, device)
            matrix = (
                destination.view(target.matrix_shape)
                if direct
                else torch.empty(target.matrix_shape, dtype=dtype, device=device)
            )
            role = self.graph.roles[index]
            for q, rows, cols in self._blocks(index):
                a, b = self.head(role, rows.stop - rows.start), self.head(role, cols.stop - cols.start)
                if target.kind == "weight" and add and direct:
                    matrix[rows, cols].addmm_(a @ self.products[q], b.t())
                elif target.kind == "weight":
                    torch.matmul(a @ self.products[q], b.t(), out=matrix[rows, cols])
                else:
                    values = activate(target.kind, a @ self.products[q] @ b.t())
                    values = values if self.levels is None else values + self.levels[q]
                    if self.vectors is not None:
                        own = role_vector_rows(self.vectors[role], rows.start, rows.stop - rows.start)
                        values = values + own.unsqueeze(1).to(values.dtype)
                    values = target.anchor(values)
                    if add and direct:
                        matrix[rows, cols] += values
                    else:
                        matrix[rows, cols] = values
            if not direct:
                value = target.reshape(matrix)
                destination.add_(value) if add else destination.copy_(value)
        return written


def writes_in_place(destination: torch.Tensor, target: Target, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :class:`LowRankDecoding`, decoding in ``dtype`` on ``device``, writes ``target``
    straight into ``destination``'s memory: a contiguous tensor of that dtype and device whose
    (rows, cols) matrix is a view of it (not a 4-D weight). A meta destination stands for a new
    tensor of its dtype on ``device``. Otherwise one parameter-sized buffer is used."""
    return (
        len(target.shape) != 4
        and destination.is_contiguous()
        and destination.dtype == dtype
        and (destination.is_meta or destination.device == device)
    )


class DecodedParams:
    """Parameters decoded all at once (the GHN-3 baseline decoder's way), with the interface of
    :class:`LowRankDecoding`: checked element by element, then copied over."""

    def __init__(self, targets: Sequence[Target], params: dict[str, torch.Tensor]) -> None:
        self.targets, self.params = tuple(targets), params

    def first_non_finite(self) -> str | None:
        """The first parameter holding a NaN or Inf, or None."""
        return first_non_finite(self.params)

    @torch.no_grad()
    def write_into(
        self, destinations: dict[str, torch.Tensor], onto: Collection[str] = frozenset()
    ) -> dict[str, torch.Tensor]:
        """Copy every parameter into ``destinations[name]`` (added to what those named in
        ``onto`` hold), or hand it over (at its dtype) for a meta one. Returns the tensors
        written, by name."""
        return {name: put(destinations[name], value, name in onto) for name, value in self.params.items()}


def put(destination: torch.Tensor, value: torch.Tensor, add: bool = False) -> torch.Tensor:
    """``value`` written into ``destination`` (added to it with ``add``), or, for a meta
    ``destination``, ``value`` itself at its dtype: the last step of every ``write_into``."""
    if destination.is_meta:
        return value.to(destination.dtype)
    return destination.add_(value) if add else destination.copy_(value)


class TiledDecoder(nn.Module):
    """GHN-3's decoder (eq. 2), the baseline: d -> 4d x s x s, cropped to the target's spatial
    size, 1x1 convolutions 4d -> 8d -> d^2, giving a d x d x h x w block that is tiled (repeated)
    along both channel dimensions; 1-D parameters take the block's first column."""

    def __init__(self, c: LoGAHConfig) -> None:
        super().__init__()
        d, self.config = c.hidden, c
        self.slot_embed = nn.Embedding(c.max_slots, d)
        self.fc = nn.Linear(d, 4 * d * c.spatial**2)
        self.conv = nn.Sequential(nn.Conv2d(4 * d, 8 * d, 1), nn.ReLU(), nn.Conv2d(8 * d, d * d, 1))

    def forward(self, nodes: torch.Tensor, graphs: Sequence[EncodedGraph]) -> Decoded:
        """Every parameter of each graph from the node embeddings ``nodes`` (sum of N_i, d), one
        parameter at a time (the baseline's own cost), and per graph the sum of its parameters'
        L2 norms; it has no low-rank products, so its spread is 0, and no role factors, so its
        correction is 1."""
        out, start = [], 0
        for g in graphs:
            out.append(self._decode(nodes[start : start + g.num_nodes], g.targets))
            start += g.num_nodes
        norms = torch.stack([sum(p.float().norm() for p in params.values()) for params in out])
        return Decoded(out, norms, nodes.new_zeros(()), nodes.new_ones(()))

    def _decode(self, nodes: torch.Tensor, plan: Sequence[Target]) -> dict[str, torch.Tensor]:
        d, s = self.config.hidden, self.config.spatial
        node, slot = torch.tensor([(t.node, t.slot) for t in plan], device=nodes.device).t()
        hidden = self.fc(nodes[node] + self.slot_embed(slot)).view(len(plan), 4 * d, s, s)
        out = {}
        for q, t in enumerate(plan):
            h, w = (min(t.shape[2], s), min(t.shape[3], s)) if len(t.shape) == 4 else (1, 1)
            block = self.conv(hidden[q : q + 1, :, :h, :w]).view(d, d, h, w)
            if len(t.shape) == 4:
                cout, cin, kh, kw = t.shape
                value = block.repeat(-(-cout // d), -(-cin // d), -(-kh // h), -(-kw // w))[:cout, :cin, :kh, :kw]
            else:
                rows, cols = t.matrix_shape
                value = t.finish(block[:, :, 0, 0].repeat(-(-rows // d), -(-cols // d))[:rows, :cols])
            # a 2-D or 3-D weight's factor came with finish (Target.anchor); no 4-D one has one
            out[t.name] = value / math.sqrt(t.fan_in) if t.kind == "weight" else value
        return out

    def scratch_bytes(self, plan: Sequence[Target], destinations: dict[str, torch.Tensor]) -> int:
        """Memory :meth:`decoding` needs beyond the destinations: every parameter is decoded at
        once, and those of a model with weights are then copied over (a meta model's are its)."""
        return self.fc.weight.element_size() * sum(math.prod(t.shape) for t in plan if not destinations[t.name].is_meta)

    @torch.no_grad()
    def decoding(self, nodes: torch.Tensor, graph: EncodedGraph) -> DecodedParams:
        """One graph's parameters, all decoded now (the baseline keeps its own cost)."""
        return DecodedParams(graph.targets, self._decode(nodes, graph.targets))


# -- the hypernetwork --------------------------------------------------------------------------
class Prediction(NamedTuple):
    """What one hypernetwork pass over a batch of graphs gives training."""

    params: list[dict[str, torch.Tensor]]  # per graph, every parameter by state-dict name
    norms: torch.Tensor  # (graphs,) the sum of each model's parameter L2 norms: GHN-3's regulariser
    nodes: torch.Tensor  # (sum of N_i, d) the node embeddings, for the factor-similarity log
    spread: torch.Tensor  # the decoder's (see :class:`Decoded`), for train-ghn --spread
    correction: torch.Tensor  # the decoder's (see :class:`Decoded`), for train-ghn --correction


#: the buffers of role prototypes (:meth:`LoGAH.fit_role_prototypes`): fitted when a run ends, never carried over
PROTOTYPES = ("role_prototypes", "role_signatures")


class LoGAH(nn.Module):
    """Graph hypernetwork: graphs -> node embeddings -> every parameter of each model."""

    info: dict[str, Any]  # a loaded checkpoint's config.json (graphkit.ghn.checkpoint.load_checkpoint)
    role_prototypes: torch.Tensor  # with config.role_prototypes: per role map, a mean node embedding
    role_signatures: torch.Tensor  # and its parameters' signature (encoding.role_signature); -1: none

    def __init__(self, config: LoGAHConfig = LoGAHConfig()) -> None:
        super().__init__()
        self.config = config
        self.encoder = GraphEncoder(config)
        self.decoder: LowRankDecoder | TiledDecoder = (
            LowRankDecoder(config) if config.decoder == "low_rank" else TiledDecoder(config)
        )
        if config.role_prototypes:  # row 0, the shared map, is never a prototype
            self.register_buffer("role_prototypes", torch.zeros(len(config.roles) + 1, config.hidden))
            self.register_buffer("role_signatures", torch.full((len(config.roles) + 1,), -1, dtype=torch.long))

    @classmethod
    def from_variant(
        cls,
        name: str,
        decoder: str = "low_rank",
        depth_buckets: int = LoGAHConfig.depth_buckets,
        tie_feature: bool = LoGAHConfig.tie_feature,
        roles: Sequence[str] = (),
        role_rows: int = LoGAHConfig.role_rows,
        role_key: str = LoGAHConfig.role_key,
        init_anchors: bool = LoGAHConfig.init_anchors,
        table_gain: float = LoGAHConfig.table_gain,
        level_head: bool = LoGAHConfig.level_head,
        role_factors: bool = LoGAHConfig.role_factors,
        role_vectors: bool = LoGAHConfig.role_vectors,
        role_prototypes: bool = LoGAHConfig.role_prototypes,
    ) -> LoGAH:
        """LoGAH-tiny, -small, -base or -large (Table 1); ``decoder="ghn3"`` for the baseline;
        ``depth_buckets`` > 0 adds the encoder's relative-depth embedding, ``tie_feature`` its
        embedding of which nodes share a tied token table; ``roles`` (parameter
        roles as ``role_key`` reads names, :func:`~graphkit.ghn.encoding.role_of`) get role maps of
        ``role_rows`` rows each; ``init_anchors`` decodes 1-D parameters around their model's init
        constants and the token and position tables at ``table_gain`` times the weights' RMS
        (:func:`~graphkit.ghn.encoding.targets`); ``level_head`` gives 1-D parameters a learned
        level of their own (:meth:`LowRankDecoder.products`), ``role_factors`` each role map a pair
        of factors of its own (:meth:`LowRankDecoder.factors`), ``role_vectors`` each role map a
        vector for its 1-D parameters (:func:`role_vector_rows`), ``role_prototypes`` each role map
        the embedding by which a role it never saw finds it (:meth:`nearest_roles`)."""
        if name not in LOGAH_VARIANTS:
            raise VariantError(f"unknown LoGAH variant {name!r}; known: {', '.join(LOGAH_VARIANTS)}")
        return cls(
            LoGAHConfig(
                **{
                    **asdict(LOGAH_VARIANTS[name]),
                    "decoder": decoder,
                    "depth_buckets": depth_buckets,
                    "tie_feature": tie_feature,
                    "roles": tuple(roles),
                    "role_rows": role_rows,
                    "role_key": role_key,
                    "init_anchors": init_anchors,
                    "table_gain": table_gain,
                    "level_head": level_head,
                    "role_factors": role_factors,
                    "role_vectors": role_vectors,
                    "role_prototypes": role_prototypes,
                }
            )
        )

    def config_dict(self) -> dict:
        """The config as plain data (saved beside checkpoints)."""
        return asdict(self.config)

    def forward(
        self, graphs: Sequence[EncodedGraph], *, details: bool = False
    ) -> list[dict[str, torch.Tensor]] | Prediction:
        """The parameters of several models at once (each graph from :meth:`encode`): one
        encoder pass over the padded batch of graphs, one decoder pass over all their targets.
        ``details=True`` returns a :class:`Prediction`, which adds what training needs without a
        second pass: each model's parameter norms, the node embeddings the decoder saw, the
        decoder's spread and its MLP's share of the factors."""
        nodes = self.encoder(graphs)
        decoded = self.decoder(nodes, graphs)
        if details:
            return Prediction(decoded.params, decoded.norms, nodes, decoded.spread, decoded.correction)
        return decoded.params

    @torch.no_grad()
    def start_at_role_means(self, graphs: Iterable[EncodedGraph]) -> torch.Tensor:
        """Set each role map's factors (:meth:`LowRankDecoder.factors`) to the mean of what the
        decoder's MLP gives that map's queries over ``graphs``, and the MLP's last layer to zero:
        at the first step every weight of a role decodes to its role's mean, and the MLP's
        correction starts at nothing (its last layer's gradient does not). Returns how many queries
        each mean is over (a map no query reaches keeps zero factors).

        Why: from a fresh LoGAH with role factors the MLP's output is the whole start, about
        0.85 alike across queries and otherwise arbitrary, and each role's factors must outgrow that
        per-architecture noise before the role fits; from the means the whole of zoo-vits-mini's
        train split fits to 1.79 in 1,500 steps (docs/experiments.md, "The hypernetwork keyed by
        context"). TrainError without role factors."""
        decoder = self.decoder
        if not isinstance(decoder, LowRankDecoder) or decoder.role_factors is None:
            raise TrainError("a start at the role means needs the low-rank decoder with role factors")
        sums = torch.zeros_like(decoder.role_factors)
        counts = torch.zeros(len(sums), device=sums.device)
        for graph in graphs:
            batch = _DecodeBatch([graph])
            role = batch.on(sums.device)["role"]
            sums.index_add_(0, role, decoder.mlp(decoder.queries(self.encoder([graph]), batch.queries)).to(sums.dtype))
            counts += torch.bincount(role, minlength=len(sums)).to(counts.dtype)
        decoder.role_factors.copy_(sums / counts.clamp_min(1).unsqueeze(1))
        last = decoder.mlp[-1]
        assert isinstance(last, nn.Linear)
        last.weight.zero_()
        last.bias.zero_()
        return counts

    @torch.no_grad()
    def fit_role_prototypes(self, graphs: Iterable[EncodedGraph]) -> torch.Tensor:
        """Set each role map's prototype to the mean encoder embedding, over ``graphs``, of the
        nodes that hold its parameters, and its signature to the one most of them have
        (:func:`role_signature`: timm's leaf role ``proj.weight`` is a linear's and a patch
        embedding's convolution); a map
        no parameter of ``graphs`` reaches, and the shared map, get none (signature -1), so no
        graphs clears them all. Returns how many parameters each prototype is over. TrainError
        without role prototypes (``LoGAHConfig.role_prototypes``).

        Why: encoded with roles by name, a parameter whose role the checkpoint never saw
        (``classifier.weight`` where every training family said ``head.weight``, a hand-written
        LLaMA's ``wq.weight``) decodes through the shared map alone, which no trained role reaches:
        with the role-means start its factors stay at zero and its map as initialised. What the
        encoder says of the node that holds it tells which trained role it stands in for."""
        if not self.config.role_prototypes:
            raise TrainError("this LoGAH has no role prototypes (LoGAHConfig.role_prototypes)")
        sums = torch.zeros_like(self.role_prototypes)
        counts = torch.zeros(len(sums), device=sums.device)
        signatures: dict[int, collections.Counter[int]] = {}  # a leaf role may be a linear's and a conv's
        for graph in graphs:
            nodes = self.encoder([graph]).to(sums.dtype)
            for target, role in zip(graph.targets, graph.roles):
                if role:
                    sums[role] += nodes[target.node]
                    counts[role] += 1
                    signatures.setdefault(role, collections.Counter())[role_signature(target)] += 1
        self.role_prototypes.copy_(sums / counts.clamp_min(1).unsqueeze(1))
        self.role_signatures.fill_(-1)
        for role, seen in signatures.items():  # the signature most of its parameters have
            self.role_signatures[role] = seen.most_common(1)[0][0]
        return counts

    def with_own_prototypes(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (another LoGAH's weights) with this LoGAH's role prototypes in place of any it
        holds: a start or a resumed checkpoint gives its weights, never its prototypes (the run
        fits its own when it ends; :meth:`fit_role_prototypes`)."""
        return {
            **{k: v for k, v in state.items() if k not in PROTOTYPES},
            **{k: v for k, v in self.state_dict().items() if k in PROTOTYPES},
        }

    @torch.no_grad()
    def nearest_roles(self, encoded: EncodedGraph, nodes: torch.Tensor | None = None) -> tuple[int, ...]:
        """Per target of ``encoded``, its role map; a target of no trained role (role 0, the
        shared map) takes the role whose prototype is nearest, by cosine, to the embedding of the
        node that holds it (``nodes``: the encoder's embeddings of ``encoded``, computed when not
        given), among the roles of its own signature (:meth:`fit_role_prototypes`); it keeps the
        shared map where the checkpoint has no such role, or no prototypes."""
        if not self.config.role_prototypes or 0 not in encoded.roles:
            return encoded.roles
        valid = self.role_signatures >= 0
        if not bool(valid.any()):
            return encoded.roles
        nodes = F.normalize((self.encoder([encoded]) if nodes is None else nodes).float(), dim=1)
        similarity = nodes @ F.normalize(self.role_prototypes.float(), dim=1).t()  # (nodes, roles)
        roles = list(encoded.roles)
        for i, target in enumerate(encoded.targets):
            if roles[i] == 0:
                mine = valid & (self.role_signatures == role_signature(target))
                if bool(mine.any()):
                    roles[i] = int(similarity[target.node].masked_fill(~mine, -2.0).argmax())
        return tuple(roles)

    def stand_ins(self, graph: ArchGraph) -> dict[str, list[str]]:
        """The roles of ``graph`` this hypernetwork never trained on, each with the trained roles
        its parameters decode through (:meth:`nearest_roles`, by node: a role's parameters in
        different blocks may find different ones); empty without role prototypes. What ``graphkit
        predict`` reports, so that a user sees which of a model's names no training family had."""
        if not self.config.role_prototypes:
            return {}
        encoded = encode(graph, self.config)
        names = roles_of((t.name for t in encoded.targets), self.config.role_key)
        found: dict[str, set[str]] = {}
        for t, role, nearest in zip(encoded.targets, encoded.roles, self.nearest_roles(encoded)):
            if role == 0 and nearest:
                found.setdefault(names[t.name], set()).add(self.config.roles[nearest - 1])
        return {role: sorted(trained) for role, trained in sorted(found.items())}

    def encode(self, graph: ArchGraph) -> EncodedGraph:
        """``graph`` as this hypernetwork reads it (cache it: the same graph, the same encoding),
        each parameter of a role it never trained on given the nearest trained role
        (:meth:`nearest_roles`) where it has role prototypes."""
        return self._placed(encode(graph, self.config))

    def _placed(self, encoded: EncodedGraph, nodes: torch.Tensor | None = None) -> EncodedGraph:
        """``encoded`` with its unseen roles given their nearest trained ones (:meth:`nearest_roles`)."""
        roles = self.nearest_roles(encoded, nodes)
        return encoded if roles == encoded.roles else with_roles(encoded, roles, self.config)

    def predict(self, graph: ArchGraph) -> dict[str, torch.Tensor]:
        """Every parameter of the graph's model, by state-dict name, at full shape."""
        return self([self.encode(graph)])[0]

    @torch.no_grad()
    def decoding(self, graph: ArchGraph) -> LowRankDecoding | DecodedParams:
        """The graph's parameters ready to be checked (``first_non_finite``) and then written into
        a model's tensors (``write_into``): with the low-rank decoder, block by block into their
        storage, so predicting into a model needs no second copy of it (:func:`graphkit.ghn.predict`)."""
        encoded = encode(graph, self.config)
        nodes = self.encoder([encoded])  # the encoder reads no roles: one pass places them and decodes
        return self.decoder.decoding(nodes, self._placed(encoded, nodes))

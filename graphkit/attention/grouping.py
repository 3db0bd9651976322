"""Which K/V heads are pooled together when a model's attention is converted to fewer K/V heads.

GQA (Ainslie et al., 2023) mean-pools *neighbouring* heads: head 0 with 1, 2 with 3. Nothing
makes neighbours alike: a head's index is an accident of initialisation. Later work groups heads
by what they compute, measured on a small calibration batch:

- ``mean``: neighbouring heads, the paper's rule; needs no data.
- ``keynorm``: heads ranked by the mean norm of their keys on the calibration batch, and
  neighbours in that ranking pooled. The key norm is the signal KDGQA (arXiv 2408.08454)
  allocates query heads by; here it decides, once, which heads share a K/V head.
- ``similarity``: the heads whose keys and values are most alike on the calibration batch
  pooled together, as AsymGQA (Chen et al., 2024) groups by activation similarity. Pooling
  averages the heads' K/V projections, so the pair that loses least is the pair whose K/V
  activations are closest: groups are grown greedily by the smallest mean squared distance
  between the heads' (centred, per-head scaled) K and V activations.
- ``search``: the groups that minimise the error of the layer's attention output on the
  calibration batch, as QCQA (Joshi et al., 2024) searches for them: the best of the three
  groupings above by that error, then improved by swapping heads between groups while a swap
  lowers it. The error is that of the attention module's output, what it adds to the residual
  stream: each query head's output with its group's pooled K/V instead of its own, minus the
  original, through the output projection's columns for that head. LLaMA's heads are scored before
  RoPE (a query and a key at different positions are rotated differently, which the search
  leaves out), so there the error is a proxy.

Every grouping has groups of equal size, ``heads / kv_heads`` K/V heads each, so the converted
layer is plain GQA after its query heads are reordered to make each group contiguous: one SDPA
call, no gather, no cost at run time. The grouping is recorded in the converted file's metadata.

RoPE does not change the similarity: at one position every head's key is rotated by the same
matrix, which keeps the distance between two heads' keys, so keys read before the rotation
(LLaMA's ``k_proj`` output) give the same grouping as after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

GROUPINGS = ("mean", "keynorm", "similarity", "search")
#: the groupings that read activations on a calibration batch
MEASURED = ("keynorm", "similarity", "search")
#: ``search``'s sweeps of swaps at most (each tries every pair of heads in different groups)
SEARCH_SWEEPS = 4


@dataclass(frozen=True)
class Calibration:
    """One calibration batch as a layer saw it: queries (batch, positions, query heads, d), keys
    and values (batch, positions, K/V heads, d), whether the layer's attention is causal, and its
    output projection's weight (out, query heads * d), through which ``search`` measures the
    error (None: the heads' outputs themselves)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool = False
    out_proj: torch.Tensor | None = None


def contiguous_groups(heads: int, kv_heads: int) -> list[list[int]]:
    """``mean``'s groups: ``kv_heads`` runs of ``heads / kv_heads`` neighbouring heads."""
    size = heads // kv_heads
    return [list(range(g * size, (g + 1) * size)) for g in range(kv_heads)]


def keynorm_groups(k: torch.Tensor, kv_heads: int) -> list[list[int]]:
    """``keynorm``'s groups: heads sorted by the mean norm of their keys, ``k`` (tokens, heads,
    head_dim), and cut into ``kv_heads`` runs of neighbours in that order."""
    heads = k.shape[1]
    order = torch.argsort(torch.linalg.vector_norm(k.float(), dim=-1).mean(0), stable=True).tolist()
    size = heads // kv_heads
    return sorted(sorted(order[g * size : (g + 1) * size]) for g in range(kv_heads))


def similarity_groups(k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> list[list[int]]:
    """``similarity``'s groups: ``k`` and ``v`` (tokens, heads, head_dim) are each head's keys and
    values on the calibration batch. Heads are compared by the mean squared distance between
    their K and V activations, each head's activations scaled to unit RMS so that no head
    dominates by its scale; a group starts from the closest pair left and takes, one at a time,
    the head closest on average to the heads already in it, until it holds ``heads / kv_heads``."""
    heads = k.shape[1]
    size = heads // kv_heads
    if size == 1:
        return [[h] for h in range(heads)]
    features = torch.cat([_unit(k), _unit(v)], dim=-1).transpose(0, 1).reshape(heads, -1)  # (heads, tokens * 2d)
    distance = torch.cdist(features, features).square() / features.shape[1]
    distance.fill_diagonal_(float("inf"))
    left = set(range(heads))
    groups = []
    while left:
        pool = sorted(left)
        sub = distance[pool][:, pool]
        first, second = divmod(int(torch.argmin(sub)), len(pool))
        group = [pool[first], pool[second]]
        while len(group) < size:
            rest = [h for h in pool if h not in group]
            closeness = distance[rest][:, group].mean(1)
            group.append(rest[int(torch.argmin(closeness))])
        groups.append(sorted(group))
        left -= set(group)
    return sorted(groups)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Each head's activations centred and scaled to unit RMS: (tokens, heads, d)."""
    x = x.float() - x.float().mean(0, keepdim=True)
    return x / x.square().mean(dim=(0, 2), keepdim=True).sqrt().clamp_min(1e-12)


def search_groups(batches: Sequence[Calibration], kv_heads: int) -> list[list[int]]:
    """``search``'s groups: the best of mean, keynorm and similarity by :func:`attention_error`,
    then every swap of two heads in different groups that lowers the error, sweep after sweep,
    until a sweep finds none (at most :data:`SEARCH_SWEEPS`)."""
    heads = batches[0].k.shape[2]
    error = _ErrorByGroup(batches)
    k, v = _flat(batches)
    candidates = [contiguous_groups(heads, kv_heads), keynorm_groups(k, kv_heads), similarity_groups(k, v, kv_heads)]
    groups = [list(g) for g in min(candidates, key=lambda c: sum(error(g) for g in c))]
    for _ in range(SEARCH_SWEEPS):
        improved = False
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                for i in range(len(groups[a])):
                    for j in range(len(groups[b])):
                        before = error(groups[a]) + error(groups[b])
                        new_a = groups[a][:i] + [groups[b][j]] + groups[a][i + 1 :]
                        new_b = groups[b][:j] + [groups[a][i]] + groups[b][j + 1 :]
                        if error(new_a) + error(new_b) < before - 1e-9 * max(before, 1.0):
                            groups[a], groups[b], improved = new_a, new_b, True
        if not improved:
            break
    return sorted(sorted(g) for g in groups)


def attention_error(batches: Sequence[Calibration], groups: list[list[int]]) -> float:
    """The error ``search`` minimises, summed over groups and calibration batches: the mean
    squared change of the attention module's output (through ``out_proj``, where given) when
    each group's query heads read its pooled K/V instead of their own (each group's query heads
    are those of its K/V heads)."""
    error = _ErrorByGroup(batches)
    return sum(error(group) for group in groups)


class _ErrorByGroup:
    """One group's :func:`attention_error`, cached by group; each K/V head's own outputs (the
    reference) are computed once."""

    def __init__(self, batches: Sequence[Calibration]) -> None:
        self.batches = batches
        self.cache: dict[tuple[int, ...], float] = {}
        self.reference = [_attend(b.q, b.k, b.v, b.causal) for b in batches]

    def __call__(self, group: list[int]) -> float:
        key = tuple(sorted(group))
        if key not in self.cache:
            total = 0.0
            for batch, reference in zip(self.batches, self.reference):
                r = batch.q.shape[2] // batch.k.shape[2]
                queries = [kv * r + s for kv in key for s in range(r)]
                pooled_k = batch.k[:, :, list(key)].mean(2, keepdim=True).expand(-1, -1, len(queries), -1)
                pooled_v = batch.v[:, :, list(key)].mean(2, keepdim=True).expand(-1, -1, len(queries), -1)
                out = _attend(batch.q[:, :, queries], pooled_k, pooled_v, batch.causal, per_query=False)
                change = out - reference[:, :, queries]  # (batch, positions, group's query heads, d)
                if batch.out_proj is not None:
                    d = change.shape[-1]
                    columns = torch.cat([torch.arange(h * d, (h + 1) * d) for h in queries])
                    change = change.flatten(2) @ batch.out_proj[:, columns].float().t()
                total += change.square().mean(dim=(0, 1)).sum().item()
            self.cache[key] = total
        return self.cache[key]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, per_query: bool = True) -> torch.Tensor:
    """SDPA on (batch, positions, heads, d) tensors; with ``per_query``, each K/V head serves the
    ``q heads / k heads`` query heads that follow it. Returns (batch, positions, q heads, d)."""
    if per_query and q.shape[2] != k.shape[2]:
        r = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(r, 2), v.repeat_interleave(r, 2)
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2), is_causal=causal
    )
    return out.transpose(1, 2)


def _flat(batches: Sequence[Calibration]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every batch's keys and values as (tokens, K/V heads, d)."""
    k = torch.cat([b.k.reshape(-1, *b.k.shape[2:]) for b in batches])
    v = torch.cat([b.v.reshape(-1, *b.v.shape[2:]) for b in batches])
    return k, v


def choose_groups(grouping: str, heads: int, kv_heads: int, batches: Sequence[Calibration] = ()) -> list[list[int]]:
    """The groups ``grouping`` picks for a layer of ``heads`` K/V heads pooled into ``kv_heads``:
    ``kv_heads`` sorted lists of head indices of equal size, ordered by their first head. The
    measured groupings read the layer's calibration ``batches``."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; accepted: {', '.join(GROUPINGS)}")
    if grouping == "mean" or kv_heads == heads:
        return contiguous_groups(heads, kv_heads)
    if not batches:
        raise ValueError(f"grouping {grouping!r} needs the layer's activations on calibration data")
    if grouping == "search":
        return search_groups(batches, kv_heads)
    k, v = _flat(batches)
    return keynorm_groups(k, kv_heads) if grouping == "keynorm" else similarity_groups(k, v, kv_heads)


def pool_heads(weight: torch.Tensor, groups: list[list[int]]) -> torch.Tensor:
    """Average the heads of each group along dim 0: (heads * d, ...) -> (len(groups) * d, ...)."""
    heads = sum(len(g) for g in groups)
    per_head = weight.reshape(heads, weight.shape[0] // heads, *weight.shape[1:])
    return torch.cat([per_head[g].mean(0) for g in groups]).reshape(-1, *weight.shape[1:])


def query_order(groups: list[list[int]], queries_per_kv: int) -> list[int]:
    """The order of the query heads that makes each group contiguous: the query heads reading the
    K/V heads of group 0 first, then group 1's, ...; ``queries_per_kv`` is how many query heads
    read each K/V head before conversion (1 for MHA, ``heads / kv_heads`` for a GQA model)."""
    return [kv * queries_per_kv + r for group in groups for kv in group for r in range(queries_per_kv)]


def permute_heads(weight: torch.Tensor, order: list[int], dim: int = 0) -> torch.Tensor:
    """``weight`` with its head blocks along ``dim`` in ``order``: (heads * d) along ``dim``."""
    heads = len(order)
    moved = weight.movedim(dim, 0)
    per_head = moved.reshape(heads, moved.shape[0] // heads, *moved.shape[1:])
    return per_head[order].reshape(moved.shape).movedim(0, dim)

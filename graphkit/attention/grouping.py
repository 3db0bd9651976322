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

Every grouping has groups of equal size, ``heads / kv_heads`` K/V heads each, so the converted
layer is plain GQA after its query heads are reordered to make each group contiguous: one SDPA
call, no gather, no cost at run time. The grouping is recorded in the converted file's metadata.

RoPE does not change the similarity: at one position every head's key is rotated by the same
matrix, which keeps the distance between two heads' keys, so keys read before the rotation
(LLaMA's ``k_proj`` output) give the same grouping as after it.
"""

from __future__ import annotations

import torch

GROUPINGS = ("mean", "keynorm", "similarity")
#: the groupings that read K/V activations on a calibration batch
MEASURED = ("keynorm", "similarity")


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


def choose_groups(
    grouping: str, heads: int, kv_heads: int, k: torch.Tensor | None = None, v: torch.Tensor | None = None
) -> list[list[int]]:
    """The groups ``grouping`` picks for a layer of ``heads`` K/V heads pooled into ``kv_heads``:
    ``kv_heads`` sorted lists of head indices of equal size, ordered by their first head. The
    measured groupings read the layer's calibration keys and values ``k``, ``v`` (tokens,
    heads, head_dim)."""
    if grouping == "mean" or kv_heads == heads:
        return contiguous_groups(heads, kv_heads)
    if k is None or v is None:
        raise ValueError(f"grouping {grouping!r} needs the layer's keys and values on calibration data")
    if grouping == "keynorm":
        return keynorm_groups(k, kv_heads)
    if grouping == "similarity":
        return similarity_groups(k, v, kv_heads)
    raise ValueError(f"unknown grouping {grouping!r}; accepted: {', '.join(GROUPINGS)}")


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

"""How many query heads each key/value head serves (KDGQA and DGQA, arXiv 2408.08454).

Choices the paper leaves open, and why:

- **Which norm.** Eq. 1 takes the L2 norm of each group's key vector. graphkit uses the key
  *activations* of the current batch: the norm of every key vector, averaged over batch and
  positions. KDGQA recomputes the allocation in every forward pass "regardless of training or
  inference", which only makes sense for activations (weights do not change at inference).
- **Rounding.** Eq. 3 floors ``n_g * Nq / sum(n)``, which can lose heads. graphkit hands out the
  remainder by largest fractional part (ties: lower group first), so the counts always sum to
  the number of query heads.
- **Empty groups.** Min-max scaling (eq. 2) sends the least important group to 0, so the paper's
  rule gives it no query: its K/V projections then get no gradient. By default every group keeps
  at least one query head and only the rest is distributed by importance; ``allow_empty=True``
  gives the paper's behaviour.
- **Degenerate norms.** When all norms are equal (or there is one group), min-max scaling divides
  by zero; graphkit falls back to the uniform split instead of producing NaN.

Everything is tensor arithmetic on the input's device: no ``.item()``, no host synchronisation.
"""

from __future__ import annotations

import torch


def key_norms(k: torch.Tensor) -> torch.Tensor:
    """Per-group importance (eq. 1): mean L2 norm of the key vectors of each KV head.
    ``k`` is (batch, groups, positions, head_dim); returns (groups,)."""
    return torch.linalg.vector_norm(k.detach(), dim=-1, dtype=torch.float32).mean(dim=(0, 2))  # no float32 copy of k


def allocate_queries(importance: torch.Tensor, num_queries: int, *, allow_empty: bool = False) -> torch.Tensor:
    """Query heads per group (eqs. 2-3), a long tensor of shape (groups,) summing to
    ``num_queries``. See the module docstring for the rounding and empty-group rules."""
    groups = importance.shape[0]
    if not allow_empty and num_queries < groups:
        raise ValueError(f"{num_queries} query heads cannot give each of {groups} groups one; pass allow_empty=True")
    lo, hi = torch.aminmax(importance)
    spread = hi - lo
    scaled = (importance - lo) / spread.clamp_min(torch.finfo(torch.float32).tiny)
    weights = torch.where(spread > 1e-12 * importance.abs().amax().clamp_min(1.0), scaled, 1.0)
    free = num_queries if allow_empty else num_queries - groups
    share = weights / weights.sum() * free
    counts = share.floor()
    remainder = free - counts.sum()
    # largest fractional parts first, ties to the lower group index: a group's rank in that order
    rank = torch.argsort(share - counts, descending=True, stable=True).argsort()
    return (counts + (rank < remainder)).long() + (0 if allow_empty else 1)


def query_groups(counts: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The group of each query head, assigning heads to groups left to right: (num_queries,)."""
    return torch.repeat_interleave(torch.arange(counts.shape[0], device=counts.device), counts, output_size=num_queries)

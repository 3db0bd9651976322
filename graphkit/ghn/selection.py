"""Weight selection (Xu et al., "Initializing Models with Larger Ones", ICLR 2024): a model's
initial parameters selected element by element from another model of its family that was
trained on the same data. The hypernetwork's strongest simple competitor: it needs no
hypernetwork, only a trained model and index arithmetic.

The rules, as the paper gives them:

- **Layer selection, first N.** Block i of the target reads block i of the source (same
  parameter names, as two models of one family have).
- **Element selection, uniform and consistent.** Along every dimension where the source is
  larger, the target takes evenly spaced indices, ``(arange(t) * s) // t``: the same indices for
  every parameter with that dimension, so the residual stream's channels stay aligned from
  layer to layer. Fused Q/K/V projections (timm's ``qkv``, GPT-2's ``c_attn``) select within
  each of their three parts.

Where the target is larger than the source (wider, or deeper: the issue's direction, a smaller
model grown into the one to train), the source's elements fill the leading positions and the
rest keep the target's own initialisation; a parameter the source lacks keeps it entirely.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

#: fused Q/K/V parameters by name ending: the dim that stacks Q, K and V (GPT-2's Conv1D stores
#: its weight (in, out))
FUSED_QKV = {"attn.qkv.weight": 0, "attn.qkv.bias": 0, "attn.c_attn.weight": 1, "attn.c_attn.bias": 0}


def uniform_indices(source: int, target: int) -> torch.Tensor:
    """The ``min(source, target)`` indices a dimension of ``target`` elements takes from one of
    ``source`` elements: evenly spaced when the source is larger, all of them otherwise."""
    if source <= target:
        return torch.arange(source)
    return torch.arange(target) * source // target


def _select(source: torch.Tensor, shape: torch.Size, fused_dim: int | None) -> tuple[torch.Tensor, list[int]]:
    """The elements of ``source`` a parameter of ``shape`` takes, and how many along each dim."""
    picked = source
    for dim, size in enumerate(shape):
        parts = 3 if dim == fused_dim else 1
        chunks = picked.chunk(parts, dim=dim)
        index = uniform_indices(chunks[0].shape[dim], size // parts).to(source.device)
        picked = torch.cat([chunk.index_select(dim, index) for chunk in chunks], dim=dim)
    return picked, list(picked.shape)


def select_params(source: Mapping[str, torch.Tensor], target: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``target`` initialised by weight selection from the same-named
    parameters of ``source`` (a trained model's state dict), as new tensors by name (see the
    module docstring). ``target`` is read, not changed: its own values fill what the source
    cannot."""
    selected = {}
    for name, param in target.named_parameters():
        value = param.detach().clone()
        found = source.get(name)
        if found is not None and found.dim() == param.dim():
            fused = next((dim for end, dim in FUSED_QKV.items() if name.endswith(end)), None)
            if fused is not None and (found.shape[fused] % 3 or param.shape[fused] % 3):
                fused = None
            picked, sizes = _select(found.detach().to(value.dtype), param.shape, fused)
            if fused is None:
                value[tuple(slice(0, n) for n in sizes)] = picked
            else:  # each of Q, K and V fills the leading positions of its own third
                third = param.shape[fused] // 3
                for part, chunk in enumerate(picked.chunk(3, dim=fused)):
                    region = [slice(0, n) for n in chunk.shape]
                    region[fused] = slice(part * third, part * third + chunk.shape[fused])
                    value[tuple(region)] = chunk
        selected[name] = value
    return selected

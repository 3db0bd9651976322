"""An attention node's attributes say what the module computes, not how it is spelled, and data
movement in any spelling is data movement."""

from __future__ import annotations

import torch
from torch import nn

import graphkit

# --- transposes ----------------------------------------------------------------------------------


class Transposes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.T.mT.swapaxes(0, 1).swapdims(0, 1).moveaxis(0, 1))


def test_transposes_in_every_spelling_move_data():
    graph = graphkit.trace(Transposes(), (torch.randn(6, 6),))
    assert [node.op for node in graph.nodes] == ["input", "head", "output"]

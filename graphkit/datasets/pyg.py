"""A graph dataset as a PyTorch Geometric ``InMemoryDataset``."""

from __future__ import annotations

from collections.abc import Iterable

from torch_geometric.data import Data, InMemoryDataset


class PygGraphDataset(InMemoryDataset):
    """Records converted with ``Record.to_pyg()`` (each ``Data`` carries its record ``id`` and
    ``fingerprint``); use it with ``torch_geometric.loader.DataLoader``."""

    def __init__(self, data_list: Iterable[Data]) -> None:
        super().__init__(root=None)
        self.data, self.slices = self.collate(list(data_list))

"""A graph dataset as a PyTorch Geometric ``InMemoryDataset``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from graphkit.compat import pyg_data
from graphkit.datasets.store import StoreError

if TYPE_CHECKING:  # the classes as a type checker reads them; at run time, loaded as compat loads them
    from torch_geometric.data import Data, InMemoryDataset  # noqa: TID253
else:
    _pyg = pyg_data()
    Data, InMemoryDataset = _pyg.Data, _pyg.InMemoryDataset


class PygGraphDataset(InMemoryDataset):
    """Records converted with ``Record.to_pyg()`` (each ``Data`` carries its record ``id`` and
    ``fingerprint``); use it with ``torch_geometric.loader.DataLoader``."""

    def __init__(self, data_list: Iterable[Data]) -> None:
        data_list = list(data_list)
        if not data_list:  # torch_geometric's collate fails on an empty list with an IndexError
            raise StoreError("no records to convert to torch_geometric (the dataset or its filter is empty)")
        super().__init__(root=None)
        self.data, self.slices = self.collate(data_list)

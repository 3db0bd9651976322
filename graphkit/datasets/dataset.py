"""Browse a graph dataset: load, filter (pushed down to Parquet), metadata, records.

>>> ds = load("vits-1k")
>>> small = ds.filter(split="train", num_layers=3, num_params=(None, 5_000_000))
>>> small.metadata()            # pandas DataFrame of the scalar columns, graphs not decoded
>>> record = small[0]           # or small["vits-1k-00042"]
>>> record.graph, record.config, record.build_model(device="cpu")
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from graphkit.datasets.store import METADATA_COLUMNS, SCHEMA, StoreError, hub_columns, open_shard, row_to_graph
from graphkit.errors import RecordNotFound
from graphkit.graph import ArchGraph

if TYPE_CHECKING:  # torch_geometric, imported where a dataset is converted
    from graphkit.datasets.pyg import PygGraphDataset

Condition = Any  # a value (equality), a (low, high) range with None for open ends, or a list/set of values


class Record:
    """One architecture of a dataset: its scalar columns, config and graph."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self._row = dict(row)
        if self._row.get("node_feat") is None:  # a schema-version-1 shard: the Hub columns from the graph
            self._row.update(hub_columns(self.graph))

    def __getitem__(self, column: str) -> Any:
        return self._row[column]

    def __repr__(self) -> str:
        r = self._row
        return (
            f"Record({r['id']!r}, {r['family']}, layers={r['num_layers']}, hidden={r['hidden']}, heads={r['heads']}, "
            f"params={r['num_params']:,})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every column of the row, as stored."""
        return dict(self._row)

    @property
    def id(self) -> str:
        """The record's id."""
        return self._row["id"]

    @cached_property
    def config(self) -> dict[str, Any]:
        """The full family config the architecture was built from."""
        return json.loads(self._row["config"])

    @cached_property
    def graph(self) -> ArchGraph:
        """The stored graph."""
        return row_to_graph(self._row)

    def to_networkx(self):
        """The graph as a networkx DiGraph."""
        return self.graph.to_networkx()

    def to_pyg(self) -> PygGraphDataset:
        """The graph as a torch_geometric Data (see ArchGraph.to_pyg), with the record's ``id``
        and ``fingerprint``."""
        data = self.graph.to_pyg()
        data.id, data.fingerprint = self.id, self._row["fingerprint"]
        return data

    def build_model(self, device: str = "meta"):
        """The nn.Module of this architecture, on ``meta`` (no weights) or a real device
        (:func:`graphkit.families.build_model`: a recipe's family, or a zoo's library)."""
        from graphkit.families import build_model  # noqa: PLC0415 (browsing needs no torch)

        return build_model(self.config, device)


class GraphDataset:
    """A graph dataset on disk, optionally restricted by a filter; rows are read on demand."""

    def __init__(self, root: Path, files: list[Path], expression: pc.Expression | None = None) -> None:
        self.root = root
        self.files = files
        self.expression = expression
        self._data = pads.dataset([str(f) for f in files], schema=SCHEMA, format="parquet")

    def __repr__(self) -> str:
        filtered = ", filtered" if self.expression is not None else ""
        return f"GraphDataset({str(self.root)!r}, {len(self)} records{filtered})"

    def _table(self, columns: list[str] | None = None, expression: pc.Expression | None = None) -> pa.Table:
        where = self.expression
        if expression is not None:
            where = expression if where is None else where & expression
        try:
            return self._data.to_table(columns=columns, filter=where)
        except (pa.ArrowInvalid, OSError) as e:
            raise StoreError(f"{self.root}: corrupted Parquet data ({' '.join(str(e).split())})") from e

    @cached_property
    def ids(self) -> list[str]:
        """Record ids in storage order."""
        return self._table(["id"]).column("id").to_pylist()

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def splits(self) -> list[str]:
        """The splits the records belong to (e.g. eval, train), sorted."""
        return sorted(pc.unique(self._table(["split"]).column("split")).to_pylist())

    def __getitem__(self, key: int | str) -> Record:
        if isinstance(key, int):
            key = self.ids[key]
        rows = self._table(expression=pc.field("id") == key).to_pylist()
        if not rows:
            raise RecordNotFound(f"{self.root}: no record {key!r} (see `graphkit ls {self.root}`)")
        return Record(rows[0])

    def __iter__(self) -> Iterator[Record]:
        scanner = self._data.scanner(filter=self.expression, batch_size=256)
        for batch in scanner.to_batches():
            for row in batch.to_pylist():
                yield Record(row)

    def filter(self, expression: pc.Expression | None = None, **conditions: Condition) -> GraphDataset:
        """A view with only the matching records, e.g. ``filter(split="train", num_layers=[3, 4],
        num_params=(None, 5e6))`` or ``filter(pc.field("hidden") >= 256)``; evaluated by Parquet
        (row-group statistics skip what cannot match)."""
        parts = [] if expression is None else [expression]
        for column, condition in conditions.items():
            if column not in METADATA_COLUMNS:
                raise ValueError(f"cannot filter on {column!r}; filterable columns: {', '.join(METADATA_COLUMNS)}")
            field = pc.field(column)
            if isinstance(condition, tuple):
                low, high = condition
                if low is not None:
                    parts.append(field >= low)
                if high is not None:
                    parts.append(field <= high)
            elif isinstance(condition, (list, set, frozenset)):
                parts.append(field.isin(sorted(condition)))
            else:
                parts.append(field == condition)
        combined = self.expression
        for part in parts:
            combined = part if combined is None else combined & part
        return GraphDataset(self.root, self.files, combined)

    def to_pyg(self) -> PygGraphDataset:
        """Every record as a torch_geometric ``InMemoryDataset`` of :meth:`Record.to_pyg` data,
        ready for ``torch_geometric.loader.DataLoader``. Datasets repeat architectures (vits-1k
        holds 160 in 1,000 records), so records of one fingerprint share one conversion: only
        the first row of each is turned into Python objects, the others get a copy with their
        own ``id``."""
        from graphkit.datasets.pyg import PygGraphDataset  # noqa: PLC0415 (browsing a dataset needs no torch)

        table = self._table()
        converted: dict[str, Any] = {}
        data_list = []
        for i, (record_id, fingerprint) in enumerate(
            zip(table.column("id").to_pylist(), table.column("fingerprint").to_pylist(), strict=True)
        ):
            if fingerprint not in converted:
                converted[fingerprint] = Record(table.slice(i, 1).to_pylist()[0]).to_pyg()
            data = copy.copy(converted[fingerprint])  # tensors shared; collate copies them into one store
            data.id = record_id
            data_list.append(data)
        return PygGraphDataset(data_list)

    def metadata(self, format: str = "pandas"):
        """The scalar columns of every record, graphs not decoded: a pandas DataFrame, or a
        pyarrow Table with ``format="arrow"``."""
        table = self._table(list(METADATA_COLUMNS))
        if format == "arrow":
            return table
        if format == "pandas":
            return table.to_pandas()
        raise ValueError(f"format must be 'pandas' or 'arrow', got {format!r}")


def load(path: str | Path) -> GraphDataset:
    """Open the dataset folder ``path`` (``data/*.parquet``, as ``graphkit generate`` writes it).

    Every shard's footer is checked, so a missing folder, a folder without shards, a truncated
    or corrupted file or a newer schema is a one-line StoreError naming the file.
    """
    root = Path(path)
    if not root.exists():
        raise StoreError(f"{root}: no such dataset folder")
    files = sorted((root / "data").glob("*.parquet")) if root.is_dir() else []
    if not files:
        raise StoreError(f"{root}: not a graphkit dataset (no data/*.parquet files)")
    for file in files:
        open_shard(file)
    return GraphDataset(root, files)

"""Graph datasets stored as Parquet in the Hugging Face layout.

``store`` holds the schema, the lossless graph <-> row conversion and the folder layout (shards,
manifest, dataset card); ``dataset`` loads and browses a folder, and a record's model is built by
its family (:func:`graphkit.families.build_model`, which imports torch, so it is not imported
here; a zoo's records name a library's family, ``timm`` or ``transformers``). Generation from
recipes and zoos, and the CLI, build on them.
"""

from graphkit.datasets.dataset import GraphDataset, Record, load
from graphkit.datasets.store import SCHEMA, SCHEMA_VERSION, StoreError, graph_to_row, row_to_graph, write_dataset

__all__ = [
    "load",
    "GraphDataset",
    "Record",
    "write_dataset",
    "graph_to_row",
    "row_to_graph",
    "SCHEMA",
    "SCHEMA_VERSION",
    "StoreError",
]

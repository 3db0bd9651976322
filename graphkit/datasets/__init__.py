"""Graph datasets stored as Parquet in the Hugging Face layout.

``store`` holds the schema, the lossless graph <-> row conversion and the folder layout (shards,
manifest, dataset card); ``dataset`` loads and browses a folder. Generation from recipes and the
CLI build on them.
"""

from graphkit.datasets.dataset import GraphDataset, Record, build_record_model, load
from graphkit.datasets.store import SCHEMA, SCHEMA_VERSION, StoreError, graph_to_row, row_to_graph, write_dataset

__all__ = [
    "load",
    "GraphDataset",
    "Record",
    "build_record_model",
    "write_dataset",
    "graph_to_row",
    "row_to_graph",
    "SCHEMA",
    "SCHEMA_VERSION",
    "StoreError",
]

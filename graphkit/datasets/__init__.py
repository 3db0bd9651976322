"""Graph datasets stored as Parquet in the Hugging Face layout.

``store`` holds the schema, the lossless graph <-> row conversion and the folder layout (shards,
manifest, dataset card); ``dataset`` loads and browses a folder; ``builders`` builds the model a
record describes (:func:`graphkit.datasets.builders.build_record_model`, which imports torch, so it
is not imported here). Generation from recipes and zoos, and the CLI, build on them.
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

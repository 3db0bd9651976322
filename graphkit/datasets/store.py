"""The Parquet layout of graph datasets: the only code that knows the schema.

One row per architecture. Scalar columns are what users filter on; list columns hold the graph,
so a row converts back to the exact :class:`~graphkit.ArchGraph` it came from. Nothing is
pickled: any Parquet reader (pyarrow, DuckDB, pandas, Spark, Hugging Face ``datasets``) sees
plain strings, integers and lists. Since schema version 2 each row also holds its graph in the
Hugging Face graph-datasets layout (``node_feat``, ``edge_index``, ``edge_attr``, ``num_nodes``,
as the Hub's ogbg-molhiv), so a plain row becomes a torch_geometric ``Data`` without graphkit;
version-1 shards (without those columns) still load.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

import graphkit
from graphkit.errors import StoreError
from graphkit.fileio import FOLDER_MARKERS, atomic_path, check_output_dir, write_text_atomic
from graphkit.graph import ArchGraph, Node
from graphkit.ops import OPS, OPS_VERSION, op_id

SCHEMA_VERSION = 2

#: small row groups: fetching one record decodes one group, not the file
ROW_GROUP_SIZE = 16

#: the Hugging Face graph-datasets columns (with ``num_nodes``), added in schema version 2
HUB_FIELDS = [
    ("node_feat", pa.list_(pa.list_(pa.int64()))),  # [N][5]: op id, largest parameter shape (4 dims)
    ("edge_index", pa.list_(pa.list_(pa.int64()))),  # [2][E]: sources, destinations
    ("edge_attr", pa.list_(pa.list_(pa.int64()))),  # [E][1]: 1, every edge is data flow
]

_FIELDS = [
    ("id", pa.string()),
    ("family", pa.string()),
    ("split", pa.string()),
    ("num_params", pa.int64()),
    ("num_layers", pa.int32()),
    ("hidden", pa.int32()),
    ("heads", pa.int32()),
    ("kv_heads", pa.int32()),
    ("attention", pa.string()),
    ("mlp", pa.int32()),
    ("num_nodes", pa.int32()),
    ("num_edges", pa.int32()),
    ("fingerprint", pa.string()),
    ("config", pa.string()),  # the full config, JSON
    ("node_op", pa.list_(pa.string())),
    ("node_name", pa.list_(pa.string())),
    ("node_module", pa.list_(pa.string())),
    ("node_param_names", pa.list_(pa.list_(pa.string()))),
    ("node_param_shapes", pa.list_(pa.list_(pa.list_(pa.int64())))),
    ("node_attrs", pa.list_(pa.string())),  # one JSON object per node
    ("edge_src", pa.list_(pa.int32())),
    ("edge_dst", pa.list_(pa.int32())),
    ("graph_meta", pa.string()),  # JSON
]
SCHEMA = pa.schema(_FIELDS + HUB_FIELDS, metadata={"graphkit_schema_version": str(SCHEMA_VERSION)})
#: the columns a shard of each schema version holds, by version
SCHEMAS = {1: pa.schema(_FIELDS), SCHEMA_VERSION: SCHEMA}
HUB_COLUMNS = tuple(name for name, _ in HUB_FIELDS)

#: columns that hold the graph; metadata queries skip them
GRAPH_COLUMNS = tuple(name for name in SCHEMA.names if name.startswith(("node_", "edge_")) or name == "graph_meta")
METADATA_COLUMNS = tuple(name for name in SCHEMA.names if name not in GRAPH_COLUMNS)


#: what made a dataset, written by ``graphkit generate`` when it starts (see datasets.generate)
RUN_FILE = FOLDER_MARKERS["dataset"]


def read_manifest(out: str | Path) -> dict[str, Any] | None:
    """The ``manifest.json`` graphkit wrote in the dataset folder ``out``; None when there is
    none, or the file there is not graphkit's."""
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and {"schema_version", "content_hash"} <= set(manifest) else None


def check_dataset_folder(out: str | Path, what: str = "--out") -> None:
    """Refuse to write a dataset into a symbolic link, a file, a folder holding another kind of
    graphkit output (:func:`graphkit.fileio.check_output_dir`), or a non-empty folder that is
    not a graphkit dataset (no run file, no graphkit manifest): its README.md and manifest.json
    are the user's, never ours to overwrite (``--out .`` in a project would replace the
    project's README)."""
    out = check_output_dir(out, what, kind="dataset")
    if not out.is_dir() or (out / RUN_FILE).is_file() or read_manifest(out) is not None:
        return
    if any(not entry.name.startswith(".graphkit") for entry in out.iterdir()):
        raise StoreError(
            f"{what} {out}: is not empty and holds no graphkit dataset (no {RUN_FILE} or manifest.json); "
            "choose a new or empty folder"
        )


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def graph_to_row(graph: ArchGraph, config: Mapping[str, Any], *, id: str, split: str) -> dict[str, Any]:
    """One dataset row for ``graph`` built from ``config`` (a resolved family config, or a zoo
    model's: there ``num_layers`` counts the attention nodes and ``hidden`` is the first one's
    heads x head_dim)."""
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    first = attention[0] if attention else {}
    if not first:
        kind = "none"
    else:  # a graphkit variant by name; MQA is GQA with one group (the kv_heads column tells)
        kind = first.get("variant") or ("mha" if first.get("kv_heads") == first.get("heads") else "gqa")
    return {
        "id": id,
        "family": config["family"],
        "split": split,
        "num_params": graph.num_params,
        "num_layers": config.get("num_layers", len(attention) or None),
        "hidden": config.get("hidden", first.get("heads", 0) * first.get("head_dim", 0) or None),
        "heads": config.get("heads", first.get("heads")),
        "kv_heads": first.get("kv_heads", config.get("kv_heads") or config.get("heads")),
        "attention": kind,
        "mlp": config.get("mlp"),
        "num_nodes": len(graph.nodes),
        "num_edges": len(graph.edges),
        "fingerprint": graph.fingerprint(),
        "config": _json(dict(config)),
        "node_op": [n.op for n in graph.nodes],
        "node_name": [n.name for n in graph.nodes],
        "node_module": [n.module for n in graph.nodes],
        "node_param_names": [list(n.params) for n in graph.nodes],
        "node_param_shapes": [[list(s) for s in n.params.values()] for n in graph.nodes],
        "node_attrs": [_json(n.attrs) for n in graph.nodes],
        "edge_src": [s for s, _ in graph.edges],
        "edge_dst": [d for _, d in graph.edges],
        "graph_meta": _json(graph.meta),
        **hub_columns(graph),
    }


def hub_columns(graph: ArchGraph) -> dict[str, Any]:
    """``graph`` in the Hugging Face graph-datasets layout (the Hub's ogbg-molhiv). ``node_feat``
    is [op id (:data:`graphkit.OPS`), the node's largest parameter shape zero-padded to 4 dims]
    per node, the ``x`` and ``param_shape`` of :meth:`ArchGraph.to_pyg` side by side, so a GNN
    sees what an op is and how big; ``edge_attr`` is [1] per edge: graphkit's edges are untyped
    data flow (no argument position is kept), and a constant column keeps the [E][F] shape that
    loaders and edge-aware layers (GINEConv(edge_dim=1)) expect."""
    return {
        "node_feat": [[op_id(n.op), *n.largest_shape(4)] for n in graph.nodes],
        "edge_index": [[s for s, _ in graph.edges], [d for _, d in graph.edges]],
        "edge_attr": [[1] for _ in graph.edges],
    }


def row_to_graph(row: Mapping[str, Any]) -> ArchGraph:
    """The ArchGraph a row holds (inverse of :func:`graph_to_row`)."""
    nodes = [
        Node(
            op=op,
            name=name,
            module=module,
            params=dict(zip(names, map(tuple, shapes), strict=True)),
            attrs=json.loads(attrs),
        )
        for op, name, module, names, shapes, attrs in zip(
            row["node_op"],
            row["node_name"],
            row["node_module"],
            row["node_param_names"],
            row["node_param_shapes"],
            row["node_attrs"],
            strict=True,
        )
    ]
    edges = list(zip(row["edge_src"], row["edge_dst"], strict=True))
    return ArchGraph(nodes=nodes, edges=edges, meta=json.loads(row["graph_meta"]))


def write_shard(rows: Sequence[Mapping[str, Any]], path: str | Path, *, row_group_size: int = ROW_GROUP_SIZE) -> Path:
    """Write ``rows`` to the Parquet file ``path`` atomically: the file appears complete or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    return path


def shard_name(split: str, index: int, count: int) -> str:
    """Hugging Face file naming: ``train-00003-of-00008.parquet``."""
    return f"{split}-{index:05d}-of-{count:05d}.parquet"


def write_dataset(
    rows: Sequence[Mapping[str, Any]],
    out: str | Path,
    *,
    name: str,
    shard: tuple[int, int] = (0, 1),
    info: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``rows`` as dataset folder ``out``: ``data/<split>-<i>-of-<k>.parquet`` per split,
    then :func:`finalize_dataset`. ``shard=(i, k)`` names the files of shard i of k, so
    separately written shards form one dataset; a non-empty folder that is not a graphkit
    dataset is refused."""
    out = Path(out)
    check_dataset_folder(out, "dataset folder")
    for split in sorted({r["split"] for r in rows}):
        write_shard([r for r in rows if r["split"] == split], out / "data" / shard_name(split, *shard))
    return finalize_dataset(out, name=name, info=info)


def finalize_dataset(out: str | Path, *, name: str, info: Mapping[str, Any] | None = None) -> Path:
    """(Re)write ``manifest.json`` and the ``README.md`` card of ``out`` from every shard in it,
    however many processes wrote them: counts per split, distinct architectures and a content
    hash of (id, fingerprint) pairs that does not depend on the sharding. ``info`` (recipe,
    seed, ...) is added to the manifest."""
    out = Path(out)
    files = sorted(str(f) for f in (out / "data").glob("*.parquet"))
    present = (
        pads.dataset(files, schema=SCHEMA, format="parquet")
        .to_table(columns=["id", "fingerprint", "split"])
        .to_pydict()
    )
    splits = sorted(set(present["split"]))
    counts = {split: present["split"].count(split) for split in splits}
    digest = hashlib.sha256(_json(sorted(zip(present["id"], present["fingerprint"], strict=True))).encode()).hexdigest()
    manifest = {
        "name": name,
        "schema_version": SCHEMA_VERSION,
        "ops_version": OPS_VERSION,
        "ops": list(OPS),
        "graphkit_version": graphkit.__version__,
        "counts": counts,
        "architectures": len(set(present["fingerprint"])),
        "content_hash": digest,
        **(info or {}),
    }
    write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    card_splits = "".join(f"  - split: {s}\n    path: data/{s}-*.parquet\n" for s in splits)
    write_text_atomic(
        out / "README.md",
        (
            "---\nconfigs:\n- config_name: default\n  "
            f"data_files:\n{card_splits}tags:\n- graphkit\n- neural-architectures\n"
            f"- graphs\n---\n# {name}\n\nComputation graphs of neural "
            "networks made by graphkit, one architecture per row"
            f" ({', '.join(f'{n:,} {s}' for s, n in counts.items())}; "
            f"{manifest['architectures']:,} distinct architectures)."
            " Scalar columns describe each architecture (`id`, `family`, `split`, `num_params`, `num_layers`, `hidden`,"
            " `heads`, `kv_heads`, `attention`, `mlp`, `num_nodes`, `num_edges`, `fingerprint`, `config` as JSON);"
            " `node_*` and `edge_*` list columns hold its graph losslessly. The graph is also in the Hugging Face"
            " graph-datasets layout: `node_feat` (per node: op id, "
            "indexing `manifest.json`'s `ops`, then the shape of its"
            " largest parameter zero-padded to 4 dims), `edge_index` (sources, destinations), `edge_attr` (1 per edge:"
            " untyped data flow) and `num_nodes`, so `torch_geometric.data.Data(x=torch.tensor(row['node_feat']),"
            " edge_index=torch.tensor(row['edge_index']), edge_attr=torch.tensor(row['edge_attr']),"
            " num_nodes=row['num_nodes'])` needs no graphkit. Load with `graphkit.datasets.load(path)`, or with any"
            " Parquet reader. `manifest.json` records the recipe and seed that reproduce it.\n"
            + _libraries_line(manifest)
        ),
    )
    return out


def _libraries_line(manifest: Mapping[str, Any]) -> str:
    """The card's line on where a zoo's models come from, with the library versions that
    reproduce it (empty for a recipe's dataset)."""
    libraries = manifest.get("libraries")
    if not isinstance(libraries, Mapping):
        return ""
    versions = ", ".join(f"{name} {version}" for name, version in libraries.items())
    return (
        f"\nModels: {manifest.get('source', 'a zoo')}. Traced with {versions}: the same versions give the same"
        " dataset (`graphkit generate " + str(manifest.get("zoo", manifest["name"])) + "`). `report.md` lists the"
        " models that could not be traced, with the reason.\n"
    )


def open_shard(path: str | Path) -> pq.ParquetFile:
    """Open one shard, checking that it is a readable graphkit Parquet file of a known schema
    version holding every column of that version (:data:`SCHEMAS`) with its type."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path}: no such file")
    try:
        shard = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise StoreError(f"{path}: not a readable Parquet file ({' '.join(str(e).split())})") from e
    schema = shard.schema_arrow
    version = (schema.metadata or {}).get(b"graphkit_schema_version")
    if version is None:
        raise StoreError(f"{path}: not a graphkit dataset shard (no graphkit_schema_version)")
    if not version.isdigit():
        raise StoreError(
            f"{path}: unreadable graphkit_schema_version {version.decode(errors='replace')!r}; expected an integer"
        )
    if int(version) > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: schema version {int(version)} is newer than this "
            f"graphkit reads ({SCHEMA_VERSION}); upgrade graphkit"
        )
    if int(version) not in SCHEMAS:
        raise StoreError(
            f"{path}: unknown graphkit_schema_version {int(version)}; "
            f"this graphkit reads {', '.join(map(str, SCHEMAS))}"
        )
    expected_schema = SCHEMAS[int(version)]
    missing = [name for name in expected_schema.names if name not in schema.names]
    if missing:
        raise StoreError(f"{path}: not a complete graphkit dataset shard: missing columns {', '.join(missing)}")
    for expected in expected_schema:
        found = schema.field(expected.name).type
        if found != expected.type:
            raise StoreError(f"{path}: column {expected.name!r} holds {found}, expected {expected.type}")
    return shard


def read_table(path: str | Path, columns: Iterable[str] | None = None) -> pa.Table:
    """One shard as an Arrow table (``columns`` to read fewer), every page decoded, so a
    truncated or corrupted file is a StoreError naming it."""
    shard = open_shard(path)
    try:
        return shard.read(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as e:
        raise StoreError(f"{path}: corrupted Parquet data ({' '.join(str(e).split())})") from e


def read_rows(path: str | Path, columns: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """All rows of one shard as dicts (``columns`` to read fewer); errors name the file. A
    version-1 shard's rows lack :data:`HUB_COLUMNS` (``graphkit.datasets.load`` fills them in)."""
    return read_table(path, columns).to_pylist()

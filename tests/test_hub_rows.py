"""Hub-ready rows (schema version 2): each graph also in the Hugging Face graph-datasets layout,
read by pyarrow, pandas and DuckDB without graphkit, and version-1 shards still loading."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.compat import pyg_data
from graphkit.datasets import load
from graphkit.datasets.store import HUB_COLUMNS, SCHEMA, SCHEMAS, StoreError, open_shard, write_shard
from graphkit.ops import OPS

HERE = Path(__file__).resolve().parent
HUB_KEYS = (*HUB_COLUMNS, "num_nodes")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A dataset made by the real CLI: 24 records of 18 small ViTs, so some repeat."""
    out = tmp_path_factory.mktemp("hub") / "tiny"
    result = CliRunner().invoke(
        app, ["generate", str(HERE / "recipes" / "tiny-vits.json"), "--out", str(out), "--num", "24"]
    )
    assert result.exit_code == 0, result.output
    return out


def plain_rows(folder: Path) -> list[dict]:
    return pq.read_table(folder / "data").to_pylist()


@pytest.mark.slow
def test_rows_hold_the_hub_layout(folder):
    rows = plain_rows(folder)
    assert len(rows) == 24
    for row in rows:
        n, e = row["num_nodes"], row["num_edges"]
        assert len(row["node_feat"]) == n and {len(f) for f in row["node_feat"]} == {5}
        assert [OPS[f[0]] for f in row["node_feat"]] == row["node_op"]  # op ids index the manifest's ops
        assert row["edge_index"] == [row["edge_src"], row["edge_dst"]] and len(row["edge_index"][0]) == e
        assert row["edge_attr"] == [[1]] * e
    record = load(folder)[rows[0]["id"]]
    pyg = record.to_pyg()  # graphkit's own features, side by side in node_feat
    feat = torch.tensor(rows[0]["node_feat"])
    assert torch.equal(feat[:, 0], pyg.x) and torch.equal(feat[:, 1:], pyg.param_shape)
    assert torch.equal(torch.tensor(rows[0]["edge_index"]), pyg.edge_index)


def test_plain_row_becomes_a_pyg_data_that_batches(folder):
    Data = pyg_data().Data
    from torch_geometric.loader import DataLoader

    rows = plain_rows(folder)[:6]
    assert Data(**rows[0]).num_nodes == rows[0]["num_nodes"]  # every column as an attribute
    graphs = [Data(**{key: torch.tensor(row[key]) for key in HUB_KEYS}) for row in rows]
    for data, row in zip(graphs, rows, strict=True):
        assert data.validate() and data.num_nodes == row["num_nodes"] and data.num_edges == row["num_edges"]
        assert data.edge_index.dtype == torch.long and data.node_feat.shape == (row["num_nodes"], 5)
    batch = next(iter(DataLoader(graphs, batch_size=6)))
    assert batch.num_graphs == 6 and batch.num_nodes == sum(r["num_nodes"] for r in rows)
    assert int(batch.edge_index.max()) == batch.num_nodes - 1  # indices offset per graph


def test_pandas_and_duckdb_read_the_same_rows(folder):
    import duckdb
    import pandas as pd

    frame = pd.read_parquet(folder / "data").sort_values("id")
    assert set(HUB_KEYS) <= set(frame.columns)
    rows = sorted(plain_rows(folder), key=lambda r: r["id"])
    first = frame.iloc[0]
    assert [list(f) for f in first["node_feat"]] == rows[0]["node_feat"]
    assert [list(side) for side in first["edge_index"]] == rows[0]["edge_index"]
    found = duckdb.sql(
        "SELECT id, num_nodes, len(node_feat) AS n, len(edge_index[1]) AS e, len(edge_attr) AS a, num_edges, "
        "edge_index[2][1] AS first_dst "
        f"FROM read_parquet('{folder}/data/*.parquet') ORDER BY id"
    ).fetchall()
    assert found == [
        (r["id"], r["num_nodes"], r["num_nodes"], r["num_edges"], r["num_edges"], r["num_edges"], r["edge_dst"][0])
        for r in rows
    ]


def test_to_pyg_converts_each_architecture_once_and_keeps_every_record(folder):
    ds = load(folder)
    pyg = ds.to_pyg()
    fingerprints = [record["fingerprint"] for record in ds]
    assert len(set(fingerprints)) < len(pyg) == 24  # repeats share one conversion
    for data, record in zip(pyg, ds, strict=True):
        expected = record.to_pyg()
        assert (data.id, data.fingerprint) == (record.id, record["fingerprint"])
        for key in ("x", "edge_index", "in_degree", "out_degree", "spd_index", "spd_value", "param_shape"):
            assert torch.equal(data[key], expected[key]), key


def test_card_and_manifest_describe_the_columns(folder):
    card = (folder / "README.md").read_text()
    for column in HUB_KEYS:
        assert f"`{column}`" in card
    assert "torch_geometric.data.Data(x=torch.tensor(row['node_feat'])" in card
    assert json.loads((folder / "manifest.json").read_text())["schema_version"] == 2


def write_v1_shard(rows: list[dict], path: Path) -> None:
    """A shard as graphkit wrote it before schema version 2: no Hub columns, version "1"."""
    schema = SCHEMAS[1].with_metadata({"graphkit_schema_version": "1"})
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in r.items() if k not in HUB_COLUMNS} for r in rows], schema=schema), path
    )


def test_version_1_shards_still_load(folder, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    rows = plain_rows(folder)
    shard = next((old / "data").glob("train-*.parquet"))
    for file in (old / "data").glob("*.parquet"):
        file.unlink()
    write_v1_shard(rows, shard)
    assert pq.ParquetFile(shard).schema_arrow.names == SCHEMAS[1].names  # really the old layout
    ds = load(old)
    assert ds.ids == [r["id"] for r in rows] and len(ds.metadata()) == 24
    for row, record in zip(rows, ds, strict=True):
        assert record.graph.fingerprint() == row["fingerprint"]
        assert {key: record[key] for key in HUB_KEYS} == {key: row[key] for key in HUB_KEYS}  # filled in from the graph
    assert ds.filter(num_layers=[2]).ids == [r["id"] for r in rows if r["num_layers"] == 2]
    assert len(ds.to_pyg()) == 24
    # a folder mixing both versions (an old dataset resumed by this graphkit) loads as one
    write_shard(rows[:2], old / "data" / "eval-00000-of-00001.parquet")
    mixed = load(old)
    assert sorted(mixed.ids) == sorted(r["id"] for r in rows + rows[:2])
    assert mixed[rows[0]["id"]].to_dict()["node_feat"] == rows[0]["node_feat"]


def test_shards_missing_their_versions_columns_are_refused(folder, tmp_path):
    rows = plain_rows(folder)
    v2_without_hub = tmp_path / "v2-without-hub.parquet"
    write_v1_shard(rows, v2_without_hub)
    table = pq.read_table(v2_without_hub)
    pq.write_table(table.replace_schema_metadata({"graphkit_schema_version": "2"}), v2_without_hub)
    with pytest.raises(
        StoreError,
        match=re.escape(
            f"{v2_without_hub}: not a complete graphkit dataset shard: missing columns node_feat, edge_index, edge_attr"
        ),
    ):
        open_shard(v2_without_hub)
    zero = tmp_path / "zero.parquet"
    pq.write_table(table.replace_schema_metadata({"graphkit_schema_version": "0"}), zero)
    with pytest.raises(
        StoreError, match=re.escape(f"{zero}: unknown graphkit_schema_version 0; this graphkit reads 1, 2")
    ):
        open_shard(zero)
    wrong = tmp_path / "wrong.parquet"
    bad = pa.Table.from_pylist(rows, schema=SCHEMA).set_column(
        SCHEMA.get_field_index("edge_attr"), "edge_attr", pa.array([[1.5]] * len(rows), pa.list_(pa.float64()))
    )
    pq.write_table(bad, wrong)
    with pytest.raises(
        StoreError,
        match=re.escape(
            f"{wrong}: column 'edge_attr' holds list<element: double>, expected list<item: list<item: int64>>"
        ),
    ):
        open_shard(wrong)

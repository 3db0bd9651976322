"""The Parquet layout: lossless rows, atomic shards, readable by plain pyarrow / pandas, and
one-line errors for bad files."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import graphkit
from graphkit.datasets.store import (
    METADATA_COLUMNS,
    SCHEMA,
    StoreError,
    graph_to_row,
    open_shard,
    read_rows,
    row_to_graph,
    write_shard,
)
from graphkit.families import build_model, resolve_config

CONFIGS = [
    dict(family="vit", num_layers=3, hidden=192, heads=3),
    dict(family="gpt2", num_layers=4, hidden=128, heads=4, vocab_size=500, context=64),
    dict(family="llama", num_layers=3, hidden=64, heads=4, kv_heads=2, vocab_size=500, sliding_window=8),
]


@pytest.fixture(scope="module")
def rows():
    out = []
    for i, config in enumerate(CONFIGS):
        full = resolve_config(config)
        graph = graphkit.trace(build_model(full))
        out.append((graph, graph_to_row(graph, full, id=f"test-{i:05d}", split="train" if i else "eval")))
    return out


def test_rows_round_trip_losslessly(rows, tmp_path):
    path = write_shard([r for _, r in rows], tmp_path / "data" / "train-00000-of-00001.parquet")
    for (graph, _), row in zip(rows, read_rows(path), strict=True):
        restored = row_to_graph(row)
        assert restored == graph and restored.fingerprint() == row["fingerprint"] == graph.fingerprint()


def test_scalar_columns(rows):
    graph, row = rows[2]
    assert row["family"] == "llama" and row["kv_heads"] == 2 and row["attention"] == "gqa"
    assert row["num_params"] == graph.num_params and row["num_nodes"] == len(graph)
    assert json.loads(row["config"])["sliding_window"] == 8
    assert rows[0][1]["attention"] == "mha" and rows[0][1]["split"] == "eval"


def test_plain_readers_see_plain_columns(rows, tmp_path):
    path = write_shard([r for _, r in rows], tmp_path / "x.parquet", row_group_size=1)
    table = pq.read_table(path, columns=list(METADATA_COLUMNS))
    assert table.schema.names == list(METADATA_COLUMNS)
    frame = table.to_pandas()
    assert list(frame["family"]) == ["vit", "gpt2", "llama"]
    assert pq.ParquetFile(path).metadata.num_row_groups == 3  # one record decodes alone
    one = pq.read_table(path, filters=[("id", "=", "test-00001")])
    assert one.num_rows == 1 and one.column("hidden")[0].as_py() == 128


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(Exception):
        write_shard([{"id": "x", "num_params": "not a number"}], tmp_path / "bad.parquet")
    assert list(tmp_path.iterdir()) == []


def test_bad_files_give_one_line_errors(rows, tmp_path):
    with pytest.raises(StoreError, match="missing.parquet: no such file"):
        open_shard(tmp_path / "missing.parquet")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(StoreError, match="junk.parquet: not a readable Parquet file"):
        open_shard(junk)
    good = write_shard([r for _, r in rows], tmp_path / "good.parquet")
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(StoreError, match="truncated.parquet: not a readable Parquet file"):
        open_shard(truncated)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pq.read_table(good).replace_schema_metadata({}), foreign)
    with pytest.raises(StoreError, match="not a graphkit dataset shard"):
        open_shard(foreign)
    newer = tmp_path / "newer.parquet"
    pq.write_table(pq.read_table(good).replace_schema_metadata({"graphkit_schema_version": "99"}), newer)
    with pytest.raises(StoreError, match="schema version 99 is newer than this graphkit reads"):
        open_shard(newer)


def test_schema_has_the_documented_columns():
    for column in (
        "id",
        "family",
        "split",
        "num_params",
        "num_layers",
        "hidden",
        "heads",
        "kv_heads",
        "attention",
        "mlp",
        "num_nodes",
        "num_edges",
        "fingerprint",
        "config",
        "node_op",
        "node_name",
        "node_param_names",
        "node_param_shapes",
        "edge_src",
        "edge_dst",
    ):
        assert column in SCHEMA.names

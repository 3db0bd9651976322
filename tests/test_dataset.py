"""Browsing a dataset folder: load, filter pushdown, metadata, records, bad folders."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import graphkit
from graphkit.datasets.dataset import load
from graphkit.datasets.store import StoreError, graph_to_row, write_dataset
from graphkit.families import build_model, resolve_config

CONFIGS = [
    dict(family="vit", num_layers=L, hidden=D, heads=H)
    for L, D, H in [(3, 384, 6), (4, 256, 8), (6, 128, 4), (7, 192, 3), (9, 160, 8)]
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    rows = []
    for i, config in enumerate(CONFIGS):
        full = resolve_config(config)
        rows.append(
            graph_to_row(
                graphkit.trace(build_model(full)), full, id=f"demo-{i:05d}", split="eval" if i == 2 else "train"
            )
        )
    out = tmp_path_factory.mktemp("ds") / "demo"
    write_dataset(rows[:3], out, name="demo", shard=(0, 2), info={"seed": 0})
    write_dataset(rows[3:], out, name="demo", shard=(1, 2), info={"seed": 0})
    return out


@pytest.mark.slow
def test_layout_card_and_manifest(folder):
    names = sorted(p.name for p in (folder / "data").iterdir())
    assert names == ["eval-00000-of-00002.parquet", "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: default\n") and "path: data/train-*.parquet" in card
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["schema_version"] == 2 and manifest["ops"][0] == "input" and manifest["seed"] == 0
    assert manifest["counts"] == {"eval": 1, "train": 4}  # both separately written shards


def test_content_hash_does_not_depend_on_sharding(folder, tmp_path):
    rows = [r.to_dict() for r in load(folder)]
    write_dataset(rows, tmp_path / "one", name="demo")
    one = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert one["content_hash"] == json.loads((folder / "manifest.json").read_text())["content_hash"]


def test_len_index_iterate(folder):
    ds = load(folder)
    assert len(ds) == 5
    assert sorted(r.id for r in ds) == [f"demo-{i:05d}" for i in range(5)]
    record = ds["demo-00003"]
    assert record["num_layers"] == 7 and record.config["hidden"] == 192
    assert ds[0].id in ds.ids


def test_filter_is_pushed_down(folder):
    ds = load(folder)
    assert len(ds.filter(split="eval")) == 1
    assert sorted(ds.filter(num_layers=[3, 4]).metadata()["hidden"]) == [256, 384]
    narrow = ds.filter(split="train").filter(num_params=(None, 3_000_000))
    assert all(n <= 3_000_000 for n in narrow.metadata()["num_params"]) and len(narrow) >= 1
    assert len(ds.filter(pc.field("hidden") >= 256)) == 2
    with pytest.raises(ValueError, match="cannot filter on 'node_op'"):
        ds.filter(node_op="x")


def test_metadata_does_not_decode_graphs(folder):
    table = load(folder).metadata(format="arrow")
    assert "node_op" not in table.schema.names and table.num_rows == 5
    frame = load(folder).metadata()
    assert set(frame["family"]) == {"vit"}


def test_record_round_trip_to_same_fingerprint(folder):
    record = load(folder)["demo-00001"]
    model = record.build_model()
    assert graphkit.trace(model).fingerprint() == record["fingerprint"] == record.graph.fingerprint()
    assert record.to_networkx().number_of_nodes() == record["num_nodes"]
    assert record.to_pyg().num_nodes == record["num_nodes"]


def test_any_parquet_reader_sees_the_rows(folder):
    table = pq.read_table(folder / "data", columns=["id", "num_params"])
    assert table.num_rows == 5


def test_bad_folders(folder, tmp_path):
    with pytest.raises(StoreError, match="nope: no such dataset folder"):
        load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="empty: not a graphkit dataset"):
        load(tmp_path / "empty")
    broken = tmp_path / "broken"
    (broken / "data").mkdir(parents=True)
    good = folder / "data" / "train-00000-of-00002.parquet"
    (broken / "data" / "train-00000-of-00001.parquet").write_bytes(good.read_bytes()[:200])
    with pytest.raises(StoreError, match="train-00000-of-00001.parquet: not a readable Parquet file"):
        load(broken)
    with pytest.raises(KeyError, match="no record 'missing'"):
        load(folder)["missing"]


def test_to_pyg_dataset_works_with_the_dataloader(folder):
    from torch_geometric.loader import DataLoader

    ds = load(folder).filter(split="train")
    pyg = ds.to_pyg()
    assert len(pyg) == 4 and sorted(pyg[k].id for k in range(4)) == sorted(ds.ids)
    batch = next(iter(DataLoader(pyg, batch_size=4)))
    assert batch.num_graphs == 4 and batch.x.shape[0] == sum(ds.metadata()["num_nodes"])

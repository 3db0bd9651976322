"""Generation: reproducible across worker counts and shards, restartable, faithful to the models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphkit
from graphkit.datasets import load
from graphkit.datasets.generate import GenerateError, _config_key, _trace_group, _width_key, generate
from graphkit.datasets.recipes import RECIPES
from graphkit.datasets.store import graph_to_row
from graphkit.families import build_model

TINY = str(Path(__file__).resolve().parent / "recipes" / "tiny-vits.json")


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def rows(path: Path) -> list[dict]:
    return sorted((r.to_dict() for r in load(path)), key=lambda r: r["id"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "one-worker"
    result = generate(TINY, out, seed=1, part_size=8)
    assert (result.records, result.parts_written, result.architectures) == (30, 4, 18)
    return out


@pytest.mark.slow
def test_layout_and_manifest(reference):
    files = sorted(p.name for p in (reference / "data").iterdir())
    assert files == [f"{s}-{j:05d}-of-00004.parquet" for s in ("eval", "train") for j in range(4)]
    m = manifest(reference)
    assert m["counts"]["train"] + m["counts"]["eval"] == 30 and m["architectures"] == 18
    assert m["seed"] == 1 and m["recipe"]["name"] == "tiny-vits"


@pytest.mark.slow
def test_same_content_with_two_workers(reference, tmp_path):
    generate(TINY, tmp_path / "two", seed=1, part_size=8, workers=2)
    assert manifest(tmp_path / "two")["content_hash"] == manifest(reference)["content_hash"]
    assert rows(tmp_path / "two") == rows(reference)


@pytest.mark.slow
def test_shards_fill_one_folder(reference, tmp_path):
    for i in range(3):
        result = generate(TINY, tmp_path / "sharded", seed=1, part_size=8, num_shards=3, shard_index=i)
        assert result.parts_written == (2 if i == 0 else 1)
    assert manifest(tmp_path / "sharded")["content_hash"] == manifest(reference)["content_hash"]


@pytest.mark.slow
def test_resume_after_an_interrupted_run(reference, tmp_path):
    out = tmp_path / "resumed"
    generate(TINY, out, seed=1, part_size=8)
    (out / "data" / "train-00002-of-00004.parquet").unlink()  # the run was killed before this part...
    staging = out / "data" / ".train-00002-of-00004.parquet.x1y2.tmp"  # ...while writing it (SIGKILL)
    staging.mkdir()
    (staging / "train-00002-of-00004.parquet").write_bytes(b"half a file")
    (out / "data" / ".train-00002-of-00004.parquet.x3y4.tmp").write_bytes(b"an older graphkit's")
    with pytest.raises(GenerateError, match="already holds a dataset .*pass --resume"):
        generate(TINY, out, seed=1, part_size=8)
    result = generate(TINY, out, seed=1, part_size=8, resume=True)
    assert (result.parts_written, result.parts_skipped) == (1, 3)
    assert manifest(out)["content_hash"] == manifest(reference)["content_hash"]
    assert not list((out / "data").glob(".*"))


@pytest.mark.slow
def test_records_rebuild_to_the_stored_graph(reference):
    for record in list(load(reference))[::5]:
        assert graphkit.trace(record.build_model()).fingerprint() == record["fingerprint"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,family", [("gpts-1k", "gpt2"), ("llamas-1k", "llama")])
def test_language_model_recipes(recipe, family, tmp_path):
    out = tmp_path / recipe
    generate(recipe, out, num=4, seed=0)
    ds = load(out)
    assert len(ds) == 4 and set(ds.metadata()["family"]) == {family}
    record = ds[0]
    assert graphkit.trace(record.build_model()).fingerprint() == record["fingerprint"]


def test_bad_options(tmp_path):
    with pytest.raises(GenerateError, match="--shard-index must be in 0..1 for --num-shards 2, got 2"):
        generate(TINY, tmp_path / "x", num_shards=2, shard_index=2)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(GenerateError, match="exists and is not a folder"):
        generate(TINY, tmp_path / "file")


@pytest.mark.slow
def test_attention_variant_datasets(tmp_path):
    out = tmp_path / "kdgqa"
    generate(TINY, out, num=8, seed=0, attention="kdgqa")
    ds = load(out)
    frame = ds.metadata()
    assert set(frame["attention"]) == {"kdgqa"} and frame["kv_heads"].nunique() > 1
    assert manifest(out)["name"] == "tiny-vits-kdgqa"
    for record in ds:
        assert record.config["attention"] == "kdgqa"
        assert graphkit.trace(record.build_model()).fingerprint() == record["fingerprint"]
    with pytest.raises(GenerateError, match="unknown attention 'mqa'; accepted: mha, gqa, kdgqa, dgqa, pgqa"):
        generate(TINY, tmp_path / "bad", attention="mqa")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gpts-1k", "vits-1k"])
def test_head_counts_share_one_export_and_match_direct_traces(recipe):
    """generate traces one head count per width and relabels the others: the rows must be
    exactly those of tracing every config on its own."""

    groups: dict[str, list[str]] = {}
    for config in RECIPES[recipe].space:
        groups.setdefault(_width_key(_config_key(config)), []).append(_config_key(config))
    shared = [keys for keys in groups.values() if len({json.loads(k)["heads"] for k in keys}) > 1]
    assert shared, "the recipe has widths with several head counts"
    sample = [k for keys in shared[:: max(1, len(shared) // 2)][:2] for k in keys[:4]]
    assert len({json.loads(k)["heads"] for k in sample}) > 1
    for key, row in _trace_group(sample):
        config = json.loads(key)
        assert row == graph_to_row(graphkit.trace(build_model(config)), config, id="", split=""), key

"""docs/extending.md's code blocks run as written, each registration undone afterwards, so that
the page cannot drift from the registries it documents."""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path

import pytest

from graphkit import fileio, sources
from graphkit.attention import adapter, core
from graphkit.families import registry
from graphkit.training import data

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
#: every table a block may register into: restored in place, whoever imported it by name
TABLES = [
    registry.FAMILIES,
    adapter.ADAPTERS,
    core.ATTENTION_VARIANTS,
    sources.PREFIXES,
    data._IMAGE,
    data._TEXT,
    data._ARGS,
    fileio.KINDS,
    fileio.FOLDER_MARKERS,
]
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.fixture
def restored_tables():
    saved = [copy.copy(table) for table in TABLES]
    yield
    for table, before in zip(TABLES, saved, strict=True):
        if isinstance(table, list):
            table[:] = before
        else:
            table.clear()
            table.update(before)


def test_the_page_shows_one_block_per_registration():
    assert len(BLOCKS) == 6
    for call in (
        "register_family(",
        "register_adapter(",
        "register_variant(",
        "PREFIXES[",
        "register_source(",
        "register_kind(",
    ):
        assert sum(call in block for block in BLOCKS) == 1, call


@pytest.mark.parametrize(
    "block", BLOCKS, ids=["family", "attention", "variant", "source-prefix", "data-source", "output-kind"]
)
def test_each_block_runs(block, tmp_path, monkeypatch, restored_tables):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a block's temporary folders go under tmp_path
    exec(compile(block, str(PAGE), "exec"), {"__name__": "extending"})

"""Tests for bugs a mutation check planted that every other test let through (issue #39 item 6):
a zoo's coverage over models that keep ops outside the vocabulary.
Each test here fails with its bug planted (the commit that added it says how it was checked)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphkit.datasets import zoo as zoo_module
from graphkit.datasets.zoo import ZOOS, Zoo, build_zoo_model, generate_zoo


class OffVocabularyHead(nn.Module):
    """A head that ends in an op graphkit has no name for (``other:aten.special_erfinv``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.erfinv(torch.tanh(x) * 0.5)


def _one_model_off_the_vocabulary(config, device="meta"):
    model = build_zoo_model({"family": "timm", "model": "test_vit"}, device)
    if config["model"] == "off_vocabulary":
        model.head = nn.Sequential(model.head, OffVocabularyHead())
    return model


@pytest.mark.slow
def test_a_zoo_model_with_an_op_outside_the_vocabulary_is_not_counted_as_clean(tmp_path, monkeypatch):
    """Coverage is the share of the models the library builds that trace with no ``other:`` op: a
    model that traces with one is a record, listed in the report with its ops, and not clean."""
    names = ["off_vocabulary", "test_vit"]
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: names, ZOOS["zoo-vits"].config))
    monkeypatch.setattr(zoo_module, "build_zoo_model", _one_model_off_the_vocabulary)
    result = generate_zoo("zoo-test", tmp_path / "z")
    report = result.report
    assert (report["traced"], report["clean"], report["records"], result.coverage) == (2, 1, 2, 0.5)
    assert report["other_ops"] == [{"model": "off_vocabulary", "ops": ["other:aten.special_erfinv"]}]
    text = " ".join((tmp_path / "z" / "report.md").read_text().split())
    assert "- with no `other:` op: 1 (50.0% of those built)" in text
    assert "## Traced with ops outside the vocabulary - `off_vocabulary`: other:aten.special_erfinv" in text

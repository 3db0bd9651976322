"""Tests for bugs a mutation check planted that every other test let through (issue #39 item 6):
the attention sinks rule, and a zoo's coverage over models that keep ops outside the vocabulary.
Each test here fails with its bug planted (the commit that added it says how it was checked)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphkit
from graphkit.datasets import zoo as zoo_module
from graphkit.datasets.zoo import ZOOS, Zoo, generate_zoo
from graphkit.families import build_model


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation as transformers writes it: a ``cat`` of the halves, one negated."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RopeAttention(nn.Module):
    """Causal eager attention with RoPE (a ``cat`` inside the attention) and one learned part:
    talking heads (a linear map across the heads' scores, CaiT's) or a learned sink logit per
    head, concatenated to the scores as one more key (GPT-OSS) or taken from their logsumexp
    after the product with V (Granite: ``sigmoid(logsumexp(scores) - sink)``). Like
    transformers' attention modules it says it is causal (its mask is an additive float, and a
    sink column makes the scores one key wider than the mask, which the tracer cannot read)."""

    is_causal = True

    def __init__(self, learned: str, dim: int = 16, heads: int = 2, tokens: int = 8) -> None:
        super().__init__()
        self.learned, self.heads = learned, heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        half = dim // heads // 2
        angles = torch.outer(torch.arange(tokens).float(), 1.0 / 10000 ** (torch.arange(half).float() / half))
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin(), persistent=False)
        future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
        self.register_buffer("mask", torch.zeros(tokens, tokens).masked_fill(future, float("-inf")), persistent=False)
        if learned == "talking_heads":
            self.mix = nn.Linear(heads, heads)
        else:
            self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        q, k = (t * self.cos + rotate_half(t) * self.sin for t in (q, k))
        scores = q @ k.transpose(-2, -1) / (dim // self.heads) ** 0.5
        if self.learned == "talking_heads":
            scores = self.mix(scores.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        scores = scores + self.mask
        if self.learned == "concatenated_sink":
            sink = self.sinks.reshape(1, -1, 1, 1).expand(batch, -1, tokens, 1)
            out = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1] @ v
        else:
            out = scores.softmax(-1) @ v
        if self.learned == "logsumexp_sink":
            out = out * torch.sigmoid(torch.logsumexp(scores, dim=-1) - self.sinks.view(1, -1, 1)).unsqueeze(-1)
        return self.out(out.transpose(1, 2).flatten(2))


class Block(nn.Module):
    def __init__(self, learned: str) -> None:
        super().__init__()
        self.attn = RopeAttention(learned)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


@pytest.mark.parametrize(
    ("learned", "sinks"), [("talking_heads", False), ("concatenated_sink", True), ("logsumexp_sink", True)]
)
def test_only_a_learned_logit_beside_the_keys_is_a_sink(learned, sinks):
    """``sinks`` is read off a parameter that meets the scores at a ``cat`` or a ``logsumexp``,
    not off any parameter and any ``cat`` in the attention: RoPE's ``cat`` with talking heads' map
    is no sink."""
    graph = graphkit.trace(Block(learned), torch.randn(1, 8, 16))
    (attention,) = [n for n in graph.nodes if n.op == "attention"]
    assert attention.attrs["rope"] and attention.attrs["causal"]
    assert bool(attention.attrs.get("sinks")) is sinks
    assert bool(attention.attrs.get("talking_heads")) is (learned == "talking_heads")
    owned = {"talking_heads": {"attn.mix.weight", "attn.mix.bias"}}.get(learned, {"attn.sinks"})
    assert set(attention.params) == owned


class OffVocabularyHead(nn.Module):
    """A head that ends in an op graphkit has no name for (``other:aten.special_erfinv``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.erfinv(torch.tanh(x) * 0.5)


def _one_model_off_the_vocabulary(config, device="meta"):
    model = build_model({"family": "timm", "model": "test_vit"}, device)
    if config["model"] == "off_vocabulary":
        model.head = nn.Sequential(model.head, OffVocabularyHead())
    return model


@pytest.mark.slow
def test_a_zoo_model_with_an_op_outside_the_vocabulary_is_not_counted_as_clean(tmp_path, monkeypatch):
    """Coverage is the share of the models the library builds that trace with no ``other:`` op: a
    model that traces with one is a record, listed in the report with its ops, and not clean."""
    names = ["off_vocabulary", "test_vit"]
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: names))
    monkeypatch.setattr(zoo_module, "build_model", _one_model_off_the_vocabulary)
    result = generate_zoo("zoo-test", tmp_path / "z")
    report = result.report
    assert (report["traced"], report["clean"], report["records"], result.coverage) == (2, 1, 2, 0.5)
    assert report["other_ops"] == [{"model": "off_vocabulary", "ops": ["other:aten.special_erfinv"]}]
    text = " ".join((tmp_path / "z" / "report.md").read_text().split())
    assert "- with no `other:` op: 1 (50.0% of those built)" in text
    assert "## Traced with ops outside the vocabulary - `off_vocabulary`: other:aten.special_erfinv" in text

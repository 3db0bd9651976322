"""Attention in every form is one attention node with its attributes: talking heads and class
attention (CaiT), a learned latent query (SigLIP's pooling head), shifted windows (Swin, with
its roll and pad ops)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_golden_fingerprint, meta, timm_vit
from torch import nn

import graphkit

SVG = "{http://www.w3.org/2000/svg}"


def attention(graph):
    return [n for n in graph.nodes if n.op == "attention"]


def flags(node, names=("talking_heads", "class_attention", "latent_query", "shifted")):
    return {name for name in names if node.attrs.get(name)}


def assert_faithful(graph, model):
    """No op outside the vocabulary, and every parameter owned by exactly one node."""
    assert not [n.op for n in graph.nodes if n.op.startswith("other:")]
    graph.validate({k: tuple(p.shape) for k, p in model.named_parameters()})


def cait(depth=24, **kwargs):
    return timm_vit("cait_xxs24_224", img_size=32, num_classes=10, depth=depth, **kwargs)


def swin(window=7, depths=(2, 2)):
    return timm_vit(
        "swin_tiny_patch4_window7_224",
        img_size=56,
        window_size=window,
        depths=depths,
        num_heads=(2, 4)[: len(depths)],
        embed_dim=32,
        num_classes=10,
    )


def fused(model, on: bool):
    """timm's attention modules switched to SDPA (on) or to their eager softmax(q k^T) v: CaiT's
    class attention and SigLIP use SDPA by default, Swin the eager form."""
    modules = [m for m in model.modules() if hasattr(m, "fused_attn")]
    assert modules and any(m.fused_attn != on for m in modules)  # the switch changes something
    for module in modules:
        module.fused_attn = on
    return model


@pytest.mark.slow
def test_a_24_block_cait_has_26_attention_nodes_owning_the_talking_heads_maps():
    model = cait()
    graph = graphkit.trace(model)
    nodes = attention(graph)
    assert len(nodes) == 26
    talking, classes = nodes[:24], nodes[24:]
    assert all(flags(n) == {"talking_heads"} for n in talking)
    assert all(flags(n) == {"class_attention"} and not n.params for n in classes)
    assert set(talking[5].params) == {
        f"blocks.5.attn.{m}.{p}" for m in ("proj_l", "proj_w") for p in ("weight", "bias")
    }
    assert {(n.attrs["heads"], n.attrs["kv_heads"], n.attrs["head_dim"], n.attrs["causal"]) for n in nodes} == {
        (4, 4, 48, False)
    }
    assert "softmax" not in graph.op_counts()
    # the first class-attention block adds the class token parameter back as its residual: an
    # add reusing the parameter the class_token node owns, not a positional embedding
    residual = next(n for n in graph.nodes if n.name == "blocks_token_only.0.add")
    assert (
        residual.op == "add" and residual.attrs == {"tied": ["cls_token"]} and graph.op_counts()["pos_embedding"] == 1
    )
    assert_faithful(graph, model)


@pytest.mark.slow
def test_cait_folds_to_the_full_graph_and_eager_class_attention_matches_sdpa():
    folded = graphkit.trace(cait(depth=4))
    assert_golden_fingerprint("cait_depth4", folded)
    assert folded.fingerprint() == graphkit.trace(cait(depth=4)).fingerprint()  # stable
    assert folded.fingerprint() == graphkit.trace(cait(depth=4), fold_repeats=False).fingerprint()
    assert folded.fingerprint() == graphkit.trace(fused(cait(depth=4), False)).fingerprint()


def test_a_pooling_heads_learned_query_is_a_latent_query_not_class_attention():
    """SigLIP's "map" head: one learned query attends over all tokens. Fewer queries than keys
    as in class attention, but the query comes from a parameter, not from the tokens."""
    for model in (
        timm_vit("vit_base_patch16_siglip_224", depth=2),
        fused(timm_vit("vit_base_patch16_siglip_224", depth=2), False),
    ):
        graph = graphkit.trace(model)
        pool = [n for n in attention(graph) if n.module == "attn_pool"]
        assert [flags(n) for n in attention(graph)] == [set(), set(), {"latent_query"}] and len(pool) == 1
        assert_faithful(graph, model)


class FewerQueries(nn.Module):
    """Attention with fewer queries than keys: the first token's (class attention), every other
    token's (LeViT's downsampling attention) or three tokens of another stream (cross-attention)."""

    def __init__(self, queries: str, dim=16, heads=2):
        super().__init__()
        self.queries, self.heads = queries, heads
        self.encoder, self.decoder = nn.Linear(dim, dim), nn.Linear(dim, dim) if queries == "cross" else None
        self.q, self.kv, self.out = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)

    def forward(self, source, target):
        def split(t):
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        tokens = self.encoder(source)
        if self.queries == "cross":
            picked = self.decoder(target)
        else:
            picked = tokens[:, :1] if self.queries == "first" else tokens[:, ::2]
        k, v = self.kv(tokens).chunk(2, dim=-1)
        x = F.scaled_dot_product_attention(split(self.q(picked)), split(k), split(v))
        return self.out(x.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("queries,expected", [("first", {"class_attention"}), ("strided", set()), ("cross", set())])
def test_class_attention_is_one_query_from_the_tokens_it_attends_to(queries, expected):
    graph = graphkit.trace(FewerQueries(queries), (torch.randn(2, 5, 16), torch.randn(2, 3, 16)))
    (node,) = attention(graph)
    assert flags(node) == expected and node.attrs["heads"] == 2


@pytest.mark.slow
def test_swin_windows_shifts_and_rolls():
    model = swin()
    graph = graphkit.trace(model)
    nodes = attention(graph)
    assert [n.attrs["window"] for n in nodes] == [[7, 7]] * 4
    # stage 1 (7x7 tokens) is one window: timm shifts nothing there
    assert [flags(n) for n in nodes] == [set(), {"shifted"}, set(), set()]
    rolls = [n for n in graph.nodes if n.op == "roll"]
    assert [(n.module, n.attrs) for n in rolls] == [
        ("layers.0.blocks.1", {"shifts": [-3, -3]}),
        ("layers.0.blocks.1", {"shifts": [3, 3]}),
    ]
    assert "pad" not in graph.op_counts()  # 14 and 7 tokens need no padding to windows of 7: F.pad by zeros
    assert_faithful(graph, model)
    assert_golden_fingerprint("swin", graph)
    assert graph.fingerprint() == graphkit.trace(swin(), fold_repeats=False).fingerprint()
    assert graph.fingerprint() == graphkit.trace(fused(swin(), True)).fingerprint()
    assert [row["window"] for row in graph.attention_layout()] == [[7, 7], [7, 7]]
    assert "window 7×7" in graph.summary()


def test_swin_pads_a_grid_that_is_not_a_multiple_of_its_window():
    model = swin(window=4)
    graph = graphkit.trace(model)
    pads = [n.attrs["pad"] for n in graph.nodes if n.op == "pad"]
    assert pads == [[0, 0, 0, 2, 0, 2]] * 2 + [[0, 0, 0, 1, 0, 1]] * 2  # 14 -> 16, 7 -> 8
    assert [n.attrs["window"] for n in attention(graph)] == [[4, 4]] * 4
    assert [flags(n) for n in attention(graph)] == [set(), {"shifted"}] * 2
    assert_faithful(graph, model)


@pytest.mark.slow
def test_hugging_face_swin_keeps_its_window_on_the_block():
    from transformers import SwinConfig, SwinModel

    model = meta(
        lambda: SwinModel(SwinConfig(image_size=56, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=7))
    )
    graph = graphkit.trace(model)
    nodes = attention(graph)
    assert [n.attrs["window"] for n in nodes] == [[7, 7]] * 4
    # the second stage's block keeps shift_size 3 but drops the shift at forward time
    assert [flags(n) for n in nodes] == [set(), {"shifted"}, set(), set()]
    # its pooler, nn.AdaptiveAvgPool1d(1) over (batch, channels, tokens), is a global average pool
    assert [(n.name, n.attrs) for n in graph.nodes if n.op == "mean_pool"] == [("pooler.mean_pool", {"dim": [2]})]
    assert_faithful(graph, model)


def test_a_window_size_that_is_not_the_keys_seen_is_no_window():
    """BEiT's attention has ``window_size`` (14, 14): its patch grid, for a relative-position
    table; its queries see all 197 tokens."""
    graph = graphkit.trace(timm_vit("beit_base_patch16_224", depth=2))
    assert [n.attrs["window"] for n in attention(graph)] == [None, None]


class Pads(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode, self.fc = mode, nn.Linear(6, 6)

    def forward(self, x):
        x = F.pad(x, (0, 0))  # by nothing: no node
        return self.fc(F.pad(x, (1, 1), mode=self.mode)[..., :6])


def test_zero_padding_is_the_pad_op_and_other_padding_is_not():
    graph = graphkit.trace(Pads("constant"), torch.randn(2, 3, 6))
    assert [(n.op, n.attrs) for n in graph.nodes[1:-2]] == [("pad", {"pad": [1, 1]})]
    assert [n.op for n in graphkit.trace(Pads("reflect"), torch.randn(2, 3, 6)).nodes[1:-2]] == ["other:aten.pad"]


@pytest.mark.slow
def test_drawings_show_the_attention_forms(tmp_path):
    texts = []
    for name, model in (("cait", cait(depth=2)), ("swin", swin())):
        drawing = graphkit.trace(model).draw(tmp_path / f"{name}.svg")
        texts += [t.text for t in ET.parse(drawing.path).getroot().iter(f"{SVG}text")]
    for text in ("talking-heads", "class-attn", "window 7×7", "shifted window 7×7", "shifts -3, -3"):
        assert text in texts


@pytest.mark.slow
def test_a_parameter_reparametrised_by_ops_on_parameters_alone_belongs_to_its_consumer():
    """SwinV2 clamps and exponentiates its attention's logit scale and (as BEiT and EVA do)
    assembles the qkv bias as cat(q_bias, zeros, v_bias): neither makes a node of its own."""
    model = timm_vit(
        "swinv2_tiny_window8_256",
        img_size=64,
        window_size=8,
        depths=(2, 2),
        num_heads=(2, 4),
        embed_dim=32,
        num_classes=10,
    )
    graph = graphkit.trace(model)
    by_name = {n.name: n for n in graph.nodes}
    attn = by_name["layers.0.blocks.1.attn.attention"]
    assert set(attn.params) == {"layers.0.blocks.1.attn.logit_scale"}
    assert flags(attn) == {"shifted"} and attn.attrs["window"] == [8, 8]
    qkv = by_name["layers.0.blocks.1.attn.linear"]
    assert set(qkv.params) == {f"layers.0.blocks.1.attn.{p}" for p in ("q_bias", "v_bias", "qkv.weight")}
    assert "class_token" not in graph.op_counts()
    assert_faithful(graph, model)

"""What timm's hierarchical and hybrid ViTs added to the tracer (vocabulary v3): each rule on the
smallest model that needs it, traced on meta, with its graph pinned (tests/golden_fingerprints.json)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import assert_golden_fingerprint, timm_vit

import graphkit

pytestmark = pytest.mark.slow


def traced(name: str, **kwargs):
    graph = graphkit.trace(timm_vit(name, **kwargs))
    assert not [n.op for n in graph.nodes if n.op.startswith("other:")], name
    return graph


def nodes(graph, op: str):
    return [n for n in graph.nodes if n.op == op]


def test_batch_norm_is_a_node_owning_its_scale_and_shift():
    """LeViT normalises after every linear layer with BatchNorm1d; ``x.reshape_as(y)`` moves data."""
    graph = traced("levit_128s")
    norms = nodes(graph, "batch_norm")
    assert len(norms) == 52 and all(sorted(n.params) == [f"{n.module}.bias", f"{n.module}.weight"] for n in norms)
    assert_golden_fingerprint("levit_128s", graph)


def test_windowed_pools_keep_their_kernel_and_stride():
    graph = traced("coatnet_nano_rw_224")  # CoAtNet downsamples its shortcut by average pooling
    pools = nodes(graph, "avg_pool")
    assert pools and all(p.attrs["kernel"] == [2, 2] and p.attrs["stride"] == [2, 2] for p in pools)
    assert_golden_fingerprint("coatnet_nano_rw_224", graph)
    graph = traced("gcvit_xxtiny")  # GC ViT's feature extractor max-pools
    assert {tuple(p.attrs["kernel"]) for p in nodes(graph, "max_pool")} == {(3, 3)}


def test_a_max_over_mask_units_is_a_max_pool_over_that_dim():
    graph = traced("hiera_tiny_224")
    pools = nodes(graph, "max_pool")
    assert len(pools) == 3 and all(list(p.attrs) == ["dim"] for p in pools)
    assert_golden_fingerprint("hiera_tiny_224", graph)


def test_crossvit_resizes_its_grid_and_stacks_its_branches():
    graph = traced("crossvit_tiny_240")
    assert [n.attrs for n in nodes(graph, "interpolate")] == [{"mode": "bicubic"}]
    assert len(nodes(graph, "attention")) == 21
    assert_golden_fingerprint("crossvit_tiny_240", graph)


def test_sliding_window_patches_unfold_and_fold():
    graph = traced("volo_d1_224")  # outlook attention: im2col, weighting, col2im
    counts = Counter(n.op for n in graph.nodes)
    assert counts["unfold"] == counts["fold"] == 4
    assert all(n.attrs["kernel"] == [3, 3] for n in nodes(graph, "fold"))
    assert_golden_fingerprint("volo_d1_224", graph)


def test_pool_minus_input_and_l2_normalisation_are_vocabulary_ops():
    """PoolFormer's token mixer (EfficientFormer) is ``pool(x) - x``; SwiftFormer normalises by a
    clamped L2 norm and pools its global query by a sum."""
    graph = traced("efficientformer_l1")
    assert len(nodes(graph, "sub")) == 14 and len(nodes(graph, "avg_pool")) == 14
    graph = traced("swiftformer_xs")
    counts = Counter(n.op for n in graph.nodes)
    assert counts["norm"] == counts["clamp"] == counts["div"] == 12 and counts["sum_pool"] == 4
    assert_golden_fingerprint("swiftformer_xs", graph)


def test_factorised_attention_is_a_product_of_activations():
    """CoaT's factorised attention never forms the scores: ``q (k^T v)``, two matmuls of activations."""
    graph = traced("coat_lite_tiny")
    assert len(nodes(graph, "matmul")) == 16 and not nodes(graph, "attention")


@pytest.mark.parametrize(
    ("name", "attention", "options"),
    # SAM at 448 px: its 1,024 px (64 x 64 tokens) cost a minute here, and the zoo's coverage pin traces it
    [("xcit_nano_12_p16_224", 14, {}), ("mvitv2_tiny", 10, {}), ("samvit_base_patch16", 12, {"img_size": 448})],
)
def test_a_bias_computed_from_activations_is_not_a_mask(name, attention, options):
    """XCiT's normalised channels, MViTv2's and SAM's relative positions read off the query: terms
    of the scores computed from activations hide no key by position. Once refused ("cannot tell
    whether the attention is causal"), now bidirectional, on meta as on the CPU."""
    graph = traced(name, **options)
    found = nodes(graph, "attention")
    assert len(found) == attention and not any(n.attrs["causal"] for n in found)


@pytest.mark.parametrize("name", ["efficientvit_m0", "twins_svt_small"])
def test_a_stack_zipped_with_another_list_is_traced_whole(name):
    """EfficientViT (MSRA) zips its heads' projections with their convolutions, Twins its blocks with
    its position encoders: shortening one list breaks the forward, so nothing is folded."""
    graph = traced(name)
    assert graph == graphkit.trace(timm_vit(name), fold_repeats=False)
    if name == "efficientvit_m0":  # each head of its cascade is one attention, V on the left (v @ probs.mT)
        expected = [(1, 16)] * 4 + [(1, 32)] * 8 + [(1, 48)] * 12  # V of 1, 2, 3 key widths by stage
        assert [(n.attrs["heads"], n.attrs["head_dim"]) for n in nodes(graph, "attention")] == expected


def test_attention_sinks_are_the_attentions_own_parameter():
    """GPT-OSS concatenates a learned sink logit per head to the scores before the softmax and drops
    its column after: one attention node owning ``sinks`` (attr ``sinks``), not a class token."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gpt_oss",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=100,
        layer_types=["sliding_attention", "full_attention"],
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    graph = graphkit.trace(model)
    attention = nodes(graph, "attention")
    assert not nodes(graph, "class_token") and len(attention) == 2
    assert all(list(n.params) == [f"{n.module}.sinks"] and n.attrs["sinks"] and n.attrs["causal"] for n in attention)
    assert [n.attrs["window"] for n in attention] == [128, None]
    assert_golden_fingerprint("gpt_oss_sinks", graph)

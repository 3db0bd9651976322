"""GQA and the key-driven variants: allocation, DGQA state, PGQA noise, conversion, graphs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import graphkit
from graphkit.attention import (
    ConvertError,
    GroupedQueryAttention,
    allocate_queries,
    convert,
    core,
    kdgqa_index,
    mean_pool_heads,
    query_groups,
)
from graphkit.families import build_model


@pytest.mark.parametrize("groups,queries", [(4, 12), (6, 12), (3, 24), (1, 12), (12, 12)])
@pytest.mark.parametrize("allow_empty", [False, True])
def test_allocation_always_sums_to_the_query_heads(groups, queries, allow_empty):
    generator = torch.Generator().manual_seed(groups * queries)
    for importance in [torch.rand(groups, generator=generator) * 10, torch.ones(groups), torch.zeros(groups)]:
        counts = allocate_queries(importance, queries, allow_empty=allow_empty)
        assert counts.sum() == queries and (counts >= (0 if allow_empty else 1)).all()
        assert not torch.isnan(importance).any()
        assert query_groups(counts, queries).tolist() == sorted(query_groups(counts, queries).tolist())  # left to right


def test_allocation_follows_the_norms():
    assert allocate_queries(torch.tensor([1.0, 2.0, 3.0, 4.0]), 12, allow_empty=True).tolist() == [0, 2, 4, 6]
    assert allocate_queries(torch.tensor([1.0, 2.0, 3.0, 4.0]), 12).tolist() == [1, 2, 4, 5]
    assert allocate_queries(torch.ones(4), 12).tolist() == [3, 3, 3, 3]  # all equal: uniform, no NaN
    with pytest.raises(ValueError, match="cannot give each of 4 groups one"):
        allocate_queries(torch.ones(4), 3)


def test_mean_pool_matches_a_hand_computation():
    weight = torch.arange(4 * 2 * 3, dtype=torch.float).reshape(4 * 2, 3)  # 4 heads of 2 rows
    pooled = mean_pool_heads(weight, heads=4, kv_heads=2)
    assert torch.equal(pooled[:2], (weight[0:2] + weight[2:4]) / 2)
    assert torch.equal(pooled[2:], (weight[4:6] + weight[6:8]) / 2)


def qkv(groups=4, heads=12):
    torch.manual_seed(0)
    return (
        torch.randn(2, heads, 5, 8, requires_grad=True),
        torch.randn(2, groups, 5, 8, requires_grad=True),
        torch.randn(2, groups, 5, 8, requires_grad=True),
    )


def test_gqa_equals_materialised_repeat():
    q, k, v = qkv()
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True)
    assert torch.allclose(GroupedQueryAttention(12, 4)(q, k, v, is_causal=True), ref, atol=1e-6)


@pytest.mark.parametrize("path", ["enable_gqa", "repeat"])
def test_both_gqa_paths_agree(path):
    q, k, v = qkv()
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    expected = GroupedQueryAttention(12, 4, path="enable_gqa")(q, k, v, attn_mask=mask)
    assert torch.allclose(GroupedQueryAttention(12, 4, path=path)(q, k, v, attn_mask=mask), expected, atol=1e-6)


def test_fastest_gqa_path_measures_once_per_shape():

    q, k, v = (t.detach() for t in qkv())
    core._FASTEST.clear()
    first = core.fastest_gqa_path(q, k, v, is_causal=True, repeats=2)
    assert first in ("enable_gqa", "repeat") and len(core._FASTEST) == 1
    assert core.fastest_gqa_path(q, k, v, is_causal=True) == first and len(core._FASTEST) == 1
    core.fastest_gqa_path(q[:, :, :3], k[:, :, :3], v[:, :, :3], is_causal=True, repeats=2)
    assert len(core._FASTEST) == 2
    core._FASTEST.clear()
    # auto keeps enable_gqa on CPU (measured faster there) and never times CPU tensors
    GroupedQueryAttention(12, 4)(q, k, v)
    assert core._FASTEST == {}
    with pytest.raises(ValueError, match="path must be one of auto, enable_gqa, repeat, got 'fast'"):
        GroupedQueryAttention(12, 4, path="fast")


@pytest.mark.parametrize("variant", ["gqa", "kdgqa", "dgqa", "pgqa"])
def test_gradients_flow_through_every_variant(variant):
    q, k, v = qkv()
    GroupedQueryAttention(12, 4, variant).train()(q, k, v).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_dgqa_updates_only_at_window_boundaries_and_never_in_eval():
    layer = GroupedQueryAttention(12, 4, "dgqa", window=3).train()
    seen = []
    for step in range(7):
        q, k, v = qkv()
        k = k * torch.tensor([1.0, 2.0, 3.0, 4.0 + step]).view(1, 4, 1, 1)
        layer(q, k, v)
        seen.append(layer.counts.tolist())
    assert seen[0] == seen[1] == seen[2] and seen[3] == seen[4] == seen[5]
    assert seen[0] != [3, 3, 3, 3] and sum(seen[6]) == 12
    layer.eval()
    frozen = layer.counts.clone()
    q, k, v = qkv()
    layer(q, k * 100, v)
    assert torch.equal(layer.counts, frozen) and layer.step == 7


@pytest.mark.parametrize("evolution", ["ema", "difference"])
def test_dgqa_state_dict_reproduces_predictions(evolution):
    layer = GroupedQueryAttention(12, 4, "dgqa", window=2, evolution=evolution).train()
    for scale in (1.0, 3.0, 0.5):
        q, k, v = qkv()
        layer(q, k * torch.tensor([scale, 1.0, 2.0, 0.1]).view(1, 4, 1, 1), v)
    restored = GroupedQueryAttention(12, 4, "dgqa", window=2, evolution=evolution)
    restored.load_state_dict(layer.state_dict())
    q, k, v = qkv()
    assert torch.equal(restored.eval()(q, k, v), layer.eval()(q, k, v))


def test_pgqa_perturbs_only_in_training():
    q, k, v = qkv()
    layer = GroupedQueryAttention(12, 4, "pgqa")
    plain = GroupedQueryAttention(12, 4, "gqa")(q, k, v)
    assert torch.equal(layer.eval()(q, k, v), plain)
    assert not torch.allclose(layer.train()(q, k, v), plain)
    assert not torch.allclose(GroupedQueryAttention(12, 4, "pgqa", perturb_in_eval=True).eval()(q, k, v), plain)


FAMILIES = {
    "vit": dict(family="vit", num_layers=3, hidden=48, heads=6),
    "gpt2": dict(family="gpt2", num_layers=3, hidden=48, heads=6, vocab_size=50, context=16),
    "llama": dict(family="llama", num_layers=3, hidden=48, heads=6, vocab_size=50, context=16),
    "mistral": dict(family="llama", num_layers=3, hidden=48, heads=6, vocab_size=50, context=16, sliding_window=3),
}


def run(model, family):
    torch.manual_seed(3)
    if family == "vit":
        return model(torch.randn(2, 3, 32, 32))
    return model(torch.randint(0, 50, (2, 7)), use_cache=False).logits


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.manual_seed(0)
    return request.param, build_model(FAMILIES[request.param], device="cpu")


@pytest.mark.slow
def test_conversion_at_full_kv_heads_reproduces_the_model(family):
    name, model = family
    converted = convert(copy.deepcopy(model), "gqa")
    assert (run(converted, name) - run(model, name)).abs().max() < 1e-5
    assert not converted.training  # modes are kept


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["gqa", "kdgqa", "dgqa", "pgqa"])
def test_graphs_see_the_variant(family, variant):
    name, model = family
    original = graphkit.trace(model)
    graph = graphkit.trace(convert(copy.deepcopy(model), variant, kv_heads=2))
    before = next(n.attrs for n in original.nodes if n.op == "attention")
    attention = [n.attrs for n in graph.nodes if n.op == "attention"]
    assert len(attention) == 3 and all(a == {**before, "kv_heads": 2, "variant": variant} for a in attention)
    assert graph.op_counts() == original.op_counts()  # rotary, projections and residuals where they were
    assert graph.num_params < original.num_params  # K/V projections shrank


def test_converted_dgqa_checkpoint_reproduces_predictions(family):
    name, model = family
    trained = convert(copy.deepcopy(model), "dgqa", kv_heads=2, window=2).train()
    for _ in range(3):
        run(trained, name)
    restored = convert(copy.deepcopy(model), "dgqa", kv_heads=2, window=2)
    restored.load_state_dict(trained.state_dict())
    assert torch.equal(run(restored.eval(), name), run(trained.eval(), name))


def test_conversion_errors(family):
    name, model = family
    with pytest.raises(ConvertError, match="unknown attention variant 'mqa'; accepted: gqa, kdgqa, dgqa, pgqa"):
        convert(copy.deepcopy(model), "mqa")
    untouched = copy.deepcopy(model)
    with pytest.raises(ConvertError, match=r"kv_heads 4 does not divide the 6 heads of module '.*\.0\..*'"):
        convert(untouched, "gqa", kv_heads=4)
    assert graphkit.trace(untouched) == graphkit.trace(model)  # checked before anything changed


def test_unknown_attention_modules_are_named():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.MultiheadAttention(8, 2))
    with pytest.raises(
        ConvertError,
        match=r"module '1' \(torch.nn.modules.activation.MultiheadAttention\) "
        r"is an attention graphkit cannot convert yet",
    ):
        convert(model, "gqa", kv_heads=1)
    with pytest.raises(ConvertError, match="Linear has no attention module"):
        convert(torch.nn.Linear(2, 2))


def test_pgqa_subtracts_noise_of_each_groups_statistics_off_the_diagonal():
    """Eq. 9: per group, noise standardised to the group output's mean and spread, zero on each
    head's diagonal (the mask is cached per shape: a second call draws new noise, same rule)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 12, 32, 32), torch.randn(4, 3, 32, 32) * 3, torch.randn(4, 3, 32, 32) * 3 + 1
    plain = GroupedQueryAttention(12, 3, "gqa")(q, k, v)
    layer = GroupedQueryAttention(12, 3, "pgqa", perturb_in_eval=True).eval()
    for _ in range(2):
        noise = (plain - layer(q, k, v)).reshape(4, 3, 4, 32, 32)
        diagonal = torch.eye(32, dtype=torch.bool)
        assert (noise[..., diagonal] == 0).all() and (noise[..., ~diagonal] != 0).all()
        grouped = plain.reshape(4, 3, 4, 32, 32)
        for g in range(3):
            off = noise[:, g][..., ~diagonal]
            assert torch.allclose(off.mean(), grouped[:, g].mean(), atol=0.02 * grouped[:, g].std())
            assert torch.allclose(off.std(), grouped[:, g].std(), rtol=0.02)


def test_kdgqa_allocation_compiles_into_one_graph_and_gives_the_eager_index(monkeypatch):
    """On a GPU the allocation runs compiled (kdgqa_index(fused=True)); dynamo must capture it
    whole (fullgraph) and give the eager index. The eager backend checks the capture on any machine."""

    compiled = torch.compile(core._allocation_index, fullgraph=True, dynamic=False, backend="eager")
    monkeypatch.setitem(core._COMPILED, "index", compiled)
    generator = torch.Generator().manual_seed(0)
    for groups, heads, allow_empty in [(4, 12, False), (6, 12, True), (4, 12, False)]:
        norms = torch.rand(groups, generator=generator) * 5
        assert torch.equal(kdgqa_index(norms, heads, allow_empty, fused=True), kdgqa_index(norms, heads, allow_empty))


def test_kdgqa_falls_back_to_eager_once_when_compiling_fails(monkeypatch):

    def broken(*args):
        raise RuntimeError("no compiler for this device")

    monkeypatch.setitem(core._COMPILED, "index", broken)
    monkeypatch.delitem(core._COMPILED, "failed", raising=False)
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0])
    with pytest.warns(RuntimeWarning, match="KDGQA: compiling the head allocation failed .*no compiler"):
        index = kdgqa_index(norms, 12, fused=True)
    assert index.tolist() == query_groups(torch.tensor([1, 2, 4, 5]), 12).tolist()
    assert core._COMPILED["failed"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later calls go straight to the eager path
        assert torch.equal(kdgqa_index(norms, 12, fused=True), index)
    monkeypatch.delitem(core._COMPILED, "failed")

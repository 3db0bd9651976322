"""Which K/V heads a conversion pools together: mean (neighbours), keynorm and similarity (measured
on calibration inputs), for every family convert handles."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from graphkit.attention import ConvertError, convert, mean_pool_heads
from graphkit.attention import grouping as grouping_module
from graphkit.attention.convert import conversion_metadata
from graphkit.attention.grouping import (
    Calibration,
    attention_error,
    choose_groups,
    contiguous_groups,
    keynorm_groups,
    permute_heads,
    pool_heads,
    query_order,
    search_groups,
    similarity_groups,
)
from graphkit.families import build_model

FAMILIES = {
    "vit": dict(family="vit", num_layers=2, hidden=48, heads=4),
    "gpt2": dict(family="gpt2", num_layers=2, hidden=48, heads=4, vocab_size=50, context=16),
    "llama": dict(family="llama", num_layers=2, hidden=48, heads=4, vocab_size=50, context=16),
    "llama-gqa": dict(family="llama", num_layers=2, hidden=64, heads=8, kv_heads=4, vocab_size=50, context=16),
}


def inputs(family: str, seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    if family == "vit":
        return torch.randn(2, 3, 32, 32, generator=generator)
    return torch.randint(0, 50, (2, 9), generator=generator)


def run(model, family: str) -> torch.Tensor:
    with torch.no_grad():
        out = model(inputs(family)) if family == "vit" else model(inputs(family), use_cache=False).logits
    return out


def test_pooling_neighbours_is_mean_pooling_and_permuting_heads_is_undone_by_its_inverse():
    weight = torch.randn(6 * 5, 7)
    assert torch.equal(pool_heads(weight, contiguous_groups(6, 3)), mean_pool_heads(weight, 6, 3))
    order = [4, 0, 5, 2, 1, 3]
    back = [order.index(h) for h in range(6)]
    assert torch.equal(permute_heads(permute_heads(weight, order), back), weight)
    assert torch.equal(permute_heads(weight.t(), order, dim=1), permute_heads(weight, order).t())
    assert query_order([[1, 3], [0, 2]], 1) == [1, 3, 0, 2]
    assert query_order([[1], [0]], 2) == [2, 3, 0, 1]  # a GQA model's query heads follow their K/V head


def test_similarity_pools_the_heads_that_compute_alike_whatever_their_scale_and_offset():
    """Head 4 is head 0 at a tenth of its scale, head 5 head 1's; head 6 is head 2 shifted by 5,
    head 7 head 3's. Four groups of eight heads, so no pair is forced: without the per-head
    scaling the two small heads pair up, without the centring the two shifted ones do."""
    generator = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 64, 8, 8, generator=generator)
    for head, of, scale, shift in ((4, 0, 0.1, 0.0), (5, 1, 0.1, 0.0), (6, 2, 1.0, 5.0), (7, 3, 1.0, 5.0)):
        for x in (k, v):
            x[:, head] = scale * (x[:, of] + 0.05 * torch.randn(64, 8, generator=generator)) + shift
    assert similarity_groups(k, v, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert similarity_groups(k, v, 8) == [[h] for h in range(8)]  # as many groups as heads: one each


def test_similarity_grows_a_group_past_its_first_pair_by_the_heads_closest_to_it():
    """Six heads in two groups of three: the even heads are noisy copies of one head, the odd ones
    of another, so each group takes the third head closest to its first pair."""
    generator = torch.Generator().manual_seed(6)
    base_k, base_v = torch.randn(2, 64, 2, 8, generator=generator)
    k = base_k.repeat(1, 3, 1) + 0.1 * torch.randn(64, 6, 8, generator=generator)
    v = base_v.repeat(1, 3, 1) + 0.1 * torch.randn(64, 6, 8, generator=generator)
    assert similarity_groups(k, v, 2) == [[0, 2, 4], [1, 3, 5]]
    assert contiguous_groups(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_keynorm_pools_heads_of_similar_key_norms():
    k = torch.randn(32, 6, 8) * torch.tensor([1.0, 9.0, 2.0, 8.0, 3.0, 7.0]).view(1, 6, 1)
    assert keynorm_groups(k, 3) == [[0, 2], [1, 3], [4, 5]]
    # heads whose keys have the same norm keep their order: neighbours, on 64 heads too, where
    # torch's default sort on the CPU no longer keeps the order of ties
    assert keynorm_groups(torch.ones(4, 64, 8), 16) == contiguous_groups(64, 16)
    groups = choose_groups("keynorm", 6, 2, [Calibration(k.view(4, 8, 6, 8), k.view(4, 8, 6, 8), k.view(4, 8, 6, 8))])
    assert sorted(h for g in groups for h in g) == list(range(6)) and all(len(g) == 3 for g in groups)


def pairings(heads: list[int]) -> list[list[list[int]]]:
    """Every way to split ``heads`` into pairs."""
    if not heads:
        return [[]]
    first, rest = heads[0], heads[1:]
    return [[[first, other], *more] for other in rest for more in pairings([h for h in rest if h != other])]


def heads_of_different_scales(causal: bool) -> list[Calibration]:
    """One calibration batch of eight heads whose keys grow from half to twice the scale."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 2, 12, 8, 6, generator=generator)
    return [Calibration(q, k * torch.linspace(0.5, 2.0, 8).view(1, 1, 8, 1), v, causal)]


@pytest.mark.parametrize("causal", [False, True])
def test_search_swaps_heads_until_it_beats_every_grouping_it_starts_from(causal):
    """Eight heads of different scales in four pairs: none of the three starting groupings is the
    best of the 105, and the swaps find it."""
    batches = heads_of_different_scales(causal)
    searched = search_groups(batches, 4)
    best = min(pairings(list(range(8))), key=lambda groups: attention_error(batches, groups))
    assert searched == sorted(best)
    for grouping in ("mean", "keynorm", "similarity"):
        assert attention_error(batches, searched) < attention_error(batches, choose_groups(grouping, 8, 4, batches))


def test_search_sweeps_until_no_swap_lowers_the_error():
    """Eight heads in two groups of four, where the first sweep of swaps ends short of a grouping
    that no swap improves: search sweeps again until it reaches one."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 2, 8, 8, 4, generator=generator)
    batches = [Calibration(q, k * torch.linspace(0.5, 2.0, 8).view(1, 1, 8, 1), v)]
    first, second = searched = search_groups(batches, 2)
    least = attention_error(batches, searched)
    for i in range(4):
        for j in range(4):
            swapped = [first[:i] + [second[j]] + first[i + 1 :], second[:j] + [first[i]] + second[j + 1 :]]
            assert attention_error(batches, swapped) >= least


def test_search_starts_from_the_best_of_its_three_groupings(monkeypatch):
    """With no sweep of swaps, search returns the starting grouping of least error: similarity's
    here, not mean's neighbours, which come first in sort order."""
    monkeypatch.setattr(grouping_module, "SEARCH_SWEEPS", 0)
    batches = heads_of_different_scales(causal=False)
    starts = [choose_groups(grouping, 8, 4, batches) for grouping in ("mean", "keynorm", "similarity")]
    best = min(starts, key=lambda groups: attention_error(batches, groups))
    assert search_groups(batches, 4) == best == starts[2] != min(starts)


def test_the_error_is_measured_through_the_output_projection():
    """What the layer adds to the stream is the projection of its heads' outputs: tripled by the
    projection, the error is nine times as large; a head whose columns the projection zeroes costs
    nothing, so pooling duplicate head 1 with head 0 is exact where only their columns are kept."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 2, 6, 4, 8, generator=generator)
    k[:, :, 1], v[:, :, 1] = k[:, :, 0], v[:, :, 0]
    groups = [[0, 1], [2, 3]]
    plain = attention_error([Calibration(q, k, v)], groups)
    assert attention_error([Calibration(q, k, v, out_proj=3 * torch.eye(32))], groups) == pytest.approx(9 * plain)
    first_two = torch.zeros(32, 32)
    first_two[:16, :16] = torch.eye(16)
    assert attention_error([Calibration(q, k, v, out_proj=first_two)], groups) < 1e-10 < 1e-3 < plain


def test_a_causal_layer_is_scored_by_the_keys_its_queries_see():
    """Heads 0 and 1 differ only in the last key, which, causally, only the last query sees, and
    that query (all zeros) weighs every key alike over values the two heads share: pooling them is
    exact in a causal layer and not in a bidirectional one."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 2, 6, 4, 8, generator=generator)
    k[:, :-1, 1], v[:, :, 1] = k[:, :-1, 0], v[:, :, 0]
    k[:, :, 3], v[:, :, 3] = k[:, :, 2], v[:, :, 2]
    q[:, -1] = 0
    groups = [[0, 1], [2, 3]]
    assert attention_error([Calibration(q, k, v, causal=True)], groups) < 1e-10
    assert attention_error([Calibration(q, k, v, causal=False)], groups) > 1e-3


def test_the_error_of_a_gqa_layer_reads_each_kv_heads_own_query_heads_and_sums_over_batches():
    """Eight query heads over four K/V heads (two each), of width 4: K/V head 2 duplicates head 0
    and head 3 head 1, so pooling the duplicates is exact only where each K/V head serves its own
    two query heads. Two calibration batches cost what each costs alone, added."""
    generator = torch.Generator().manual_seed(5)
    batches = []
    for _ in range(2):
        q = torch.randn(2, 6, 8, 4, generator=generator)
        k, v = torch.randn(2, 2, 6, 4, 4, generator=generator)
        k[:, :, 2:], v[:, :, 2:] = k[:, :, :2], v[:, :, :2]
        batches.append(Calibration(q, k, v))
    assert attention_error(batches, [[0, 2], [1, 3]]) < 1e-10 < 1e-3 < attention_error(batches, [[0, 1], [2, 3]])
    each = [attention_error([batch], [[0, 1], [2, 3]]) for batch in batches]
    assert attention_error(batches, [[0, 1], [2, 3]]) == pytest.approx(sum(each)) and min(each) > 1e-3


def test_search_finds_duplicates_and_scores_them_exact():
    generator = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 2, 10, 4, 8, generator=generator)
    k[:, :, 3], v[:, :, 3] = k[:, :, 0], v[:, :, 0]
    k[:, :, 2], v[:, :, 2] = k[:, :, 1], v[:, :, 1]
    batches = [Calibration(q, k, v, causal=True)]
    assert search_groups(batches, 2) == [[0, 3], [1, 2]]
    assert attention_error(batches, [[0, 3], [1, 2]]) < 1e-10 < attention_error(batches, [[0, 1], [2, 3]])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.manual_seed(0)
    return request.param, build_model(FAMILIES[request.param], device="cpu").eval()


@pytest.mark.parametrize("grouping", ["keynorm", "similarity", "search"])
def test_the_groups_partition_the_heads_and_go_into_the_metadata(family, grouping):
    name, model = family
    converted = convert(copy.deepcopy(model), "gqa", 2, grouping=grouping, calibration=[inputs(name, 7)])
    metadata = conversion_metadata(converted)
    assert metadata["graphkit_attention"] == "gqa" and metadata["graphkit_kv_heads"] == "2"
    groups = json.loads(metadata["graphkit_groups"])
    assert len(groups) == 2  # one entry per layer, by the path of its attention core
    for layer in groups.values():
        assert sorted(h for g in layer for h in g) == list(range(4)) and [len(g) for g in layer] == [2, 2]
    assert torch.isfinite(run(converted, name)).all()


def duplicate_heads(model, name: str) -> None:
    """Give K/V head 2 head 0's keys and values and head 3 head 1's, in every layer."""
    with torch.no_grad():
        if name == "vit":
            dim = model.blocks[0].attn.qkv.in_features
            for block in model.blocks:
                for tensor in (block.attn.qkv.weight, block.attn.qkv.bias):
                    for part in (1, 2):  # the k and v rows
                        heads = tensor[part * dim : (part + 1) * dim].view(4, -1, *tensor.shape[1:])
                        heads[2], heads[3] = heads[0].clone(), heads[1].clone()
        elif name == "gpt2":
            dim = model.config.n_embd
            for block in model.transformer.h:
                weight, bias = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: (in, out)
                for part in (1, 2):
                    heads = weight[:, part * dim : (part + 1) * dim].t().reshape(4, -1, dim)
                    heads[2], heads[3] = heads[0].clone(), heads[1].clone()
                    weight[:, part * dim : (part + 1) * dim] = heads.reshape(-1, dim).t()
                    b = bias[part * dim : (part + 1) * dim].view(4, -1)
                    b[2], b[3] = b[0].clone(), b[1].clone()
        else:
            for layer in model.model.layers:
                for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                    heads = proj.weight.view(4, -1, proj.in_features)
                    heads[2], heads[3] = heads[0].clone(), heads[1].clone()


@pytest.mark.parametrize("grouping", ["keynorm", "similarity", "search"])
def test_a_measured_grouping_pools_duplicate_heads_and_reproduces_the_model(family, grouping):
    """K/V head 2 duplicates head 0 and head 3 head 1: each measured grouping pools the duplicates
    (groups that are not neighbours, so the query heads and output columns must be reordered with
    them; in the GQA model two query heads follow each K/V head) and the converted model computes
    what the original did."""
    name, model = family
    model = copy.deepcopy(model)
    duplicate_heads(model, name)
    converted = convert(copy.deepcopy(model), "gqa", 2, grouping=grouping, calibration=[inputs(name, 7)])
    layers = json.loads(conversion_metadata(converted)["graphkit_groups"])
    assert len(layers) == 2 and all(layer == [[0, 2], [1, 3]] for layer in layers.values())
    assert (run(converted, name) - run(model, name)).abs().max() < 1e-5


def test_pooling_neighbours_of_duplicate_heads_changes_the_model(family):
    """The converse of the test above: pooling neighbours (0 with 1) averages heads that differ."""
    name, model = family
    model = copy.deepcopy(model)
    duplicate_heads(model, name)
    assert (run(convert(copy.deepcopy(model), "gqa", 2), name) - run(model, name)).abs().max() > 1e-3


def test_choose_groups_pools_neighbours_without_data_and_names_the_groupings_it_knows():
    assert choose_groups("mean", 8, 4) == contiguous_groups(8, 4)  # mean reads no calibration batch
    with pytest.raises(ValueError, match="unknown grouping 'nearest'; accepted: mean, keynorm, similarity, search"):
        choose_groups("nearest", 8, 4)
    with pytest.raises(ValueError, match="grouping 'similarity' needs the layer's activations on calibration data"):
        choose_groups("similarity", 8, 4)


def test_choose_groups_runs_the_grouping_it_is_named():
    """Six heads of scales 1, 9, 2, 8, 3, 7 where the four groupings pick four different groups."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 2, 12, 6, 6, generator=generator)
    batches = [Calibration(q, k * torch.tensor([1.0, 9.0, 2.0, 8.0, 3.0, 7.0]).view(1, 1, 6, 1), v)]
    flat_k, flat_v = batches[0].k.flatten(0, 1), batches[0].v.flatten(0, 1)
    picked = [choose_groups(grouping, 6, 3, batches) for grouping in ("mean", "keynorm", "similarity", "search")]
    direct = [contiguous_groups(6, 3), keynorm_groups(flat_k, 3), similarity_groups(flat_k, flat_v, 3)]
    assert picked == [*direct, search_groups(batches, 3)]
    assert len({str(groups) for groups in picked}) == 4


def test_bad_groupings_are_refused_before_anything_changes():
    model = build_model(FAMILIES["gpt2"], device="cpu")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ConvertError, match="unknown grouping 'nearest'; accepted: mean, keynorm, similarity, search"):
        convert(model, "gqa", 2, grouping="nearest")
    with pytest.raises(ConvertError, match="grouping similarity reads keys and values on calibration inputs"):
        convert(model, "gqa", 2, grouping="similarity")
    with pytest.raises(ConvertError, match="grouping keynorm applies to gqa; kdgqa allocates its own groups"):
        convert(model, "kdgqa", 2, grouping="keynorm", calibration=[inputs("gpt2")])
    with pytest.raises(ConvertError, match="calibration input: GPT2LMHeadModel cannot run it"):
        convert(model, "gqa", 2, grouping="similarity", calibration=[torch.zeros(2, 3, 8, 8)])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

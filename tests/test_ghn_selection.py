"""Weight selection (graphkit.ghn.selection) and eval-ghn's ``selected`` initialisation."""

from __future__ import annotations

import pytest
import torch

from graphkit.families import build_model
from graphkit.ghn.evaluate import EvalConfig, EvalError
from graphkit.ghn.selection import select_params, uniform_indices

VIT = dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=2, num_classes=10)
GPT2 = dict(family="gpt2", num_layers=2, hidden=32, heads=2, vocab_size=64, context=16)


def test_uniform_selection_takes_evenly_spaced_indices_the_same_way_everywhere():
    assert uniform_indices(8, 4).tolist() == [0, 2, 4, 6]
    assert uniform_indices(6, 4).tolist() == [0, 1, 3, 4]
    assert uniform_indices(3, 5).tolist() == [0, 1, 2]  # a smaller source: all of it


@pytest.mark.parametrize("config", [VIT, GPT2], ids=["vit", "gpt2"])
def test_a_narrower_shallower_target_reads_its_elements_from_the_source(config):
    torch.manual_seed(0)
    source = build_model({**config, "num_layers": 3, "hidden": 64, "heads": 4}, "cpu").state_dict()
    target = build_model(config, "cpu")
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    selected = select_params(source, target)
    assert selected.keys() == before.keys() and all(torch.equal(before[n], p) for n, p in target.named_parameters())
    keep = torch.arange(32) * 2  # 64 -> 32: every other channel, in every parameter
    norm = "blocks.1.norm1.weight" if config is VIT else "transformer.h.1.ln_1.weight"
    assert torch.equal(selected[norm], source[norm][keep])  # block 1 from block 1 (first-N layers)
    fused = "blocks.0.attn.qkv.weight" if config is VIT else "transformer.h.0.attn.c_attn.weight"
    dim = 0 if config is VIT else 1
    want = torch.cat([part.index_select(dim, keep) for part in source[fused].chunk(3, dim)], dim).index_select(
        1 - dim, keep
    )
    assert torch.equal(selected[fused], want)  # Q, K and V each select within their own third


def test_a_wider_deeper_target_keeps_its_own_init_where_the_source_has_nothing():
    torch.manual_seed(0)
    source = build_model(VIT, "cpu").state_dict()
    target = build_model({**VIT, "num_layers": 3, "hidden": 48, "heads": 3}, "cpu")
    selected = select_params(source, target)
    weight = "blocks.0.mlp.fc1.weight"  # (4 * 48, 48) from (4 * 32, 32)
    assert torch.equal(selected[weight][:128, :32], source[weight])
    assert torch.equal(selected[weight][128:], target.get_parameter(weight)[128:].detach())
    third = selected["blocks.0.attn.qkv.weight"].chunk(3)
    assert all(torch.equal(t[:32, :32], s) for t, s in zip(third, source["blocks.0.attn.qkv.weight"].chunk(3)))
    assert torch.equal(selected["blocks.2.norm1.weight"], target.get_parameter("blocks.2.norm1.weight").detach())


@pytest.mark.parametrize(
    ("inits", "message"),
    [
        (("predicted", "orthogonal"), "must name predicted and random"),
        (("predicted", "random", "orthogonal", "chosen"), "accepted: predicted, random, orthogonal, selected"),
        (("predicted", "random", "orthogonal", "random"), "each once"),
    ],
)
def test_eval_refuses_inits_it_cannot_compare(inits, message):
    with pytest.raises(EvalError, match=message):
        EvalConfig(dataset="-", inits=inits)
    with pytest.raises(EvalError, match="select-steps must be an integer >= 1; got 0"):
        EvalConfig(dataset="-", inits=("predicted", "random", "orthogonal", "selected"), select_steps=0)

"""MHA -> MLA by conversion (graphkit.attention.mla): the latent's factors, exactness at full rank,
the latent KV cache, the graph, and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch

import graphkit
from graphkit.attention import convert
from graphkit.attention.mla import LatentKV, MLAError, kv_cache_bytes, to_mla
from graphkit.families import build_model

FAMILIES = {
    "vit": dict(family="vit", num_layers=2, hidden=48, heads=4),
    "gpt2": dict(family="gpt2", num_layers=2, hidden=48, heads=4, vocab_size=50, context=16),
    "llama": dict(family="llama", num_layers=2, hidden=48, heads=4, vocab_size=50, context=16),
    "llama-gqa": dict(family="llama", num_layers=2, hidden=64, heads=8, kv_heads=4, vocab_size=50, context=16),
    "mistral": dict(family="llama", num_layers=2, hidden=48, heads=4, vocab_size=50, context=16, sliding_window=3),
}


def inputs(family: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    if family == "vit":
        return torch.randn(2, 3, 32, 32, generator=generator)
    return torch.randint(0, 50, (2, 9), generator=generator)


def run(model, family: str) -> torch.Tensor:
    with torch.no_grad():
        return model(inputs(family)) if family == "vit" else model(inputs(family), use_cache=False).logits


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.manual_seed(0)
    return request.param, build_model(FAMILIES[request.param], device="cpu").eval()


def test_the_latent_is_the_best_low_rank_product_of_the_stacked_projections():
    generator = torch.Generator().manual_seed(0)
    w_k, w_v = torch.randn(2, 32, 16, generator=generator, dtype=torch.float64)
    latent = LatentKV.factor(w_k, w_v, None, None, 6)
    product = torch.cat([latent.k_up.weight, latent.v_up.weight]) @ latent.down.weight
    stacked = torch.cat([w_k, w_v])
    s = torch.linalg.svdvals(stacked)
    assert torch.allclose((product - stacked).norm(), s[6:].norm(), rtol=1e-9)  # Eckart-Young: the least error
    assert torch.allclose(
        torch.cat([LatentKV.factor(w_k, w_v, None, None, 16).k_up.weight])
        @ LatentKV.factor(w_k, w_v, None, None, 16).down.weight,
        w_k,
    )


def test_mla_at_full_rank_reproduces_the_model_and_its_graph_says_mla(family):
    name, model = family
    width = FAMILIES[name]["hidden"]
    converted = to_mla(copy.deepcopy(model), kv_rank=width)
    assert (run(converted, name) - run(model, name)).abs().max() < 1e-4
    original = next(n.attrs for n in graphkit.trace(model).nodes if n.op == "attention")
    attention = [n.attrs for n in graphkit.trace(converted).nodes if n.op == "attention"]
    assert len(attention) == 2 and all(a["variant"] == "mla" and a["kv_rank"] == width for a in attention)
    assert all(a["rope"] == original["rope"] and a["window"] == original["window"] for a in attention)


def test_a_lower_rank_caches_less_and_stays_close(family):
    name, model = family
    config = FAMILIES[name]
    kv_width = config["hidden"] // config["heads"] * config.get("kv_heads", config["heads"])
    assert kv_cache_bytes(model) == 2 * 2 * kv_width * 4  # 2 layers, K and V, float32
    converted = to_mla(copy.deepcopy(model), kv_rank=24)
    assert kv_cache_bytes(converted) == 2 * 24 * 4
    assert torch.isfinite(run(converted, name)).all()


@pytest.mark.parametrize(
    ("name", "conversion"),
    [("gpt2", "mla"), ("gpt2", "gqa"), ("llama", "mla"), ("llama-gqa", "mla"), ("mistral", "mla")],
)
def test_a_language_model_decodes_from_its_cache_as_from_the_whole_sequence(name, conversion):
    """MLA caches the latent; GQA its K/V heads. Either way, decoding token by token from the cache
    gives the logits of one pass over the whole sequence (transformers passes the cache as
    ``cache`` since 5.2x, and a converted attention that ignored it decoded wrong)."""
    torch.manual_seed(0)
    model = build_model(FAMILIES[name], device="cpu").eval()
    converted = to_mla(model, kv_rank=24) if conversion == "mla" else convert(model, "gqa", 2)
    tokens = inputs(name)[:1]
    with torch.no_grad():
        whole = converted(tokens, use_cache=False).logits
        first = converted(tokens[:, :5], use_cache=True)
        cache = first.past_key_values
        steps = [first.logits]
        for t in range(5, tokens.shape[1]):
            out = converted(tokens[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
        cached = converted.generate(tokens[:, :5], max_new_tokens=6, do_sample=False)
        uncached = converted.generate(tokens[:, :5], max_new_tokens=6, do_sample=False, use_cache=False)
    assert (torch.cat(steps, dim=1) - whole).abs().max() < 1e-4
    assert torch.equal(cached, uncached)
    if conversion == "mla":
        assert cache.layers[0].keys.shape[-1] == 24 and cache.layers[0].values.shape[-1] == 0  # the latent alone
    else:
        assert cache.layers[0].keys.shape[1] == 2  # two K/V heads


@pytest.mark.parametrize("rank", [0, -1, 49, 2.5, True])
def test_a_bad_rank_is_refused_before_anything_changes(rank):
    model = build_model(FAMILIES["gpt2"], device="cpu")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(MLAError, match=r"kv_rank .* for module 'transformer.h.0.attn': must be an integer from 1 to"):
        to_mla(model, rank)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_attention_to_mla_cannot_convert_is_named():
    model = torch.nn.Sequential(torch.nn.MultiheadAttention(16, 4))
    with pytest.raises(
        MLAError, match=r"module '0' \(torch.nn.modules.activation.MultiheadAttention\) is an attention"
    ):
        to_mla(model, 8)

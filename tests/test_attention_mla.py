"""MHA -> MLA by conversion (graphkit.attention.mla): the latent's factors, exactness at full rank,
the latent KV cache, the graph, and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import assert_decodes_from_its_cache, timm_vit

import graphkit
from graphkit.attention import ConvertError, convert
from graphkit.attention.mla import LatentKV, MLAError, kv_cache_bytes, latent_attention, rope_pairs, to_mla
from graphkit.compiler import CompileError, compile_model, save_params
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
    [
        ("gpt2", "mla"),
        ("gpt2", "gqa"),
        ("llama", "mla"),
        ("llama-gqa", "mla"),
        ("mistral", "mla"),
        ("llama-gqa", "mla-rope"),
        ("mistral", "mla-rope"),
    ],
)
def test_a_language_model_decodes_from_its_cache_as_from_the_whole_sequence(name, conversion):
    """MLA caches the latent; GQA its K/V heads. Either way, decoding token by token from the cache
    gives the logits of one pass over the whole sequence (transformers passes the cache as
    ``cache`` since 5.2x, and a converted attention that ignored it decoded wrong)."""
    torch.manual_seed(0)
    model = build_model(FAMILIES[name], device="cpu").eval()
    if conversion == "gqa":
        converted = convert(model, "gqa", 2)
    else:
        converted = to_mla(model, kv_rank=24, rope_dims=4 if conversion == "mla-rope" else None)
    cache = assert_decodes_from_its_cache(converted, inputs(name)[:1])
    if conversion == "mla":
        assert cache.layers[0].keys.shape[-1] == 24 and cache.layers[0].values.shape[-1] == 0  # the latent alone
    elif conversion == "mla-rope":  # the latent and each K/V head's 4 rotary key dimensions
        kv_heads = FAMILIES[name].get("kv_heads", FAMILIES[name]["heads"])
        assert cache.layers[0].keys.shape[-1] == 24 + 4 * kv_heads and cache.layers[0].values.shape[-1] == 0
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


def test_per_head_query_and_key_norms_are_refused_not_dropped():
    """Qwen3 normalises each head's query and key; to_mla replaced the module and silently lost
    both norms (its full-rank conversion was 0.3 off in the logits, where it must be exact)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        intermediate_size=48, vocab_size=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    with pytest.raises(
        MLAError, match=r"module 'model.layers.0.self_attn' \(Qwen3Attention\) normalises .*q_norm, k_norm"
    ):
        to_mla(model, 32)
    assert type(model.model.layers[0].self_attn).__name__ == "Qwen3Attention"


@pytest.mark.parametrize("conversion", ["mla", "gqa"])
def test_a_timm_vit_with_qk_norm_is_refused_not_dropped(conversion):
    """A timm ViT with qk_norm: to_mla replaced its attention by plain MLA and lost both norms
    (0.25 off in the logits at full rank, where it must be exact); convert() refused it already."""
    model = timm_vit("vit_tiny_patch16_224", qk_norm=True, img_size=32, patch_size=8, depth=2)
    error = MLAError if conversion == "mla" else ConvertError
    with pytest.raises(error, match=r"module 'blocks.0.attn' \(timm Attention\) uses qk-norm, a scale norm or gating"):
        to_mla(model, 192) if conversion == "mla" else convert(model)
    assert type(model.blocks[0].attn).__name__ == "Attention"


@pytest.mark.parametrize("bias", [False, True])
def test_the_absorbed_form_computes_what_the_expanded_form_does(bias):
    """Folding the K up projection into the query and attending over the latent (decoding's
    form) against rebuilding K and V (the prompt's), with GQA groups, decoupled rotary keys,
    queries that are the last of the keys, and boolean and additive masks."""
    generator = torch.Generator().manual_seed(0)
    latent = LatentKV(32, 2 * 6, 10, bias, v_width=2 * 8).double()
    for p in latent.parameters():
        p.data = torch.randn(p.shape, generator=generator, dtype=torch.float64)
    q, c = torch.randn(2, 4, 3, 6, generator=generator, dtype=torch.float64), torch.randn(2, 7, 10, generator=generator)
    rope = {"q_rope": torch.randn(2, 4, 3, 2, dtype=torch.float64), "k_rope": torch.randn(2, 2, 7, 2).double()}
    allowed = torch.rand(2, 1, 3, 7, generator=generator) > 0.3
    allowed[..., 0] = True
    for mask in (None, allowed, torch.where(allowed, 0.0, -1e9).double()):
        for extra in ({}, rope):
            c64 = c.double()
            expanded = latent_attention(q, c64, latent, kv_heads=2, mask=mask, form="expanded", **extra)
            absorbed = latent_attention(q, c64, latent, kv_heads=2, mask=mask, form="absorbed", **extra)
            assert expanded.shape == (2, 4, 3, 8) and torch.allclose(expanded, absorbed, atol=1e-10)
    causal = latent_attention(q, c.double(), latent, kv_heads=2, form="expanded")
    first_keys_only = latent_attention(q[:, :, :1], c[:, :5].double(), latent, kv_heads=2)
    assert torch.allclose(causal[:, :, :1], first_keys_only)  # query 0 of 3 is key 4 of 7: it reads keys 0-4
    with pytest.raises(MLAError, match="form 'fast': accepted: expanded, absorbed"):
        latent_attention(q, c.double(), latent, kv_heads=2, form="fast")


def _partial_rope_attention(attn, pairs, hidden, cos, sin):
    """LLaMA attention with RoPE on the kept pairs only, from the unconverted weights: the
    model partial RoPE converts to, before any factoring."""
    b, n, _ = hidden.shape
    d, heads = attn.head_dim, attn.q_proj.out_features // attn.head_dim
    kv_heads, half = attn.k_proj.out_features // d, d // 2
    kept = torch.zeros(kv_heads, d, dtype=torch.bool)
    kept.scatter_(1, torch.cat([pairs, pairs + half], dim=1), True)
    kept = kept.view(1, kv_heads, 1, d)

    def rotate_kept(x, mask):
        rotated = x * cos.unsqueeze(1) + torch.cat([-x[..., half:], x[..., :half]], -1) * sin.unsqueeze(1)
        return torch.where(mask, rotated, x)

    q = attn.q_proj(hidden).view(b, n, heads, d).transpose(1, 2)
    k = attn.k_proj(hidden).view(b, n, kv_heads, d).transpose(1, 2)
    v = attn.v_proj(hidden).view(b, n, kv_heads, d).transpose(1, 2)
    q, k = rotate_kept(q, kept.repeat_interleave(heads // kv_heads, dim=1)), rotate_kept(k, kept)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return attn.o_proj(y.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("name", ["llama", "llama-gqa"])
def test_partial_rope_at_full_rank_is_llama_with_rope_on_the_kept_pairs(name):
    """MHA2MLA's conversion: the latent factors the unrotated keys and the values exactly at full
    rank, so the converted attention is the original with RoPE kept on the chosen pairs alone,
    and the graph and the cache say so."""
    torch.manual_seed(0)
    model = build_model(FAMILIES[name], device="cpu").eval()
    attn = copy.deepcopy(model.model.layers[0].self_attn)
    config = FAMILIES[name]
    d = config["hidden"] // config["heads"]
    kv_heads = config.get("kv_heads", config["heads"])
    full = min(config["hidden"], 2 * kv_heads * d - 4 * kv_heads)
    converted = to_mla(copy.deepcopy(model), kv_rank=full, rope_dims=4)
    layer = converted.model.layers[0].self_attn
    hidden = torch.randn(2, 7, config["hidden"])
    cos, sin = model.model.rotary_emb(hidden, torch.arange(7).expand(2, 7))
    pairs = layer.rope_index[:, :2]
    with torch.no_grad():
        got = layer(hidden, position_embeddings=(cos, sin))[0]
        want = _partial_rope_attention(attn, pairs, hidden, cos, sin)
    assert (got - want).abs().max() < 1e-5
    assert kv_cache_bytes(converted) == 2 * (full + 4 * kv_heads) * 4
    graph = [n.attrs for n in graphkit.trace(converted).nodes if n.op == "attention"]
    assert all(a["variant"] == "mla" and a["kv_rank"] == full and a["rope_dims"] == 4 and a["rope"] for a in graph)


def test_partial_rope_keeps_the_pairs_queries_and_keys_use_most():
    """MHA2MLA's 2-norm rule: per K/V head, the pairs whose query norm (summed over the heads
    reading it) times key norm is largest; no calibration keeps the highest frequencies."""
    q, k = torch.full((5, 4, 8), 0.1), torch.full((5, 2, 8), 0.1)
    q[:, 0:2, 2] = q[:, 0:2, 6] = 3.0  # K/V head 0's queries lean on pair 2
    k[:, 0, 1] = 4.0  # and its keys on pair 1
    k[:, 1, 3] = k[:, 1, 7] = 5.0  # K/V head 1's keys on pair 3
    q[:, 2:4, 0] = 1.0  # and its queries on pair 0
    assert rope_pairs(q, k, 2, 4, 8).tolist() == [[1, 2], [0, 3]]
    assert rope_pairs(None, None, 2, 4, 8).tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize(
    ("name", "rope_dims", "message"),
    [
        ("gpt2", 4, r"rope_dims 4 for module 'transformer.h.0.attn' \(GPT2Attention\): it has no RoPE"),
        ("llama", 3, r"rope_dims 3 for module 'model.layers.0.self_attn': must be an even integer from 2 to 10"),
        ("llama", 12, r"rope_dims 12 .* must be an even integer from 2 to 10, its head_dim less one pair"),
        ("llama", 0, r"rope_dims 0 .* must be an even integer"),
        ("llama-gqa", None, r"kv_rank 60 for module 'model.layers.0.self_attn': must be an integer from 1 to 48"),
    ],
)
def test_a_bad_rope_width_is_refused_before_anything_changes(name, rope_dims, message):
    model = build_model(FAMILIES[name], device="cpu")
    before = copy.deepcopy(model.state_dict())
    rank = 60 if rope_dims is None else 8
    with pytest.raises(MLAError, match=message):
        to_mla(model, rank, rope_dims=rope_dims if rope_dims is not None else 4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_partial_rope_conversion_round_trips_through_its_file(tmp_path):
    """The converted file holds the reordered projections and each head's rotary dimensions
    (``rope_index``); compile_model builds the MLA structure and loads them back, whatever pairs
    the calibration chose."""
    torch.manual_seed(0)
    config = FAMILIES["llama-gqa"]
    model = build_model(config, device="cpu").eval()
    calibration = [torch.randint(0, 50, (2, 12))]
    converted = to_mla(model, kv_rank=20, rope_dims=4, calibration=calibration)
    save_params(converted, tmp_path / "mla.safetensors")
    back = compile_model(config, tmp_path / "mla.safetensors", attention="mla", kv_rank=20, rope_dims=4).eval()
    chosen = converted.model.layers[1].self_attn.rope_index
    assert not torch.equal(chosen[:, :2], torch.tensor([[0, 1]] * 4))  # not the default: the calibration chose
    assert torch.equal(back.model.layers[1].self_attn.rope_index, chosen)
    assert torch.equal(run(back, "llama-gqa"), run(converted, "llama-gqa"))
    with pytest.raises(CompileError, match="attention mla takes kv_rank"):
        compile_model(config, attention="mla", kv_heads=2)
    with pytest.raises(CompileError, match="kv_rank and rope_dims apply to attention mla, not gqa"):
        compile_model(config, attention="gqa", kv_rank=8)

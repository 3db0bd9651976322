"""One family, one place: a family registered in one call reaches recipes, the hypernetwork's
data and checkpoints, and attention conversion (GQA, MLA, the KV cache's size and the Hugging
Face export, all through its adapter)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import llama
from torch import nn

from graphkit.attention.adapter import ADAPTERS, adapter_for, register_adapter
from graphkit.attention.builtin import LLAMA_ATTENTION, TIMM_ATTENTION
from graphkit.attention.convert import ViTGroupedAttention, check_variant_options, conversion_metadata, convert
from graphkit.attention.core import ATTENTION_VARIANTS, AttentionVariant, GroupedQueryAttention, register_variant
from graphkit.attention.hf_format import check_hf_export
from graphkit.attention.mla import ViTLatentAttention, kv_cache_bytes, to_mla
from graphkit.datasets.recipes import RECIPES, get_recipe
from graphkit.errors import ConfigError, ConvertError, ExportError, MLAError
from graphkit.families import FAMILIES, build_model, get_family, register_family
from graphkit.ghn import BUNDLED
from graphkit.tracing import trace
from graphkit.training.data import DEFAULT_SOURCES, default_source

RECIPE = {
    "name": "wide-vits",
    "family": "wide-vit",
    "bins": [{"layers": [2, 3], "hidden": [64, 128, 64]}],
    "heads": [{"choices": [2, 4]}],
    "max_params": 2_000_000,
    "num": 10,
}


@pytest.fixture
def wide_vit():
    """A new family declared the way families/vit.py declares ViTs, removed afterwards."""
    adapter = dataclasses.replace(TIMM_ATTENTION, claims=lambda module: TIMM_ATTENTION.claims(module))  # its own
    family = dataclasses.replace(
        get_family("vit"),
        name="wide-vit",
        mlp_ratio=8.0,
        recipes=(RECIPE,),
        data="digits",
        bundled_ghn="logah-tiny-vits",
        attention_adapter=adapter,
        traced_as=(),
    )
    register_family(family)
    yield family
    del FAMILIES["wide-vit"]
    ADAPTERS.remove(adapter)


def test_one_registration_reaches_every_table(wide_vit):
    assert "wide-vits" in RECIPES and get_recipe("wide-vits").family == "wide-vit"
    assert {c["hidden"] for _, c, _ in get_recipe("wide-vits").sample(10, seed=0)} <= {64, 128}
    assert default_source("wide-vit") == DEFAULT_SOURCES["wide-vit"] == "digits"
    assert BUNDLED["wide-vit"] == "logah-tiny-vits"
    assert ADAPTERS.count(wide_vit.attention_adapter) == 1 and ADAPTERS[-1] is wide_vit.attention_adapter
    model = build_model(
        {"family": "wide-vit", "num_layers": 2, "hidden": 64, "heads": 2, "attention": "gqa", "kv_heads": 1}
    )
    assert model.blocks[0].mlp.fc1.out_features == 512 and model.blocks[0].attn.core.kv_heads == 1


def bare_copy(base: str, name: str, **changes):
    """Family ``base`` under ``name``, declaring no recipes, data, checkpoint or adapter of its
    own (unless ``changes`` give one)."""
    return dataclasses.replace(
        get_family(base),
        **{"name": name, "recipes": (), "data": None, "bundled_ghn": None, "attention_adapter": None, "traced_as": ()}
        | changes,
    )


def test_a_family_with_a_shrink_predict_cannot_use_is_refused_unregistered():
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=rf"family 'bad-shrink': shrink must be .*; got {bad}"):
            register_family(dataclasses.replace(FAMILIES["llama"], name="bad-shrink", shrink=bad))
    assert "bad-shrink" not in FAMILIES


def test_tables_are_live_views():
    before = set(RECIPES), dict(BUNDLED), dict(DEFAULT_SOURCES)
    assert before == (
        {"vits-1k", "vits-digits", "vits-digits-grids24", "gpts-1k", "llamas-1k"},
        {"vit": "logah-tiny-vits", "gpt2": "logah-tiny-gpts", "llama": "logah-tiny-llamas"},
        {"vit": "digits", "gpt2": "stdlib-text", "llama": "stdlib-text"},
    )
    register_family(bare_copy("gpt2", "gpt2-copy"))
    try:
        assert (set(RECIPES), dict(BUNDLED), dict(DEFAULT_SOURCES)) == before  # nothing declared, nothing added
    finally:
        del FAMILIES["gpt2-copy"]
    with pytest.raises(KeyError):
        BUNDLED["gpt2-copy"]


class SelfAttention(nn.Module):
    """A hand-written attention no built-in adapter claims: a fused ``qkv`` and ``proj``, as
    timm's, in a module of no library's."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, dim))


def mixer(layers: int = 2, dim: int = 32, heads: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(SelfAttention(dim, heads) for _ in range(layers)))


@pytest.fixture
def mixer_adapter():
    """A family whose attention only its own adapter claims, registered and removed afterwards;
    the adapter's hooks are the fused-projection ones timm's adapter uses, its claim and its
    reason for refusing the Hugging Face export its own."""
    adapter = dataclasses.replace(
        TIMM_ATTENTION,
        claims=lambda module: isinstance(module, SelfAttention),
        hf_refusal="a mixer has no class in transformers",
    )
    register_family(bare_copy("vit", "mixer", attention_adapter=adapter))
    yield adapter
    del FAMILIES["mixer"]
    ADAPTERS.remove(adapter)


def test_without_an_adapter_no_conversion_takes_the_attention():
    with pytest.raises(ConvertError, match=r"module '0' \(.*SelfAttention\) is an attention graphkit cannot convert"):
        convert(mixer(), "gqa")
    with pytest.raises(MLAError, match=r"module '0' \(.*SelfAttention\) is an attention to_mla cannot convert"):
        to_mla(mixer(), 32)
    assert kv_cache_bytes(mixer()) == 0


def test_a_registered_adapter_alone_gives_gqa_mla_the_cache_and_the_export_check(mixer_adapter):
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        expected = mixer()(x)
        assert kv_cache_bytes(mixer()) == 2 * 2 * 32 * 4  # 2 layers, K and V as wide as the model, float32
        gqa = convert(mixer(), "gqa")  # as many K/V heads as heads: the same function
        assert isinstance(gqa[0], ViTGroupedAttention) and torch.allclose(gqa(x), expected, atol=1e-5)
        pooled = convert(mixer(), "kdgqa", 2)
        assert pooled[1].core.kv_heads == 2 and not torch.allclose(pooled(x), expected, atol=1e-3)
        mla = to_mla(mixer(), 32)  # the latent as wide as the model: exact
        assert isinstance(mla[0], ViTLatentAttention) and torch.allclose(mla(x), expected, atol=1e-5)
        assert kv_cache_bytes(to_mla(mixer(), 8)) == 2 * 8 * 4
    with pytest.raises(ExportError, match=r"^Sequential: a mixer has no class in transformers \(module '0'\)"):
        check_hf_export(mixer(), "gqa")


def test_the_adapter_registered_last_decides(mixer_adapter):
    """A family's adapter claiming LLaMA-style attention, which the built-in one also claims,
    decides for it: its refusal of the export is what check_hf_export says."""
    check_hf_export(llama(), "gqa")  # the built-in adapter: a stock class exists
    claims_llama = dataclasses.replace(LLAMA_ATTENTION, hf_refusal="this family keeps its own class")
    register_adapter(claims_llama)
    try:
        assert adapter_for(llama().model.layers[0].self_attn) is claims_llama
        with pytest.raises(ExportError, match="this family keeps its own class"):
            check_hf_export(llama(), "gqa")
    finally:
        ADAPTERS.remove(claims_llama)
    assert adapter_for(llama().model.layers[0].self_attn) is LLAMA_ATTENTION


@pytest.fixture
def first_kv_variant():
    """A registered attention variant with an option of its own (``share``: the output scaled by
    it), a route (every query head reads K/V head 0) and what a file records of it; removed
    afterwards."""
    variant = register_variant(
        AttentionVariant(
            "first-kv",
            options=("share",),
            route=lambda core, q, k: torch.zeros(core.heads, dtype=torch.long, device=k.device),
            adjust=lambda core, out: out * core.options.get("share", 1.0),
            metadata=lambda core: {"graphkit_share": str(core.options.get("share", 1.0))},
        )
    )
    yield variant
    del ATTENTION_VARIANTS["first-kv"]


def test_a_registered_variant_runs_everywhere_a_built_in_one_does(first_kv_variant, mixer_adapter):
    x = torch.randn(2, 5, 32)
    model = convert(mixer(), "first-kv", 2, share=0.5)
    core = model[0].core
    assert core.variant == "first-kv" and core.options == {"share": 0.5}
    with torch.no_grad():
        # every query head reads K/V head 0: what K/V head 1 holds changes nothing
        before = model(x)
        for layer in model:
            layer.qkv.weight[32 + 8 : 32 + 16].normal_()  # the K rows of K/V head 1 (queries: rows 0-31)
        assert torch.allclose(model(x), before)
        half, whole = (convert(mixer(layers=1), "first-kv", 2, share=s) for s in (0.5, 1.0))
        bias = half[0].proj.bias
        assert torch.allclose(half(x) - bias, 0.5 * (whole(x) - bias), atol=1e-6)  # the output scaled by share
    assert conversion_metadata(model)["graphkit_share"] == "0.5"
    attention = [n for n in trace(model, (x,)).nodes if n.op == "attention"]
    assert [n.attrs["variant"] for n in attention] == ["first-kv", "first-kv"]
    llama_model = convert(llama(), "first-kv", 1)  # through the HF attention implementation that holds it
    assert llama_model.model.layers[0].self_attn.config.num_key_value_heads == 1
    llama_model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConvertError, match="--share applies only to first-kv, not gqa"):
        check_variant_options("gqa", {"share": 1.0}, prefix="--")
    with pytest.raises(ValueError, match="attention variant gqa takes no option 'share'"):
        GroupedQueryAttention(4, 2, "gqa", share=1.0)
    built = build_model({"family": "llama", "num_layers": 1, "hidden": 64, "heads": 4, "attention": "first-kv"}, "cpu")
    assert [n.attrs["variant"] for n in trace(built).nodes if n.op == "attention"] == ["first-kv"]


def test_a_variant_cannot_take_the_name_of_another_attention():
    with pytest.raises(ValueError, match="mha and mla name other attentions"):
        register_variant(AttentionVariant("mla"))

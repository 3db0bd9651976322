"""Config -> model for every family, and the errors for bad configs."""

from __future__ import annotations

import pytest
import torch
from helpers import ExoticLM, meta

import graphkit
from graphkit.errors import ZooError
from graphkit.families import (
    FAMILIES,
    ConfigError,
    build_model,
    config_from_graph,
    num_params,
    resolve_config,
    traced_family,
)
from graphkit.families.equivalents import plain_form, renamed, vit_equivalent

CONFIGS = {
    "vit": dict(family="vit", num_layers=4, hidden=256, heads=8),
    "gpt2": dict(family="gpt2", num_layers=3, hidden=176, heads=8, vocab_size=1000, context=64),
    "llama": dict(family="llama", num_layers=3, hidden=128, heads=8, kv_heads=2, vocab_size=1000),
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_build_on_meta_and_trace(family):
    config = CONFIGS[family]
    model = build_model(config)
    assert all(p.device.type == "meta" for p in model.parameters()) and not model.training
    graph = graphkit.trace(model)
    layout = graph.attention_layout()
    assert len(layout) == 1 and layout[0]["layers"] == config["num_layers"]
    assert layout[0]["heads"] == config["heads"] and layout[0]["kv_heads"] == config.get("kv_heads", config["heads"])
    assert graph.num_params == num_params(config)


def test_defaults_and_resolution_are_idempotent():
    full = resolve_config(CONFIGS["vit"])
    assert full["mlp"] == 4 * 256 and full["image_size"] == 32 and full["patch_size"] == 2 and full["num_classes"] == 10
    assert resolve_config(full) == full
    assert resolve_config(CONFIGS["gpt2"])["tied"] is False  # LoGAH's GPTs keep lm_head untied


def test_vit_matches_the_config():
    model = build_model(
        dict(family="vit", num_layers=3, hidden=384, heads=6, image_size=64, patch_size=8, num_classes=100)
    )
    assert len(model.blocks) == 3 and model.head.out_features == 100
    assert model.pos_embed.shape == (1, 1 + (64 // 8) ** 2, 384)
    assert model.blocks[0].mlp.fc1.out_features == 4 * 384


def test_gpt2_lm_head_is_untied():
    model = build_model(CONFIGS["gpt2"])
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (176, 4 * 176)


def test_llama_with_sliding_window_is_mistral():
    config = dict(CONFIGS["llama"], sliding_window=16)
    graph = graphkit.trace(build_model(config))
    assert {n.attrs["window"] for n in graph.nodes if n.op == "attention"} == {16}
    # it traces as transformers' mistral, which the llama family lists: its defaults are llama's
    assert graph.meta["family"] == "mistral" and traced_family(graph) is FAMILIES["llama"]


def test_real_weights_on_cpu_run():
    model = build_model(dict(family="gpt2", num_layers=2, hidden=32, heads=2, vocab_size=100, context=16), device="cpu")
    logits = model(torch.randint(0, 100, (1, 8))).logits
    assert logits.shape == (1, 8, 100) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "config,message",
    [
        (dict(num_layers=3), "config has no 'family' key; known families: gpt2, llama, timm, transformers, vit"),
        (
            dict(family="bert", num_layers=3),
            "unknown family 'bert'; known families: gpt2, llama, timm, transformers, vit",
        ),
        (dict(family="vit", num_layers=3, hidden=192, heads=3, depth=4), "unknown key 'depth'; accepted keys:"),
        (dict(family="gpt2", num_layers=3, heads=4), "missing key 'hidden'"),
        (dict(family="gpt2", num_layers=3, hidden=100, heads=8), "hidden 100 is not divisible by heads 8"),
        (dict(family="llama", num_layers=3, hidden=64, heads=4, kv_heads=3), "heads 4 is not divisible by kv_heads 3"),
        (
            dict(family="vit", num_layers=3, hidden=192, heads=3, image_size=30, patch_size=4),
            "image_size 30 is not divisible by patch_size 4",
        ),
        (
            dict(family="vit", num_layers=3, hidden=192, heads=3, global_pool="max"),
            "global_pool must be 'token' or 'avg'",
        ),
        (dict(family="vit", num_layers=3, hidden=192, heads=3, kv_heads=1), "kv_heads needs an attention variant"),
        (
            dict(family="gpt2", num_layers=3, hidden=64, heads=4, attention="mqa"),
            "unknown attention 'mqa'; accepted: none",
        ),
        (
            dict(family="gpt2", num_layers=3, hidden=64, heads=4, attention="gqa", kv_heads=3),
            "heads 4 is not divisible by kv_heads 3",
        ),
    ],
)
def test_bad_configs(config, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build_model(config)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_num_params_is_exact(family):
    for layers in (3, 7):
        config = dict(CONFIGS[family], num_layers=layers)
        assert num_params(config) == sum(p.numel() for p in build_model(config).parameters())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tied_heads_are_tied_on_meta_too(family):
    config = dict(CONFIGS[family], tied=True)
    on_meta, on_cpu = build_model(config), build_model(config, device="cpu")
    assert on_meta.lm_head.weight is on_meta.get_input_embeddings().weight
    assert (
        sum(p.numel() for p in on_meta.parameters())
        == sum(p.numel() for p in on_cpu.parameters())
        == num_params(config)
    )


@pytest.mark.parametrize(
    "config",
    [
        dict(family="vit", num_layers=3, hidden=192, heads=3),
        dict(
            family="vit",
            num_layers=4,
            hidden=128,
            heads=4,
            global_pool="avg",
            image_size=64,
            patch_size=8,
            num_classes=100,
        ),
        dict(family="gpt2", num_layers=3, hidden=64, heads=4, tied=True, vocab_size=300, context=32),
        dict(
            family="llama", num_layers=3, hidden=64, heads=4, kv_heads=2, sliding_window=8, rms_eps=1e-5, vocab_size=300
        ),
    ],
    ids=["vit", "vit-avg", "gpt2-tied", "mistral"],
)
def test_config_is_read_back_from_the_graph(config):
    full = resolve_config(config)
    assert config_from_graph(graphkit.trace(build_model(full))) == full


#: timm's VisionTransformer variants, shrunk: (name, what their parameters show, the options read back)
TIMM_VARIANTS = [
    ("vit_base_patch32_clip_224", {"pre_norm": True}),
    # layer scale read off a model built on meta, which holds no value: timm's usual one
    ("deit3_small_patch16_224", {"init_values": 1e-5, "no_embed_class": True}),
    ("vit_small_patch14_reg4_dinov2", {"init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True}),
    ("vit_base_patch16_siglip_gap_224", {"fc_norm": False}),  # pooled by the mean: no class token by default
    ("vit_medium_patch16_gap_256", {"fc_norm": False, "init_values": 1e-5, "qkv_bias": False}),
    ("beit3_base_patch16_224", {"class_token": True, "scale_attn_norm": True, "scale_mlp_norm": True}),
    ("eva_large_patch14_196", {"class_token": True}),
]


@pytest.mark.parametrize(("name", "options"), TIMM_VARIANTS, ids=[name for name, _ in TIMM_VARIANTS])
def test_timm_vit_variants_are_read_back_with_the_options_their_parameters_show(name, options):
    """What a timm ViT variant's parameters show (CLIP's pre-norm, layer scale, register tokens, a
    pooled model's final norm, BEiT-3's inner norms) is read into its config, so that the model the
    config builds has every parameter the variant has, at its shape."""
    import timm  # noqa: PLC0415

    shrink = dict(embed_dim=64, depth=2, num_heads=2, img_size=32, patch_size=8, num_classes=10)
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **shrink)
    config = config_from_graph(graphkit.trace(model))
    assert {key: config[key] for key in FAMILIES["vit"].options if key in config} == options
    assert (config["image_size"], config["patch_size"], config["hidden"]) == (32, 8, 64)
    shapes = {name: tuple(p.shape) for name, p in build_model(config).named_parameters()}
    assert shapes == {name: tuple(p.shape) for name, p in model.named_parameters()}


def test_vit_options_stay_out_of_the_configs_of_plain_models():
    """A config without options resolves as before (dataset records keep their content); an option
    given is checked, and a pooled model's class token follows its pool unless a config says."""
    full = resolve_config(dict(family="vit", num_layers=2, hidden=64, heads=2))
    assert not set(full) & set(FAMILIES["vit"].options)
    with pytest.raises(ConfigError, match="vit config: reg_tokens must be an integer >= 1; got 0"):
        resolve_config(dict(family="vit", num_layers=2, hidden=64, heads=2, reg_tokens=0))
    with pytest.raises(ConfigError, match="global_pool 'token' needs class_token true"):
        build_model(dict(family="vit", num_layers=2, hidden=64, heads=2, class_token=False))
    pooled = build_model(dict(family="vit", num_layers=2, hidden=64, heads=2, global_pool="avg"))
    assert pooled.cls_token is None and pooled.fc_norm.weight.shape == (64,)


def test_a_vit_whose_mlp_is_not_timms_has_no_config():
    """DINOv2-giant's packed SwiGLU has an fc1 twice as wide as fc2's input: no vit config builds it."""
    import timm  # noqa: PLC0415

    with torch.device("meta"):
        model = timm.create_model("vit_giant_patch14_dinov2", pretrained=False, embed_dim=96, depth=1, num_heads=2)
    with pytest.raises(ConfigError, match="an MLP whose fc1 .* is not fc2's input"):
        config_from_graph(graphkit.trace(model))


@pytest.mark.parametrize("kind", ["ViT", "ViTMSN"])
def test_transformers_vit_computes_what_its_timm_equivalent_computes(kind):
    """The renaming is the function: a random timm ViT's parameters, renamed into transformers'
    ViT or ViT-MSN (q, k and v as the fused projection's row blocks), give its logits; a model
    that is not such a classifier, or one with another activation, has no equivalent."""
    import transformers  # noqa: PLC0415
    from transformers import ViTConfig, ViTForImageClassification, ViTModel  # noqa: PLC0415

    fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=16)
    classifier, config_class = (getattr(transformers, f"{kind}{part}") for part in ("ForImageClassification", "Config"))
    torch.manual_seed(0)
    hf = classifier(config_class(**fields, patch_size=4, num_labels=7)).eval()
    found = vit_equivalent(hf)
    assert found is not None
    config, renaming = found
    assert (config["mlp"], config["num_classes"], config["patch_size"]) == (96, 7, 4)
    torch.manual_seed(1)
    timm_vit = build_model(config, "cpu")
    with torch.no_grad():
        for p in timm_vit.parameters():  # norms and biases away from 1 and 0, so that each is carried
            p.add_(torch.randn_like(p) * 0.1)
    values = renamed(dict(timm_vit.named_parameters()), renaming)
    assert values.keys() == dict(hf.named_parameters()).keys()
    hf.load_state_dict({name: value.detach() for name, value in values.items()})
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(hf(images).logits, timm_vit(images), rtol=1e-4, atol=1e-4)
    assert vit_equivalent(ViTModel(ViTConfig(**fields))) is None
    assert vit_equivalent(ViTForImageClassification(ViTConfig(**fields, hidden_act="relu"))) is None


@pytest.mark.parametrize(
    "options",
    [
        dict(init_values=1e-5),
        dict(no_embed_class=True),
        dict(no_embed_class=True, init_values=1e-6, reg_tokens=2),
        dict(no_embed_class=True, reg_tokens=2, class_token=False, global_pool="avg"),
    ],
    ids=["layer-scale", "patch-positions", "deit3-with-registers", "pooled-registers"],
)
def test_a_vit_variant_computes_its_plain_form_from_converted_parameters(options):
    """The conversion is the function: a random plain ViT's parameters, converted (layer scale's
    gains at 1, the position table's prefix rows added to the prefix tokens), load into the variant
    and give the plain ViT's logits; the form's ops lack layer scale's ``scale`` and nothing else."""
    import timm  # noqa: PLC0415

    torch.manual_seed(0)
    shape = dict(embed_dim=64, depth=2, num_heads=2, img_size=16, patch_size=4, num_classes=7)
    variant = timm.create_model("vit_small_patch16_224", pretrained=False, **shape, **options).eval()
    graph = graphkit.trace(variant)
    form = plain_form(graph)
    assert form is not None and not set(form.config) & set(form.options) and set(form.options) <= set(options)
    assert form.ops == {n.op for n in graph.nodes} - ({"scale"} if "init_values" in options else set())
    plain = build_model(form.config, "cpu").eval()
    with torch.no_grad():
        for p in plain.parameters():  # norms and biases away from 1 and 0, the tables away from 0
            p.add_(torch.randn_like(p) * 0.1)
    variant.load_state_dict(form.convert(dict(plain.state_dict())), strict=True)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(variant(images), plain(images), rtol=1e-5, atol=1e-5)


def test_plain_models_and_other_families_have_no_plain_form():
    """A ViT with no such option, one with only options that change what it computes (qk-norm), a
    decoder and a graph of no family have none: they are predicted as themselves."""
    import timm  # noqa: PLC0415

    for kwargs in ({}, {"qk_norm": True}):
        with torch.device("meta"):
            model = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, img_size=32, **kwargs)
        assert plain_form(graphkit.trace(model)) is None
    assert plain_form(graphkit.trace(build_model(CONFIGS["gpt2"]))) is None
    exotic = graphkit.trace(meta(ExoticLM), (torch.zeros(2, 4, dtype=torch.long, device="meta"),))
    assert plain_form(exotic) is None


def test_graph_of_an_unknown_family():

    graph = graphkit.trace(meta(ExoticLM), (torch.zeros(2, 4, dtype=torch.long, device="meta"),))
    assert traced_family(graph) is None
    with pytest.raises(
        ConfigError,
        match="cannot read a config from a graph of family 'custom'; readable families: gpt2, llama, mistral, vit",
    ):
        config_from_graph(graph)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_attention_is_part_of_the_config(family):
    config = dict(CONFIGS[family], attention="dgqa", kv_heads=2)
    graph = graphkit.trace(build_model(config))
    attrs = {(n.attrs["variant"], n.attrs["kv_heads"]) for n in graph.nodes if n.op == "attention"}
    assert attrs == {("dgqa", 2)} and graph.num_params == num_params(config) < num_params(
        CONFIGS[family] | {"kv_heads": None}
    )
    assert config_from_graph(graph) == resolve_config(config)


def test_registry_lists_the_families():
    assert set(FAMILIES) == {"vit", "gpt2", "llama", "timm", "transformers"}


def test_a_library_family_builds_a_zoo_record_as_build_model_builds_any():
    """timm and transformers are families of the one registry: build_model builds a zoo record's
    config, num_params counts it, and their configs are checked as any family's are."""
    vit = build_model({"family": "timm", "model": "test_vit"})
    assert type(vit).__name__ == "VisionTransformer" and next(vit.parameters()).is_meta and not vit.training
    assert num_params({"family": "timm", "model": "test_vit"}) == sum(p.numel() for p in vit.parameters())
    mini = {"family": "transformers", "model_type": "llama", "shrink": {"num_hidden_layers": 2, "hidden_size": 64}}
    decoder = build_model({**mini, "vocab_size": 256, "context": 64, "zoo_family": "llama"}, "cpu")
    assert len(decoder.model.layers) == 2 and not decoder.config.use_cache and decoder.lm_head.weight.abs().sum() > 0
    # a zoo record of several models of one architecture names the others (zoo-decoders-mini's granite: llama)
    aliased = build_model({**mini, "vocab_size": 256, "context": 64, "aliases": ["granite"]})
    assert len(aliased.model.layers) == 2
    for config, message in [
        ({"family": "timm", "model": "test_vit", "depth": 2}, "timm config: unknown key 'depth'; accepted keys:"),
        ({"family": "transformers"}, "transformers config: model_type must be the transformers name of a model"),
        ({"family": "timm", "model": "test_vit", "shrink": [2]}, "timm config: shrink must be an object"),
        (
            {"family": "timm", "model": "test_vit", "aliases": "vit_tiny"},
            "timm config: aliases must be a list of model",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_model(config)
    with pytest.raises(ZooError, match=r"^timm cannot build 'no_such_vit': RuntimeError: Unknown model"):
        build_model({"family": "timm", "model": "no_such_vit"})

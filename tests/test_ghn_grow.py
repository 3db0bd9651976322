"""Models wider than the training space: predicted as a narrow twin, grown without changing what
they compute (graphkit.ghn.grow)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import MODEL_FILES, meta, timm_vit

import graphkit
from graphkit.errors import ConfigError, UntrainedOpError
from graphkit.families import build_model, config_from_graph, resolve_config
from graphkit.ghn import load_checkpoint
from graphkit.ghn.checkpoint import bundled_for, check_graph
from graphkit.ghn.encoding import targets
from graphkit.ghn.grow import (
    EQUIVALENT,
    GrowError,
    GrownDecoding,
    Twin,
    axis_map,
    copied_twin,
    library_twin,
    logit_scale,
    lr_scale,
    resize_patches,
    resize_positions,
    twin_config,
    twin_of,
    twin_phrase,
    whole_heads_width,
)
from graphkit.ghn.predict import predict, predicted_params
from graphkit.ghn.space import (
    GRID_CAVEAT,
    extent,
    grid_to_predict,
    outside_training_space,
    training_space,
    widest_at_depth,
)
from graphkit.modelfile import ModelFile, load_model_file
from graphkit.sources import load_model_source

VIT = {"family": "vit", "image_size": 8, "patch_size": 2, "num_classes": 10}
SMALL_VOCAB = {"vocab_size": 97, "context": 32}


def test_axis_maps_copy_whole_heads_and_units():
    # the stream: 8 -> 4 copies coordinate i from i % 4
    assert axis_map(8, 4, 8, 4).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # fused q, k, v (3 D): each part from the same part of the twin, never across parts
    assert axis_map(9, 6, 3, 2).tolist() == [0, 1, 0, 2, 3, 2, 4, 5, 4]
    # an axis that is not a multiple of the width (GQA's k, an MLP of another ratio): i % n
    assert axis_map(5, 3, 4, 2).tolist() == [0, 1, 2, 0, 1]


def test_twin_config_keeps_the_head_size_and_the_mlp_ratio():
    config = resolve_config({"family": "llama", "num_layers": 2, "hidden": 256, "heads": 8, "kv_heads": 2, "mlp": 688})
    twin = twin_config(config, 128)
    assert (twin["hidden"], twin["heads"], twin["kv_heads"], twin["mlp"]) == (128, 4, 1, 344)
    tinyllama = resolve_config(
        {"family": "llama", "num_layers": 22, "hidden": 2048, "heads": 32, "kv_heads": 4, "mlp": 5632}
    )
    assert twin_config(tinyllama, 256)["kv_heads"] == 1  # half a kv head: one, shared by the 4 query heads
    with pytest.raises(GrowError, match="whole heads"):
        twin_config(resolve_config({**VIT, "num_layers": 1, "hidden": 96, "heads": 3}), 48)


def grown_from_random_twin(config: dict, twin_width: int):
    """A random twin and the model grown from it, both in eval mode."""
    config = resolve_config(config)
    twin_cfg = twin_config(config, twin_width)
    torch.manual_seed(0)
    twin = build_model(twin_cfg, "cpu").eval()
    graph, twin_graph = graphkit.trace(build_model(config, "meta")), graphkit.trace(build_model(twin_cfg, "meta"))
    values = {t.name: twin.get_parameter(t.name).detach() for t in targets(twin_graph)}
    for name, value in values.items():  # norms and biases away from 1 and 0, so that copying them is tested
        if value.dim() == 1:
            value.add_(torch.randn_like(value) * 0.1)
    grown = build_model(config, "cpu")
    decoding = GrownDecoding(graph, values, config["hidden"], twin_width, 8)
    assert decoding.first_non_finite() is None
    decoding.write_into({t.name: grown.get_parameter(t.name) for t in decoding.targets})
    return twin, grown.eval()


def logits(model, inputs):
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize(
    "config, twin_width",
    [
        pytest.param(dict(VIT, num_layers=2, hidden=128, heads=4), 64, id="vit"),
        pytest.param({"family": "gpt2", "num_layers": 2, "hidden": 128, "heads": 4, **SMALL_VOCAB}, 64, id="gpt2"),
        pytest.param(
            {"family": "gpt2", "num_layers": 2, "hidden": 128, "heads": 4, "tied": True, **SMALL_VOCAB},
            64,
            id="gpt2-tied",
        ),
        pytest.param(
            {"family": "llama", "num_layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "mlp": 176, **SMALL_VOCAB},
            64,
            id="llama-gqa",
        ),
        pytest.param(
            {"family": "llama", "num_layers": 2, "hidden": 128, "heads": 8, "kv_heads": 2, "mlp": 176, **SMALL_VOCAB},
            32,
            id="llama-gqa-from-mqa",
        ),
    ],
)
def test_a_model_grown_to_a_multiple_of_its_twins_width_computes_what_the_twin_computes(config, twin_width):
    twin, grown = grown_from_random_twin(config, twin_width)
    inputs = (
        torch.randn(2, 3, 8, 8)
        if config["family"] == "vit"
        else {"input_ids": torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))}
    )
    expected = logits(twin, inputs)
    assert expected.std() > 0.01
    torch.testing.assert_close(logits(grown, inputs), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_a_transformers_decoder_of_no_graphkit_family_is_grown_from_a_twin_of_its_own_class(model_type):
    """Qwen2 (biased projections, untied) and Qwen3 (per-head norms, tied): no graphkit family
    reads them, so the twin is their own config class at half the width, its heads of the same
    size (4 of 32 -> 2, 2 K/V heads -> 1), its MLP half as wide; grown from a random twin the
    model computes what the twin computes."""
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    config = AutoConfig.for_model(
        model_type, vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=176, tie_word_embeddings=model_type == "qwen3", max_position_embeddings=64,
    )  # fmt: skip
    wide = AutoModelForCausalLM.from_config(config).eval()
    graph = graphkit.trace(wide)
    with pytest.raises(ConfigError):
        config_from_graph(graph)
    twin = library_twin(wide, 128, 64)
    assert twin is not None and twin.config == {"hidden": 64, "heads": 2}
    narrow = twin.model.config
    assert (narrow.num_key_value_heads, narrow.head_dim, narrow.intermediate_size) == (1, 32, 88)
    assert library_twin(torch.nn.Linear(2, 2), 128, 64) is None  # no transformers config: no twin
    torch.manual_seed(0)
    random_twin = AutoModelForCausalLM.from_config(narrow).eval()
    values = {t.name: random_twin.get_parameter(t.name).detach() for t in targets(graphkit.trace(random_twin))}
    for value in values.values():  # norms away from 1 and biases away from 0, so that copying them is tested
        if value.dim() == 1:
            value.add_(torch.randn_like(value) * 0.1)
    decoding = GrownDecoding(graph, values, 128, 64, 8)
    decoding.write_into({t.name: wide.get_parameter(t.name) for t in decoding.targets})
    inputs = {"input_ids": torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))}
    expected = logits(random_twin, inputs)
    assert expected.std() > 0.01
    torch.testing.assert_close(logits(wide, inputs), expected, rtol=1e-4, atol=1e-4)


def test_the_twin_of_a_transformers_decoder_is_found_through_the_model():
    """A 12-layer, 768-wide Qwen2 lies inside the widest width the bundled LLaMA checkpoint
    trained (512 is below it, 768 above) and outside the widest at 12 layers (256): with the model
    at hand its twin is its own class at 192 (3 heads of 64), without it none is found."""
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    config = AutoConfig.for_model(
        "qwen2", vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, intermediate_size=2048,
    )  # fmt: skip
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    graph = graphkit.trace(model)
    llamas = load_checkpoint("logah-tiny-llamas")
    assert twin_of(llamas, graph) is None
    twin = twin_of(llamas, graph, model)
    assert twin is not None and twin.config == {"hidden": 192, "heads": 3}
    assert set(lr_scale(graph, twin).values()) == {192 / 768}
    assert (
        twin_phrase(graph, twin) == "its 192-wide twin (3 heads), grown to its width without changing what it computes"
    )


@pytest.mark.slow
def test_a_model_grown_by_a_fraction_stays_close_to_its_twin():
    twin, grown = grown_from_random_twin(dict(VIT, num_layers=2, hidden=96, heads=3), 64)
    inputs = torch.randn(8, 3, 8, 8)
    a, b = logits(twin, inputs).flatten(), logits(grown, inputs).flatten()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.95


def test_the_copies_learn_apart():
    """With even shares the copies of a stream coordinate get the same gradient at every step and
    stay copies for good; the random shares must make them differ."""
    _, grown = grown_from_random_twin(dict(VIT, num_layers=1, hidden=128, heads=4), 64)
    grown.train()
    for p in grown.parameters():
        p.requires_grad_(True)
    grown(torch.randn(4, 3, 8, 8)).logsumexp(-1).sum().backward()
    grad = grown.patch_embed.proj.weight.grad  # rows c and c + 64 write copies of one coordinate
    weight = grown.patch_embed.proj.weight
    torch.testing.assert_close(weight[:64], weight[64:])
    assert (grad[:64] - grad[64:]).abs().max() > 1e-3 * grad.abs().max()


def test_the_space_records_the_widest_width_per_depth():
    graphs = [
        graphkit.trace(build_model(dict(VIT, num_layers=n, hidden=w, heads=4), "meta"))
        for n, w in ((2, 128), (2, 64), (4, 64))
    ]
    space = training_space(graphs)
    assert space["width_by_depth"] == {"2": [64, 128], "4": [64, 64]}
    assert [widest_at_depth(space, d) for d in (1, 2, 3, 4, 12)] == [128, 128, 64, 64, 64]
    assert widest_at_depth({"width": [8, 32]}, 3) == 32


@pytest.fixture(scope="module")
def vits():
    return load_checkpoint("logah-tiny-vits")


def test_the_twin_is_as_wide_as_the_space_allows_at_the_models_depth(vits):
    def twin(**shape):
        found = twin_of(vits, graphkit.trace(build_model(dict(VIT, **shape), "meta")))
        return found and (found.config["hidden"], found.config["heads"])

    assert twin(num_layers=3, hidden=512, heads=8) is None  # inside: decoded directly
    assert twin(num_layers=6, hidden=256, heads=4) is None  # at the envelope of its depth
    assert twin(num_layers=3, hidden=768, heads=12) == (512, 8)  # the widest trained at 3 layers
    assert twin(num_layers=12, hidden=768, heads=12) == (256, 4)  # 9 layers, the deepest trained, are at most 256 wide
    # inside the widest width of all (512), outside its depth's (256): grown (ViT-S on digits at step 0:
    # 1.00 grown from 256, 1.44 decoded directly; benchmarks/grown_starts.py)
    assert twin(num_layers=12, hidden=384, heads=6) == (256, 4)
    assert twin(num_layers=6, hidden=384, heads=6) == (256, 4)


def test_a_twin_the_caller_passes_is_the_one_grown(vits):
    graph = graphkit.trace(build_model(dict(VIT, num_layers=3, hidden=768, heads=12), "meta"))
    narrower = resolve_config(dict(VIT, num_layers=3, hidden=256, heads=4))  # twin_of's would be 512 wide
    twin = Twin(narrower, build_model(narrower, "meta"))
    expected = predicted_params(vits, graphkit.trace(twin.model))["cls_token"]
    grown = predicted_params(vits, graph, grow=twin)["cls_token"]
    assert grown.shape == (1, 1, 768)
    torch.testing.assert_close(grown[..., :256], expected)  # the stream's first 256 coordinates are the twin's
    assert not torch.allclose(predicted_params(vits, graph)["cls_token"][..., :256], expected)


@pytest.mark.slow
def test_predict_grows_a_wide_model_from_its_twins_prediction(vits):
    config = resolve_config(dict(VIT, num_layers=3, hidden=1024, heads=16))
    model = build_model(config, "meta")
    found = twin_of(vits, graphkit.trace(build_model(config, "meta")))
    predict(model, vits, grow=found)  # the twin the caller found is the one grown, traced as it is
    twin = found.model
    predict(twin, vits)
    inputs = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(logits(model.eval(), inputs), logits(twin.eval(), inputs), rtol=1e-4, atol=1e-4)
    direct = predicted_params(vits, graphkit.trace(build_model(config, "meta")), grow=False)
    assert not torch.equal(direct["head.weight"], model.head.weight)


def test_the_space_records_the_patch_size_and_the_token_grid():
    graphs = [
        graphkit.trace(
            build_model(dict(VIT, num_layers=2, hidden=64, heads=4, image_size=size, patch_size=patch), "meta")
        )
        for size, patch in ((8, 2), (32, 4))
    ]
    assert [(extent(g)["patch"], extent(g)["grid"]) for g in graphs] == [(2, 4), (4, 8)]
    space = training_space(graphs)
    assert (space["patch"], space["grid"], space["resolution"]) == ([2, 4], [4, 8], [8, 32])
    assert space["patch_by_grid"] == {"4": [2, 2], "8": [4, 4]}
    text = graphkit.trace(build_model({"family": "gpt2", "num_layers": 1, "hidden": 32, "heads": 2, **SMALL_VOCAB}))
    assert (extent(text)["patch"], extent(text)["grid"]) == (None, None)


def test_a_patch_size_or_token_grid_outside_the_space_is_predicted_at_trained_ones(vits):
    def twin(**shape):
        graph = graphkit.trace(build_model(dict(VIT, **shape), "meta"))
        found = twin_of(vits, graph)
        return found and (
            found.config["hidden"],
            found.config["patch_size"],
            found.config["image_size"],
            twin_phrase(graph, found),
        )

    assert twin(num_layers=3, hidden=384, heads=6) is None  # 8 px, patch 2: inside
    assert twin(num_layers=3, hidden=384, heads=6, image_size=16, patch_size=4) == (
        384,
        2,
        8,
        "its twin with patch 2 at 8 px (the same 4 x 4 tokens), its patch embedding resized without changing "
        "what it computes",
    )
    # the 2 x 2 grid is trained at patch 4 (the checkpoint's third stage), and read at that patch
    assert twin(num_layers=3, hidden=384, heads=6, image_size=8, patch_size=4) is None
    assert twin(num_layers=3, hidden=384, heads=6, image_size=16, patch_size=8) == (
        384,
        4,
        8,
        "its twin with patch 4 at 8 px (the same 2 x 2 tokens), its patch embedding resized without changing what "
        "it computes",
    )
    # a grid coarser than any trained keeps its own (1 x 1); a finer one is predicted at the finest trained, 4 x 4
    assert twin(num_layers=3, hidden=384, heads=6, image_size=4, patch_size=4) is None
    assert twin(num_layers=3, hidden=384, heads=6, image_size=32, patch_size=2) == (
        384,
        2,
        8,
        "its twin with patch 2 at 8 px (4 x 4 tokens), its position table resized to its 16 x 16 tokens, its output "
        "layer scaled by 4/16",
    )
    assert twin(num_layers=12, hidden=768, heads=12, image_size=224, patch_size=16) == (
        256,
        2,
        8,
        "its 256-wide twin (4 heads), grown to its width, its patch embedding and position table resized from "
        "the twin's patch 2 at 8 px (4 x 4 tokens) to its 14 x 14 tokens, its output layer scaled by 4/14",
    )


def test_a_patch_size_is_read_against_those_trained_on_its_token_grid():
    """Patch 2 or 4 at 8 px trains 4 x 4 tokens at patch 2 and 2 x 2 at patch 4: a model at 16 px
    with patch 4 lies inside each extent's bounds, but its pair was never trained, and it is
    predicted at patch 2 on its grid (decoded directly it started at 2.73 on digits, its own
    init at 2.37; docs/experiments.md, "Training across token grids")."""
    across = load_checkpoint("logah-tiny-vits")
    graphs = [
        graphkit.trace(build_model(dict(VIT, num_layers=3, hidden=256, heads=4, patch_size=patch), "meta"))
        for patch in (2, 4)
    ]
    across.info = {**across.info, "space": training_space(graphs)}

    def twin(size, patch):
        graph = graphkit.trace(
            build_model(dict(VIT, num_layers=3, hidden=256, heads=4, image_size=size, patch_size=patch), "meta")
        )
        found = twin_of(across, graph)
        return found and (found.config["patch_size"], found.config["image_size"])

    assert twin(8, 2) is None and twin(8, 4) is None  # trained pairs: decoded directly
    assert twin(16, 4) == (2, 8)  # inside both bounds, an untrained pair: patch 2 on its 4 x 4 grid
    assert twin(32, 8) == (2, 8)
    assert twin(16, 8) == (4, 8)  # 2 x 2 tokens: the patch trained there
    assert twin(24, 8) == (4, 8)  # 3 x 3 tokens, between the trained grids: the coarser one, upsampled
    assert twin(64, 4) == (2, 8)  # finer than any trained grid: the finest, at its patch
    # a checkpoint from before the pairs were recorded reads the patch bounds alone
    across.info["space"] = {key: value for key, value in across.info["space"].items() if key != "patch_by_grid"}
    assert twin(16, 4) is None


def test_a_model_with_parts_its_family_config_lacks_has_no_twin_and_is_decoded_directly(vits):
    """A distilled DeiT's distillation token is no part of a ``vit`` config: a twin read back
    from the graph would lack it (predict raised KeyError)."""
    model = timm_vit("deit_tiny_distilled_patch16_224", num_classes=10)
    graph = graphkit.trace(model)
    assert twin_of(vits, graph) is None
    written = predict(model, vits, graph=graph)
    assert written.keys() == {name for name, _ in model.named_parameters()}
    torch.testing.assert_close(written["pos_embed"], predicted_params(vits, graph, grow=False)["pos_embed"])


def test_a_timm_variant_is_predicted_through_a_twin_with_its_parts(vits):
    """CLIP's ViT (a norm on the stream before the blocks, no patch-embedding bias) has a twin
    since its config reads the pre-norm: at 16 px with patch 4 its own config at 8 px with patch 2."""
    model = timm_vit("vit_base_patch32_clip_224", embed_dim=256, depth=3, num_heads=4, img_size=16, patch_size=4)
    graph = graphkit.trace(model)
    twin = twin_of(vits, graph)
    assert twin is not None and (twin.config["pre_norm"], twin.config["patch_size"], twin.config["image_size"]) == (
        True,
        2,
        8,
    )
    params = predicted_params(vits, graph, grow=twin)
    expected = predicted_params(vits, graphkit.trace(twin.model))
    assert params.keys() == expected.keys() == {name for name, _ in model.named_parameters()}
    for name, value in params.items():
        resized = name == "patch_embed.proj.weight"
        torch.testing.assert_close(value, resize_patches(expected[name], (4, 4)) if resized else expected[name])


def test_a_layer_scale_vit_is_predicted_as_the_plain_vit_it_computes(vits):
    """DeiT-III (layer scale, a position table for the patches only) at the trained shapes: the
    bundled ViT checkpoint never saw layer scale's op, so the model is refused as itself and
    predicted as its plain twin, whose prediction is converted: gains at 1, the table's class row
    added to the class token, so that the model computes what the predicted plain ViT computes.
    That checkpoint, not the one trained across families, is the one bundled for it."""
    model = timm_vit("deit3_small_patch16_224", embed_dim=256, depth=3, num_heads=4, img_size=8, patch_size=2)
    graph = graphkit.trace(model)
    assert bundled_for(graph).name == "logah-tiny-vits"
    with pytest.raises(UntrainedOpError, match="has op 'scale'.*and without layer scale"):
        check_graph(vits, graph)
    check_graph(vits, graph, plain=True)
    twin = twin_of(vits, graph)
    assert twin is not None and twin.plain is not None and twin.plain.options == ("no_embed_class", "init_values")
    assert not {"no_embed_class", "init_values"} & set(twin.config) and twin.config["hidden"] == 256
    assert twin_phrase(graph, twin) == (
        "its twin with its prefix tokens' positions in the position table (added to the tokens) and without layer "
        "scale (its gains set to 1) without changing what it computes"
    )
    params = predicted_params(vits, graph, grow=twin)
    plain = predicted_params(vits, graphkit.trace(twin.model))
    assert params.keys() == {name for name, _ in model.named_parameters()}
    assert torch.equal(params["blocks.2.ls2.gamma"], torch.ones(256))
    torch.testing.assert_close(params["cls_token"], plain["cls_token"] + plain["pos_embed"][:, :1])
    torch.testing.assert_close(params["blocks.1.attn.qkv.weight"], plain["blocks.1.attn.qkv.weight"])
    written = predict(model, vits, graph=graph)
    ours, theirs = model.to_empty(device="cpu"), build_model(twin.config, "cpu")
    ours.load_state_dict(written), theirs.load_state_dict(plain)
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(images), theirs.eval()(images), rtol=1e-5, atol=1e-5)
    with pytest.raises(UntrainedOpError, match="has op 'scale'"):
        predict(
            timm_vit("deit3_small_patch16_224", embed_dim=256, depth=3, num_heads=4, img_size=8, patch_size=2),
            vits,
            grow=False,
        )


def hf_vit(**fields):
    from transformers import ViTConfig, ViTForImageClassification  # noqa: PLC0415

    config = dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, intermediate_size=1024, num_labels=10)
    return meta(lambda: ViTForImageClassification(ViTConfig(**{**config, **fields})))


def test_a_transformers_vit_is_predicted_as_the_timm_vit_it_computes(vits):
    """transformers' ViT is timm's with q, k and v apart and other names: inside the space its
    twin is that timm ViT at its own shapes, and every parameter predicted is the timm ViT's
    prediction, renamed, q, k and v the fused projection's row blocks; without the model at hand
    there is no twin."""
    model = hf_vit(image_size=8, patch_size=2)
    graph = graphkit.trace(model)
    assert twin_of(vits, graph) is None
    twin = twin_of(vits, graph, model)
    assert twin is not None and twin.renaming is not None and twin.config["family"] == "vit"
    assert (twin.config["hidden"], twin.config["image_size"], twin.config["patch_size"]) == (256, 8, 2)
    assert twin_phrase(graph, twin) == EQUIVALENT and lr_scale(graph, twin) == {}
    params = predicted_params(vits, graph, grow=twin)
    timm_params = predicted_params(vits, graphkit.trace(twin.model))
    assert params.keys() == {name for name, _ in model.named_parameters()}
    fused = timm_params["blocks.1.attn.qkv.weight"]
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        torch.testing.assert_close(params[f"vit.layers.1.attention.{name}.weight"], fused[i * 256 : (i + 1) * 256])
    torch.testing.assert_close(params["classifier.weight"], timm_params["head.weight"])
    torch.testing.assert_close(params["vit.embeddings.position_embeddings"], timm_params["pos_embed"])


def test_a_transformers_vit_outside_the_space_is_grown_from_its_timm_twin(vits):
    """At 16 px with patch 4 (the trained 4 x 4 tokens) the twin is the timm ViT at 8 px with
    patch 2, its kernel resized; at ViT-B's shape and 224 px, the 256-wide timm ViT, grown and
    resized, each grown weight at the widths' ratio in fine-tuning."""
    model = hf_vit(image_size=16, patch_size=4)
    graph = graphkit.trace(model)
    twin = twin_of(vits, graph, model)
    assert twin is not None and (twin.config["patch_size"], twin.config["image_size"]) == (2, 8)
    assert twin_phrase(graph, twin) == (
        f"{EQUIVALENT}, its twin with patch 2 at 8 px (the same 4 x 4 tokens), its patch embedding resized without "
        "changing what it computes"
    )
    kernel = "vit.embeddings.patch_embeddings.projection.weight"
    assert lr_scale(graph, twin) == {kernel: 1 / 4}
    params = predicted_params(vits, graph, grow=twin)
    expected = predicted_params(vits, graphkit.trace(twin.model))
    torch.testing.assert_close(params[kernel], resize_patches(expected["patch_embed.proj.weight"], (4, 4)))
    torch.testing.assert_close(params["vit.layers.2.mlp.fc2.weight"], expected["blocks.2.mlp.fc2.weight"])
    base = hf_vit(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    graph = graphkit.trace(base)
    twin = twin_of(vits, graph, base)
    assert twin is not None and (twin.config["hidden"], twin.config["heads"], twin.config["image_size"]) == (256, 4, 8)
    assert twin_phrase(graph, twin).startswith(f"{EQUIVALENT}, its 256-wide twin (4 heads), grown to its width, ")
    factors = lr_scale(graph, twin)
    assert factors["vit.layers.0.attention.k_proj.weight"] == 256 / 768 and factors[kernel] == 1 / 64
    # grown: k's first 256 rows are the twin's k rows (the fused projection's second block), each
    # row's values split among the copies of the input coordinate they read, summing to the twin's
    wide = hf_vit(hidden_size=640, num_hidden_layers=6, num_attention_heads=10, intermediate_size=640)
    graph = graphkit.trace(wide)
    twin = twin_of(vits, graph, wide)
    assert twin is not None and twin.config["hidden"] == 256
    params = predicted_params(vits, graph, grow=twin)
    fused = predicted_params(vits, graphkit.trace(twin.model))["blocks.4.attn.qkv.weight"]
    k = params["vit.layers.4.attention.k_proj.weight"]
    assert k.shape == (640, 640) and fused.shape == (768, 256)
    torch.testing.assert_close(k[:256].sum(1), fused[256:512].sum(1), rtol=1e-4, atol=1e-5)


def test_a_transformers_deit_is_predicted_through_a_twin_of_its_own_class(vits):
    """DeiT's distillation token has no timm ViT to be: at 224 px its twin is its own class,
    256 wide, at 8 px with patch 2, found through the model."""
    from transformers import DeiTConfig, DeiTForImageClassification  # noqa: PLC0415

    model = meta(lambda: DeiTForImageClassification(DeiTConfig(num_labels=10)))
    graph = graphkit.trace(model)
    twin = twin_of(vits, graph, model)
    assert twin is not None and twin.renaming is None and type(twin.model) is DeiTForImageClassification
    assert twin.config == {"hidden": 256, "heads": 4, "patch_size": 2, "image_size": 8}


def test_a_resized_patch_embedding_gives_the_twins_tokens_on_a_patch_upscaled_as_the_data_is():
    weight = torch.randn(16, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    patches = torch.rand(5, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    upscaled = F.interpolate(patches, size=(8, 8), mode="bilinear", align_corners=False, antialias=False)
    resized = resize_patches(weight, (8, 8))
    assert resized.shape == (16, 3, 8, 8)
    torch.testing.assert_close(F.conv2d(upscaled, resized), F.conv2d(patches, weight), rtol=1e-4, atol=1e-4)


def test_a_resized_position_table_keeps_its_prefix_and_interpolates_its_grid():
    ramp = torch.linspace(0, 1, 4).repeat(4)  # 4 x 4 grid, rising left to right
    table = torch.stack([ramp, torch.ones(16)], dim=1)  # a column that varies, one that is constant
    table = torch.cat([torch.tensor([[7.0, -7.0]]), table]).unsqueeze(0)  # a class token first
    resized = resize_positions(table, 1 + 8 * 8, 8)
    assert resized.shape == (1, 65, 2) and resized[0, 0].tolist() == [7.0, -7.0]
    grid = resized[0, 1:].reshape(8, 8, 2)
    torch.testing.assert_close(grid[..., 1], torch.ones(8, 8))  # constant stays constant
    assert (grid[:, 1:, 0] >= grid[:, :-1, 0] - 1e-6).all() and grid[0, -1, 0] > grid[0, 0, 0] + 0.5  # still a ramp
    torch.testing.assert_close(grid[0, :, 0], grid[7, :, 0])  # the same along the other axis
    with pytest.raises(GrowError, match=r"cannot resize a position table of shape \(1, 17, 2\) to 49 tokens"):
        resize_positions(table, 49, 7)  # no prefix: its 17 rows are no square grid


def test_what_a_twin_makes_smaller_fine_tunes_at_the_ratio_of_the_sizes(vits):
    """A kernel resized to a larger one at the ratio of the kernels' areas; a weight whose input
    axis was grown (its values split among copies) at the ratio of the widths; both, their
    product; everything else, and every model without a twin, at one lr."""

    def scales(**shape):
        graph = graphkit.trace(build_model(dict(VIT, **shape), "meta"))
        return lr_scale(graph, twin_of(vits, graph))

    readers = {"attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"}
    assert scales(num_layers=3, hidden=384, heads=6) == {}  # inside the space: no twin
    assert scales(num_layers=3, hidden=384, heads=6, image_size=16, patch_size=4) == {"patch_embed.proj.weight": 1 / 4}
    assert scales(num_layers=3, hidden=384, heads=6, image_size=32, patch_size=2) == {}  # a finer grid at patch 2
    wider = scales(num_layers=3, hidden=768, heads=12)  # grown from 512, its kernel as trained
    assert wider == {f"blocks.{i}.{name}": 512 / 768 for i in range(3) for name in readers} | {"head.weight": 512 / 768}
    vit_b = scales(num_layers=12, hidden=768, heads=12, image_size=224, patch_size=16)  # the twin: 256 wide, patch 2
    assert vit_b == {f"blocks.{i}.{name}": 256 / 768 for i in range(12) for name in readers} | {
        "head.weight": 256 / 768,
        "patch_embed.proj.weight": 1 / 64,  # it reads the image's 3 channels, which do not grow
    }


def test_predict_resizes_the_patch_embedding_of_the_twins_prediction_and_keeps_the_rest(vits):
    config = resolve_config(dict(VIT, num_layers=3, hidden=384, heads=6, image_size=16, patch_size=4))
    graph = graphkit.trace(build_model(config, "meta"))
    twin = predicted_params(vits, graphkit.trace(twin_of(vits, graph).model))
    params = predicted_params(vits, graph)
    direct = predicted_params(vits, graph, grow=False)
    assert params.keys() == twin.keys()
    for name, value in params.items():
        expected = resize_patches(twin[name], (4, 4)) if name == "patch_embed.proj.weight" else twin[name]
        torch.testing.assert_close(value, expected)
    assert not torch.allclose(direct["patch_embed.proj.weight"], params["patch_embed.proj.weight"])


def test_predict_resizes_the_position_table_of_the_twins_prediction_on_a_new_token_grid(vits):
    config = resolve_config(dict(VIT, num_layers=3, hidden=384, heads=6, image_size=32, patch_size=4))
    graph = graphkit.trace(build_model(config, "meta"))
    twin = predicted_params(vits, graphkit.trace(twin_of(vits, graph).model))
    params = predicted_params(vits, graph)
    assert params["pos_embed"].shape == (1, 65, 384) and twin["pos_embed"].shape == (1, 17, 384)
    torch.testing.assert_close(params["pos_embed"], resize_positions(twin["pos_embed"], 65, 8))
    torch.testing.assert_close(
        params["patch_embed.proj.weight"], resize_patches(twin["patch_embed.proj.weight"], (4, 4))
    )
    # the output layer is scaled by the grids' ratio (4 x 4 to 8 x 8): a temperature on the logits
    assert logit_scale(graph, twin_of(vits, graph)) == 0.5
    for name in ("head.weight", "head.bias"):
        torch.testing.assert_close(params[name], 0.5 * twin[name], msg=name)
    for name in params.keys() - {"pos_embed", "patch_embed.proj.weight", "head.weight", "head.bias"}:
        torch.testing.assert_close(params[name], twin[name], msg=name)


def test_a_grid_between_trained_ones_is_predicted_at_the_trained_one_below():
    space = {"grid": [2, 8], "patch_by_grid": {"2": [4, 4], "4": [2, 2], "8": [2, 2]}}
    assert [grid_to_predict(space, grid) for grid in (1, 2, 3, 4, 6, 7, 8, 14, None)] == [1, 2, 2, 4, 4, 4, 8, 8, None]
    # a checkpoint from before patch_by_grid: its bounds alone
    assert [grid_to_predict({"grid": [2, 4]}, grid) for grid in (3, 14)] == [3, 4]
    assert grid_to_predict({}, 14) == 14


def test_outside_the_trained_token_grid_the_warning_says_the_own_init_is_expected_to_be_better(vits):
    def warning(**shape):
        return outside_training_space(vits.info, graphkit.trace(build_model(dict(VIT, **shape), "meta")))

    assert warning(num_layers=3, hidden=384, heads=6) is None
    assert warning(num_layers=3, hidden=384, heads=6, image_size=16, patch_size=4) == (
        "resolution 16 px is 2.0x the largest trained (8 px)"
    )
    assert warning(num_layers=3, hidden=384, heads=6, image_size=16, patch_size=8) == (
        "resolution 16 px is 2.0x the largest trained (8 px), patch size 8 px is 2.0x the largest trained (4 px)"
    )
    assert warning(num_layers=3, hidden=384, heads=6, image_size=32, patch_size=4) == (
        "resolution 32 px is 4.0x the largest trained (8 px), "
        f"token grid 8 tokens a side is 2.0x the largest trained (4 tokens a side), {GRID_CAVEAT}"
    )
    # 3 x 3 lies inside the grids' bounds, between the 2 x 2 and 4 x 4 trained (2.87 at step 0, own init 2.36)
    assert warning(num_layers=3, hidden=384, heads=6, image_size=12, patch_size=4) == (
        "resolution 12 px is 1.5x the largest trained (8 px), "
        f"token grid 3 tokens a side lies between the trained ones (2 and 4 tokens a side), {GRID_CAVEAT}"
    )


def test_above_the_trained_resolutions_a_model_with_a_convolution_stem_is_warned_too():
    """LeViT reads its image through convolutions: no token grid to predict it at. At 224 px the
    vision zoo's checkpoint (32-128 px) started it at 3.15 against its own init's 2.26."""
    space = {"space": {"resolution": [32, 128], "grid": [2, 16]}}
    levit, small, swin = (
        graphkit.trace(load_model_source(f"timm:{name}", weights=False).model)
        for name in ("levit_128s", "levit_128s?img_size=128", "swin_tiny_patch4_window7_224")
    )
    assert (
        outside_training_space(space, levit) == f"resolution 224 px is 1.8x the largest trained (128 px), {GRID_CAVEAT}"
    )
    assert outside_training_space(space, small) is None
    assert outside_training_space(space, swin) == (  # said once, after its token grid
        "resolution 224 px is 1.8x the largest trained (128 px), "
        f"token grid 56 tokens a side is 3.5x the largest trained (16 tokens a side), {GRID_CAVEAT}"
    )


def hand_written_vit(
    tmp_path, image: int = 32, patch: int = 4, fixed: bool = False, width: int = 64, heads: int = 2
) -> ModelFile:
    """tests/model_files/torch_vit.py (a ViT of torch layers, 2 layers) at ``image`` px with ``patch``."""
    source = (MODEL_FILES / "torch_vit.py").read_text()
    shape = "IMAGE, PATCH, WIDTH, DEPTH, HEADS = "
    source = source.replace(f"{shape}32, 4, 64, 2, 2", f"{shape}{image}, {patch}, {width}, 2, {heads}")
    path = tmp_path / f"torch_vit_{image}_{patch}_{fixed}_{width}.py"
    path.write_text(source.replace("FIXED = False", f"FIXED = {fixed}"))
    return load_model_file(path)


def test_a_hand_written_vit_outside_the_trained_grid_is_its_own_twin_at_a_trained_one(vits, tmp_path):
    loaded = hand_written_vit(tmp_path)  # 8 x 8 tokens of patch 4: outside the 4 x 4 of patch 2 trained
    model, inputs = loaded.model, loaded.example_inputs
    before = {name: p.clone() for name, p in model.named_parameters()}
    graph = graphkit.trace(model, inputs)
    assert twin_of(vits, graph) is None  # no config describes it: the model itself is needed
    twin = twin_of(vits, graph, model, inputs)
    assert twin is not None and twin.config == {"hidden": 64, "patch_size": 2, "image_size": 8}
    assert twin.graph is not None and (extent(twin.graph)["patch"], extent(twin.graph)["grid"]) == (2, 4)
    shapes = {name: shape for node in twin.graph.nodes for name, shape in node.params.items()}
    assert shapes["patch.weight"] == (64, 3, 2, 2) and shapes["pos"] == (1, 17, 64)
    assert all(p.is_meta for p in twin.model.parameters())
    for name, p in model.named_parameters():  # the model is read, not changed
        assert p.device.type == "cpu" and torch.equal(p, before[name]), name
    assert copied_twin(model, graph, 64, (2, 4)) is None  # its inputs cannot be guessed: it reads no image size
    assert "its twin with patch 2 at 8 px (4 x 4 tokens)" in twin_phrase(graph, twin)
    assert lr_scale(graph, twin) == {"patch.weight": 0.25}

    expected = vits.predict(twin.graph)
    params = predicted_params(vits, graph, grow=twin)
    torch.testing.assert_close(params["pos"], resize_positions(expected["pos"], 65, 8))
    torch.testing.assert_close(params["patch.weight"], resize_patches(expected["patch.weight"], (4, 4)))
    torch.testing.assert_close(params["head.weight"], 0.5 * expected["head.weight"])  # the grids' ratio, 4/8
    torch.testing.assert_close(params["blocks.0.linear1.weight"], expected["blocks.0.linear1.weight"])
    assert not torch.allclose(params["pos"], predicted_params(vits, graph, grow=False)["pos"])


def test_a_hand_written_vit_predicted_through_its_twin_computes_the_twins_function_on_upscaled_images(vits, tmp_path):
    # 16 px with patch 4 is the twin's 4 x 4 tokens of patch 2 at 8 px: the resize is exact there
    loaded = hand_written_vit(tmp_path, image=16, patch=4)
    graph = graphkit.trace(loaded.model, loaded.example_inputs)
    twin = twin_of(vits, graph, loaded.model, loaded.example_inputs)
    assert twin is not None and twin.config["image_size"] == 8
    small = hand_written_vit(tmp_path, image=8, patch=2).model  # the twin, built with weights
    small.load_state_dict(vits.predict(twin.graph))
    predict(loaded.model, vits, example_inputs=loaded.example_inputs)
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    # each 2 x 2 patch upscaled to 4 x 4 on its own, as the resize assumes (a whole image's resize blends patches)
    patches = images.reshape(3, 3, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(-1, 3, 2, 2)
    upscaled = F.interpolate(patches, size=(4, 4), mode="bilinear", align_corners=False, antialias=False)
    upscaled = upscaled.reshape(3, 4, 4, 3, 4, 4).permute(0, 3, 1, 4, 2, 5).reshape(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.eval()(upscaled), small.eval()(images), rtol=1e-4, atol=1e-4)


def test_a_hand_written_vit_whose_forward_fixes_its_image_size_is_decoded_directly(vits, tmp_path):
    loaded = hand_written_vit(tmp_path, fixed=True)
    graph = graphkit.trace(loaded.model, loaded.example_inputs)
    assert twin_of(vits, graph, loaded.model, loaded.example_inputs) is None
    predict(loaded.model, vits, example_inputs=loaded.example_inputs)  # still predicted, as it was before
    inside = hand_written_vit(tmp_path, image=8, patch=2)  # inside the space: no twin wanted
    assert (
        twin_of(vits, graphkit.trace(inside.model, inside.example_inputs), inside.model, inside.example_inputs) is None
    )


def test_a_hand_written_vit_wider_than_the_space_is_grown_from_a_narrowed_copy_that_computes_it(vits, tmp_path):
    """Twice the widest trained at its depth (2 layers: 512), at the trained grid: its copy at 512
    with 8 heads of the same size is the twin, and the grown model computes what the twin does."""
    loaded = hand_written_vit(tmp_path, image=8, patch=2, width=1024, heads=16)
    graph = graphkit.trace(loaded.model, loaded.example_inputs)
    twin = twin_of(vits, graph, loaded.model, loaded.example_inputs)
    assert twin is not None and twin.config == {"hidden": 512, "heads": 8}
    assert (
        twin_phrase(graph, twin) == "its 512-wide twin (8 heads), grown to its width without changing what it computes"
    )
    assert twin.model.blocks[0].self_attn.num_heads == 8 and twin.model.blocks[0].linear1.out_features == 2048
    small = hand_written_vit(tmp_path, image=8, patch=2, width=512, heads=8).model  # the twin, with weights
    small.load_state_dict(vits.predict(twin.graph))
    predict(loaded.model, vits, example_inputs=loaded.example_inputs)
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.eval()(images), small.eval()(images), rtol=1e-4, atol=1e-4)
    assert lr_scale(graph, twin)["blocks.0.linear1.weight"] == 0.5  # reads the grown width


def test_a_hand_written_vit_wider_than_the_space_and_off_its_grid_is_narrowed_and_regridded_at_once(vits, tmp_path):
    """640 wide with 10 heads of 64, at 32 px with patch 4: its twin is its copy at 512 (8 heads)
    with patch 2 at 8 px. At its own width, regridded only, is what twin_of falls back to when the
    narrowed copy does not trace (the grid alone is a large part of the gap: a 12 x 384 ViT at
    224 px, 2.12 at step 0 regridded, decoded directly 5.46, own init 2.43)."""
    loaded = hand_written_vit(tmp_path, width=640, heads=10)  # the widest trained at 2 (3) layers: 512
    graph = graphkit.trace(loaded.model, loaded.example_inputs)
    assert whole_heads_width(graph, 512) == 512 and whole_heads_width(graph, 63) is None
    assert copied_twin(loaded.model, graph, 640, (2, 4), loaded.example_inputs).config == {
        "hidden": 640,
        "patch_size": 2,
        "image_size": 8,
    }
    twin = twin_of(vits, graph, loaded.model, loaded.example_inputs)
    assert twin is not None and twin.config == {"hidden": 512, "heads": 8, "patch_size": 2, "image_size": 8}


def test_nanogpt_is_grown_from_a_narrowed_copy_of_itself_that_computes_what_it_does(tmp_path):
    """nanoGPT (tied head, its own attention module with ``n_head`` and ``n_embd``) at 2 x 512 is
    twice the GPT-2 checkpoint's widest at its depth: its copy at 256 with 4 heads is the twin
    (the module's integer attributes narrowed with its parameters), and the grown model's logits
    are the twin's."""
    gpts = load_checkpoint("logah-tiny-gpts")
    model = load_model_file(MODEL_FILES / "nano_gpt.py").model
    graph = graphkit.trace(model)
    twin = twin_of(gpts, graph, model)
    assert twin is not None and twin.config == {"hidden": 256, "heads": 4}
    attention = twin.model.transformer.h[0].attn
    assert (attention.n_head, attention.n_embd) == (4, 256) and (model.transformer.h[0].attn.n_head == 8)
    assert twin.model.lm_head.weight is twin.model.transformer.wte.weight  # still tied, at the twin's width
    source = (MODEL_FILES / "nano_gpt.py").read_text().replace("= 2, 8, 512, 256, 64", "= 2, 4, 256, 256, 64")
    (tmp_path / "small.py").write_text(source)
    small = load_model_file(tmp_path / "small.py").model
    for target, params in ((small, gpts.predict(twin.graph)), (model, predicted_params(gpts, graph, grow=twin))):
        assert target.load_state_dict(params, strict=False).missing_keys == ["lm_head.weight"]  # the tied table
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # given targets, nanoGPT returns every position's logits
        grown, twin_logits = (m(tokens[:, :-1], tokens[:, 1:].contiguous())[0] for m in (model, small))
    torch.testing.assert_close(grown, twin_logits, rtol=1e-4, atol=1e-4)

"""The tracer on every model family the issue names, plus the rarer vocabulary ops."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch
from helpers import MODEL_FILES, ROOT, assert_golden_fingerprint, gpt2, llama, meta, mistral, timm_vit
from torch import nn

import graphkit
import graphkit.tracing as tracing
from graphkit import TraceError, example_inputs_for
from graphkit.modelfile import load_model_file
from graphkit.tracing import builder, naming, spatial
from graphkit.tracing.builder import graph_from_export


def attention_nodes(graph):
    return [n for n in graph.nodes if n.op == "attention"]


def owner(graph, param):
    return next(n for n in graph.nodes if param in n.params)


TIMM_VITS = [
    ("vit_tiny_patch16_224", {}, 12, 3),
    ("vit_small_patch16_224", {}, 12, 6),
    ("vit_base_patch16_224", {}, 12, 12),
    ("vit_large_patch16_224", {}, 24, 16),
    ("vit_base_patch32_224", {}, 12, 12),
    ("vit_small_patch16_224", {"img_size": 32, "patch_size": 2, "num_classes": 10}, 12, 6),
    ("deit_tiny_patch16_224", {}, 12, 3),
]


@pytest.mark.parametrize("name,kwargs,depth,heads", TIMM_VITS, ids=lambda v: str(v) if isinstance(v, str) else None)
def test_timm_vit(name, kwargs, depth, heads):
    model = timm_vit(name, **kwargs)
    graph = graphkit.trace(model)
    attn = attention_nodes(graph)
    assert len(attn) == depth
    assert {(a.attrs["heads"], a.attrs["kv_heads"], a.attrs["causal"]) for a in attn} == {(heads, heads, False)}
    # the class token and positional embedding are owned by nodes on the data path
    assert owner(graph, "cls_token").op == "class_token"
    assert owner(graph, "pos_embed").op == "pos_embedding"
    patch = owner(graph, "patch_embed.proj.weight")
    assert patch.op == "patch_embed" and patch.attrs["kernel"] == patch.attrs["stride"]
    assert owner(graph, "head.weight").op == "head"
    assert graph.meta["family"] == "vit"
    assert graph.num_params == sum(p.numel() for p in model.parameters())


def test_deit_distilled_has_two_heads_and_both_tokens():
    graph = graphkit.trace(timm_vit("deit_tiny_distilled_patch16_224"))
    tokens = owner(graph, "cls_token")
    assert tokens.op == "class_token" and set(tokens.params) == {"cls_token", "dist_token"}
    assert {n.name for n in graph.nodes if n.op == "head"} == {"head", "head_dist"}


def test_vit_average_pool_head():
    graph = graphkit.trace(timm_vit("vit_small_patch16_224", global_pool="avg", class_token=False, depth=4))
    assert "class_token" not in graph.op_counts()
    pool = [n for n in graph.nodes if n.op == "mean_pool"]
    assert len(pool) == 1
    succ = {d for s, d in graph.edges if graph.nodes[s] is pool[0]}
    assert graph.nodes[min(succ)].op == "layer_norm"  # fc_norm, then the head


@pytest.mark.parametrize("tied", [False, True])
def test_gpt2_lm_head(tied):
    graph = graphkit.trace(gpt2(tied=tied))
    head = next(n for n in graph.nodes if n.name == "lm_head")
    out = next(i for i, n in enumerate(graph.nodes) if n.op == "output")
    assert head.op == "head"
    assert (graph.nodes.index(head), out) in graph.edges  # connected, unlike GHN-3's graphs
    if tied:
        assert head.params == {} and head.attrs["tied"] == ["transformer.wte.weight"]
    else:
        assert head.params == {"lm_head.weight": (50257, 64)}
    wpe = owner(graph, "transformer.wpe.weight")
    assert wpe.op == "pos_embedding" and owner(graph, "transformer.wte.weight").op == "embedding"
    attn = attention_nodes(graph)
    assert len(attn) == 3 and all(a.attrs["causal"] and a.attrs["heads"] == 4 for a in attn)
    c_attn = owner(graph, "transformer.h.0.attn.c_attn.weight")
    assert c_attn.op == "linear" and c_attn.attrs["transposed"] and c_attn.attrs["out_features"] == 192


def test_gpt2_model_without_head():
    graph = graphkit.trace(gpt2(headless=True))
    assert "head" not in graph.op_counts()
    assert len(attention_nodes(graph)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("kv_heads,kind", [(8, "MHA"), (2, "GQA"), (1, "MQA")])
def test_hf_llama_attention_layouts(kv_heads, kind):
    graph = graphkit.trace(llama(kv_heads=kv_heads))
    layout = graph.attention_layout()
    assert layout == [
        dict(kind=kind, heads=8, kv_heads=kv_heads, head_dim=8, causal=True, window=None, rope=True, layers=3)
    ]
    ops = graph.op_counts()
    assert ops["rms_norm"] == 7 and ops["silu"] == 3 and ops["mul"] == 3  # SwiGLU gate
    assert ops["rotary_embedding"] == 1
    assert owner(graph, "model.layers.2.self_attn.k_proj.weight").params["model.layers.2.self_attn.k_proj.weight"] == (
        kv_heads * 8,
        64,
    )


def test_hf_mistral_sliding_window():
    graph = graphkit.trace(mistral(window=16))
    assert {(a.attrs["window"], a.attrs["kv_heads"]) for a in attention_nodes(graph)} == {(16, 2)}
    assert graph.meta["family"] == "mistral"


def test_hand_written_llama_block():
    loaded = load_model_file(graphkit_root() / "examples" / "llama_block.py")
    graph = graphkit.trace(loaded.model, loaded.example_inputs)
    assert graph.attention_layout() == [
        dict(kind="GQA", heads=8, kv_heads=2, head_dim=16, causal=True, window=None, rope=True, layers=4)
    ]
    assert graph.op_counts()["rms_norm"] == 9
    assert graph.meta["family"] == "custom"


def graphkit_root():

    return ROOT


@pytest.mark.parametrize(
    "build",
    [
        lambda: gpt2(layers=4),
        lambda: llama(layers=4),
        lambda: mistral(layers=4),
        lambda: timm_vit("vit_tiny_patch16_224", depth=5),
    ],
    ids=["gpt2", "llama", "mistral", "vit"],
)
@pytest.mark.slow
def test_folding_repeated_blocks_changes_nothing(build):
    model = build()
    folded, full = graphkit.trace(model), graphkit.trace(model, fold_repeats=False)
    assert folded == full
    assert folded.fingerprint() == full.fingerprint()


@pytest.mark.parametrize("family", ["gpt2", "llama", "vit"])
def test_eager_and_sdpa_attention_give_the_same_graph(family):
    if family == "vit":
        fused = timm_vit("vit_tiny_patch16_224", depth=3)
        eager = timm_vit("vit_tiny_patch16_224", depth=3)
        for block in eager.blocks:
            block.attn.fused_attn = False
    else:
        build = gpt2 if family == "gpt2" else llama
        fused, eager = build(attn_implementation="sdpa"), build(attn_implementation="eager")
    assert graphkit.trace(fused).fingerprint() == graphkit.trace(eager).fingerprint()


def test_real_weights_and_meta_give_the_same_graph():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    on_cpu = GPT2LMHeadModel(config)
    real, fake = graphkit.trace(on_cpu), graphkit.trace(meta(lambda: GPT2LMHeadModel(config)))
    # only a model with weights says which 1-D parameters its constructor fills with a constant
    assert real.meta.pop("init")["transformer.ln_f.weight"] == 1.0 and "init" not in fake.meta
    assert real == fake


def test_exotic_ops(exotic_graph):
    ops = exotic_graph.op_counts()
    for op in ("alibi", "attention", "moe", "mean_pool", "softcap", "head", "other:aten.cumsum"):
        assert op in ops, op
    attn = attention_nodes(exotic_graph)[0]
    assert attn.attrs["alibi"] and attn.attrs["causal"]  # eager softmax with a tril mask
    assert next(n for n in exotic_graph.nodes if n.op == "softcap").attrs["cap"] == 30.0
    assert next(n for n in exotic_graph.nodes if n.op == "moe").attrs == {
        "num_experts": 4,
        "top_k": 2,
        "intermediate_size": 32,
    }


def test_example_inputs_are_built_for_images_and_token_ids():
    args, kwargs = graphkit.example_inputs_for(timm_vit("vit_small_patch16_224", img_size=32, patch_size=4))
    assert args[0].shape == (2, 3, 32, 32) and args[0].device.type == "meta"
    args, kwargs = graphkit.example_inputs_for(gpt2())
    assert kwargs["input_ids"].shape[1] >= 2 and kwargs["use_cache"] is False


def test_an_image_classifier_on_a_multimodal_config_gets_images_of_its_vision_size():
    """CLIP's image classifier has a text tower's vocabulary in its config beside the vision
    tower's image size; it was given token ids, and its forward failed on the missing images."""
    from transformers import CLIPConfig, CLIPForImageClassification

    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    with torch.device("meta"):
        model = CLIPForImageClassification(CLIPConfig(vision_config={**vision, "num_hidden_layers": 1}))
    args, kwargs = graphkit.example_inputs_for(model)
    assert args[0].shape == (2, 3, 32, 32) and not kwargs


def test_a_transformers_image_model_without_an_image_size_gets_imagenet_sized_images():
    """ResNet's, RegNet's, BiT's, CvT's and SegFormer's configs give no image size: their
    classifiers were refused ("cannot guess example inputs"); they take ImageNet's 224 px, with
    the config's channels."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    with torch.device("meta"):
        model = ResNetForImageClassification(config)
    args, kwargs = graphkit.example_inputs_for(model)
    assert args[0].shape == (2, 1, 224, 224) and not kwargs
    graph = graphkit.trace(model)
    assert graph.meta["input_shapes"] == [[2, 1, 224, 224]] and graph.op_counts()["conv"] >= 3


@pytest.mark.parametrize("name", ["resnet18", "vit_small_r26_s32_224", "efficientnet_b0"])
def test_a_timm_model_built_for_other_channels_gets_images_of_them(name):
    """timm's ``input_size`` says 3 channels whatever ``in_chans`` a model was built with: a
    grey-scale ResNet, a hybrid ViT (its patch embedding projects a CNN's features) and an
    EfficientNet were given RGB images and failed in their first convolution; the convolution
    timm's config names ``first_conv`` says what they read, wrapped by transformers too."""
    import timm
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    with torch.device("meta"):
        model = timm.create_model(name, in_chans=1, num_classes=10)
    args, _ = graphkit.example_inputs_for(model)
    assert args[0].shape == (2, 1, 224, 224)
    with torch.device("meta"):
        wrapped = TimmWrapperForImageClassification(TimmWrapperConfig(architecture=name, model_args={"in_chans": 1}))
    assert graphkit.example_inputs_for(wrapped)[0][0].shape == (2, 1, 224, 224)


def test_a_decoder_that_cross_attends_traces_without_example_inputs():
    """TrOCR's decoder runs its cross-attention only when given encoder states: the zoo traced it
    with them and ``graphkit trace hf:trocr`` refused it (the cross-attention's weights unread);
    ``trace`` now tries guessed inputs that leave a parameter unread once more, with them. Its
    token ids, integers beside the float states, stay its data."""
    from transformers import TrOCRConfig, TrOCRForCausalLM

    config = TrOCRConfig(decoder_layers=1, d_model=32, decoder_attention_heads=2, decoder_ffn_dim=64, vocab_size=64)
    with torch.device("meta"):
        model = TrOCRForCausalLM(config)
    graph = graphkit.trace(model)
    assert graph.op_counts()["attention"] == 2 and graph.meta["input_shapes"] == [[2, 256], [2, 4, 32]]
    # its token ids are data beside the float states, not constants that say how to read them (as
    # SigLIP 2's grid shapes are): read as one, the token table was a position table
    table = next(n for n in graph.nodes if "model.decoder.embed_tokens.weight" in n.params)
    assert table.op == "embedding" and graph.op_counts()["pos_embedding"] == 1


def test_attention_heads_that_do_not_group_are_refused_not_misread():
    """XLNet keeps its attention sequence first, (tokens, batch, heads, features): read as batch
    first, its queries held 1 head and its values 2, and the graph said so. Its mask embedding
    (read only with a permutation target, as a masked-image token is) is spare; its segment
    bias needs token type ids."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    model = XLNetLMHeadModel(XLNetConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_inner=64))
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(TraceError, match="queries hold 1 and its values 2, which do not group"):
        graphkit.trace(model, {"input_ids": ids, "token_type_ids": ids})


def test_clip_and_siglip_image_classifiers_trace_with_their_unused_towers_parts_spare():
    """CLIP's image classifier pools its vision tower before ``post_layernorm``, SigLIP's without
    its MAP head: both were refused ("not connected to the output"); those parameters are spare."""
    from transformers import CLIPConfig, CLIPForImageClassification, SiglipConfig, SiglipForImageClassification

    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    clip = CLIPForImageClassification(CLIPConfig(vision_config={**vision, "num_hidden_layers": 2}))
    graph = graphkit.trace(clip)
    assert set(graph.meta["spare"]) == {"vision_model.post_layernorm.weight", "vision_model.post_layernorm.bias"}
    assert graph.op_counts()["attention"] == 2
    siglip = SiglipForImageClassification(SiglipConfig(vision_config={**vision, "num_hidden_layers": 2}))
    spare = graphkit.trace(siglip).meta["spare"]
    assert spare and all(name.startswith("vision_model.head.") for name in spare)
    assert {name for name, _ in siglip.vision_model.head.named_parameters(prefix="vision_model.head")} == set(spare)


def test_hard_swish_and_hard_sigmoid_are_swish_and_sigmoid_as_modules_and_functions():
    """The piecewise-linear activations of mobile networks (PP-LCNet's squeeze-excitation gate is an
    ``nn.Hardsigmoid``) were ``other:aten.hardsigmoid``, which no hypernetwork predicts through."""
    from transformers import PPLCNetConfig, PPLCNetForImageClassification  # noqa: PLC0415 (slow to import)

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.gate = nn.Hardsigmoid()

        def forward(self, x):
            x = nn.functional.hardswish(self.conv(x))
            return x * self.gate(x) * nn.functional.hardsigmoid(x.mean((2, 3), keepdim=True))

    counts = graphkit.trace(Gate(), example_inputs=torch.randn(1, 3, 8, 8)).op_counts()
    assert counts["silu"] == 1 and counts["sigmoid"] == 2
    assert not [op for op in counts if op.startswith("other:")]
    counts = graphkit.trace(PPLCNetForImageClassification(PPLCNetConfig())).op_counts()
    assert counts["sigmoid"] >= 1 and not [op for op in counts if op.startswith("other:")]


def test_siglip2_reads_patches_of_any_grid_and_its_grid_inputs_are_constants():
    """SigLIP 2 (NaFlex) takes flattened patches with each image's grid (``spatial_shapes``) and a
    padding mask; it resizes its position table to each grid with arithmetic on ``spatial_shapes``,
    which became ``other:aten.abs`` and ``other:aten.prod`` nodes, and its patch Linear refused
    the guessed 224-px images. Integer inputs beside the images are constants now: the resized
    table is the table, and the graph does not depend on the grid it was traced at."""
    from transformers import Siglip2Config, Siglip2ForImageClassification  # noqa: PLC0415 (slow to import)

    vision = {"patch_size": 4, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    config = Siglip2Config(vision_config={**vision, "num_hidden_layers": 2, "num_patches": 16})
    torch.manual_seed(0)
    real = Siglip2ForImageClassification(config)
    args, kwargs = example_inputs_for(real)
    assert not args and kwargs["pixel_values"].shape == (2, 16, 3 * 4 * 4)
    assert kwargs["spatial_shapes"].tolist() == [[4, 4], [4, 4]]
    assert kwargs["pixel_attention_mask"].tolist() == [[1] * 16] * 2
    graph = graphkit.trace(real)  # on meta its mask has no values: predict builds it on the CPU (NeedsValuesError)
    counts = graph.op_counts()
    assert not [op for op in counts if op.startswith("other:")], counts
    assert counts["attention"] == 2 and counts["pos_embedding"] == 1 and "div" not in counts and "mul" not in counts
    assert owner(graph, "vision_model.embeddings.position_embedding.weight").op == "pos_embedding"
    assert not any(node.attrs["causal"] for node in attention_nodes(graph))
    wide = {  # an 8 x 2 grid and a 2 x 4 grid padded to 16 patches
        "pixel_values": torch.randn(2, 16, 48),
        "pixel_attention_mask": torch.tensor([[1] * 16, [1] * 8 + [0] * 8]),
        "spatial_shapes": torch.tensor([[8, 2], [2, 4]]),
    }
    assert graphkit.trace(real, example_inputs=wide).fingerprint() == graph.fingerprint()


def test_a_multimodal_config_is_read_through_its_text_part():
    # Gemma 3's config has no vocab_size of its own; its text part has (get_text_config)
    from transformers import Gemma3Config  # noqa: PLC0415 (slow to import)

    from graphkit.tracing.inputs import text_config  # noqa: PLC0415

    config = Gemma3Config(text_config={"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1})
    assert getattr(config, "vocab_size", None) is None
    assert text_config(config).vocab_size == 300
    assert text_config(config.get_text_config()) is config.get_text_config()
    assert text_config(None) is None


def test_model_without_guessable_inputs():
    model = load_model_file(MODEL_FILES / "no_inputs.py").model
    with pytest.raises(TraceError, match="cannot guess example inputs for Sequential"):
        graphkit.trace(model)


def test_forward_that_raises_names_the_module():
    loaded = load_model_file(MODEL_FILES / "forward_raises.py")
    with pytest.raises(
        TraceError,
        match=r"Net\.forward raised RuntimeError in module 'fc' \(Linear\) at "
        r"forward_raises.py:11: a and b must have same reduction dim",
    ):
        graphkit.trace(loaded.model, loaded.example_inputs)


def test_data_dependent_control_flow_is_a_clear_error():
    loaded = load_model_file(MODEL_FILES / "data_dependent.py")
    with pytest.raises(
        TraceError, match="cannot export Gate: data-dependent control flow in Gate.forward at data_dependent.py:12"
    ):
        graphkit.trace(loaded.model, loaded.example_inputs)


def test_an_unused_parameter_is_named_as_unused():
    loaded = load_model_file(MODEL_FILES / "unused_param.py")
    with pytest.raises(
        TraceError,
        match=r"parameter 'unused.weight' is not used by forward with these inputs \(module "
        r"'unused' \(Linear\) never runs\)",
    ):
        graphkit.trace(loaded.model, loaded.example_inputs)


class RootPositionsLM(nn.Module):
    """minGPT's layout: the position table is a bare parameter of the model itself, registered
    before the token embedding, and the model has no config."""

    def __init__(self, vocab: int = 100, dim: int = 32, block_size: int = 6) -> None:
        super().__init__()
        self.pos_emb = nn.Parameter(torch.zeros(1, block_size, dim))
        self.tok_emb = nn.Embedding(vocab, dim)
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.tok_emb(idx) + self.pos_emb[:, : idx.shape[1]]))


class NestedPositionsLM(nn.Module):
    """The position table is a bare parameter beside the token embedding inside a submodule,
    shorter than 8 positions; the model checks its length against ``max_seq_len``."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.positions = nn.Parameter(torch.zeros(5, 16))
        self.embeddings.tokens = nn.Embedding(40, 16)
        self.head, self.max_seq_len = nn.Linear(16, 40), 5

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        assert idx.shape[1] <= self.max_seq_len
        return self.head(self.embeddings.tokens(idx) + self.embeddings.positions[: idx.shape[1]])


@pytest.mark.parametrize("build, length", [(RootPositionsLM, 6), (NestedPositionsLM, 5)])
def test_hand_written_lms_with_bare_position_tables_get_token_inputs(build, length):
    args, kwargs = example_inputs_for(build())
    assert not kwargs and args[0].dtype == torch.long and tuple(args[0].shape) == (2, length)
    graph = graphkit.trace(build())
    assert [n.op for n in graph.nodes if n.params].count("pos_embedding") == 1


def test_not_a_module():
    with pytest.raises(TraceError, match="expected a torch.nn.Module"):
        graphkit.trace("gpt2")


def test_training_mode_is_restored():
    model = gpt2()
    model.train()
    graphkit.trace(model)
    assert model.training


def test_large_configuration_traces_on_meta():
    graph = graphkit.trace(gpt2(layers=48, dim=1600, heads=25, tied=True))  # GPT-2-XL
    assert graph.meta["num_params"] == 1_557_611_200
    assert len(attention_nodes(graph)) == 48
    assert graph.nodes[-3].name == "transformer.ln_f"


@pytest.mark.slow
def test_cache_reuses_exports_between_depths_and_changes_nothing():
    cache: dict = {}
    deep, shallow = gpt2(layers=6), gpt2(layers=4)
    assert graphkit.trace(deep, cache=cache) == graphkit.trace(deep)
    assert len(cache) == 1
    assert graphkit.trace(shallow, cache=cache) == graphkit.trace(shallow)
    assert len(cache) == 1  # same blocks, same export
    graphkit.trace(gpt2(layers=4, dim=96, heads=4), cache=cache)
    assert len(cache) == 2  # other widths export again


class _NanoGPT(nn.Module):
    """nanoGPT's shape, hand-written: no config.vocab_size, a position table of block_size rows
    (forward asserts the length) or, with rope=True, a precomputed rotary buffer instead."""

    def __init__(self, vocab=50, dim=32, heads=4, block_size=6, rope=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = None if rope else nn.Embedding(block_size, dim)
        if rope:
            self.register_buffer("freqs_cis", torch.ones(block_size, dim // heads // 2), persistent=False)
        self.block_size, self.heads = block_size, heads
        self.ln = nn.LayerNorm(dim)
        self.qkv, self.proj, self.head = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)

    def forward(self, idx):
        b, t = idx.shape
        assert t <= self.block_size, f"sequence of {t} tokens over block_size {self.block_size}"
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device))
        else:
            x = x * self.freqs_cis[:t].sum()
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.proj(y.transpose(1, 2).reshape(b, t, -1)))


@pytest.mark.parametrize("rope,length", [(False, 6), (True, 5)])
def test_hand_written_language_model_needs_no_example_inputs(rope, length):
    model = _NanoGPT(block_size=length, rope=rope)
    (ids,), kwargs = graphkit.example_inputs_for(model)
    assert ids.shape == (2, length) and ids.dtype == torch.long and int(ids.max()) < 50 and not kwargs
    graph = graphkit.trace(model)
    assert_golden_fingerprint(f"nanogpt_rope{rope}", graph)
    assert graph.op_counts()["attention"] == 1 and graph.nodes[1].op == "embedding"
    assert not any(n.op.startswith("other:") for n in graph.nodes)


@pytest.mark.parametrize(
    "name,root,consumer",
    [
        ("vit_relpos_base_patch16_224", "blocks.0.attn.rel_pos.mlp.fc1", "blocks.0.attn.attention"),
        ("vit_base_patch16_siglip_224", "attn_pool.q", "attn_pool.attention"),
    ],
)
def test_subgraphs_rooted_at_parameters_or_buffers(name, root, consumer):
    """A relative-position MLP over a coordinate buffer and a pooling head's learned query are
    architecture: kept, owning their parameters, feeding their attention, with no input edge."""
    graph = graphkit.trace(meta(lambda: timm_vit(name, depth=2)))
    assert_golden_fingerprint(name, graph)
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    preds = {i: {s for s, d in graph.edges if d == i} for i in range(len(graph.nodes))}
    assert preds[index[root]] == set()
    chain = {index[root]}
    for i in range(len(graph.nodes)):  # everything downstream of the root
        if preds[i] & chain:
            chain.add(i)
    assert index[consumer] in chain
    assert graph.op_counts()["attention"] == 2 + (name.endswith("siglip_224"))
    assert not any(n.op.startswith("other:") for n in graph.nodes)
    graph.validate({k: p.shape for k, p in meta(lambda: timm_vit(name, depth=2)).named_parameters()})


def test_in_place_aten_ops_map_to_their_out_of_place_op():
    """Falcon's parallel block adds attention and MLP outputs in place (aten.add_)."""
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        new_decoder_architecture=False,
        parallel_attn=True,
    )
    graph = graphkit.trace(meta(lambda: FalconForCausalLM(config)))
    assert_golden_fingerprint("falcon_parallel", graph)
    counts = graph.op_counts()
    assert not any(op.startswith("other:") for op in counts) and counts["add"] == 4 and counts["attention"] == 2


def test_the_tracer_is_one_package_whose_modules_import_by_their_dotted_path():
    """graphkit.trace is the function, whatever was imported first; the package is
    graphkit.tracing, so its modules import, and patch, by their dotted path."""
    assert graphkit.trace is tracing.trace and graphkit.example_inputs_for is tracing.example_inputs_for
    assert callable(graph_from_export)
    assert importlib.import_module("graphkit.tracing.naming").module_op is not None
    with mock.patch("graphkit.tracing.builder.graph_from_export") as patched:
        assert importlib.import_module("graphkit.tracing.builder").graph_from_export is patched
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        graphkit.nothing  # noqa: B018


@pytest.mark.parametrize(
    "build", [lambda: gpt2(), lambda: llama(kv_heads=2), lambda: mistral(window=16)], ids=["gpt2", "llama", "mistral"]
)
def test_pre_norm_residuals_read_the_block_stream_not_the_norm(build):
    """A pre-norm block adds its sublayer to its input. HF's RMSNorm first does x.to(float32), an
    alias on float32 x; the residual read through that alias once made the add read the norm."""
    graph = graphkit.trace(meta(build))
    assert_golden_fingerprint(f"pre_norm_{graph.meta['family']}", graph)
    for i, node in enumerate(graph.nodes):
        if node.op == "add":
            sources = [graph.nodes[s].op for s, d in graph.edges if d == i]
            assert len(sources) == 2 and not {"rms_norm", "layer_norm"} & set(sources), (node.name, sources)


def test_every_op_the_tracer_names_is_in_the_vocabulary():
    """The tracer's tables (ATen ops, module classes and names, grid ops) name only ops of
    ``graphkit.OPS``, so that a renamed or removed op fails here rather than as an unknown id."""
    named = {
        *naming.ATEN_OPS.values(),
        *(op for _, op in naming._MODULE_TYPES),
        *(op for _, op in naming._MODULE_NAME_RULES),
        *naming._MODULE_EXACT_NAMES.values(),
        *builder._LEAF_KEEP_WITHOUT_INPUT,
        *spatial._AMOUNT,
        *(op for op, _, _ in spatial._WINDOWED.values()),
        *spatial._ADAPTIVE.values(),
        *spatial._REDUCTIONS.values(),
        "patch_embed",
        "mean_pool",
        "interpolate",
    }
    assert named - set(graphkit.OPS) == set()

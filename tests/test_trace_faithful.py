"""Graphs that say what the model computes: an attention's causality wherever its mask comes from,
attention in any spelling as one node, writes through views with their data-flow edges, and a
clear refusal where the tracer cannot know."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import gpt2, llama
from test_trace_moe import deepseek_v3
from torch import nn

import graphkit
from graphkit import TraceError
from graphkit.ghn import load_checkpoint, predict

T = 8  # the sequence length every model here is traced at


def attention_attrs(graph) -> list[dict]:
    return [node.attrs for node in graph.nodes if node.op == "attention"]


def parents(graph, name: str) -> list[str]:
    index = next(i for i, node in enumerate(graph.nodes) if node.name == name)
    return sorted(graph.nodes[s].name for s, d in graph.edges if d == index)


class SpelledAttention(nn.Module):
    """One attention core written the way ``spelling`` says, causal through a ``tril`` buffer
    (as nanoGPT and minGPT register it) or not at all."""

    def __init__(self, spelling: str, causal: bool, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.spelling, self.causal, self.heads = spelling, causal, heads
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        if spelling.startswith("nn.MultiheadAttention"):
            self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        else:
            self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        keep = self.bias[:, :, :t, :t] != 0  # True where a query may see a key
        if self.spelling.startswith("nn.MultiheadAttention"):
            mask = ~keep[0, 0] if self.causal else None  # MultiheadAttention masks where True
            return self.mha(x, x, x, attn_mask=mask, need_weights=self.spelling.endswith("weights"))[0]
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        d = c // self.heads
        if self.spelling == "sdpa is_causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        elif self.spelling == "sdpa bool mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep if self.causal else None)
        elif self.spelling == "sdpa float mask":
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=torch.zeros(t, t).masked_fill(~keep, -math.inf) if self.causal else None
            )
        elif self.spelling == "matmul masked_fill":
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            scores = scores.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")) if self.causal else scores
            y = F.softmax(scores, dim=-1) @ v
        elif self.spelling == "einsum where":
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)
            scores = torch.where(keep, scores, torch.finfo(scores.dtype).min) if self.causal else scores
            y = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
        elif self.spelling == "einsum tokens first":  # (b, t, h, d) layout, an ellipsis, a large negative bias
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            scores = torch.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(d)
            scores = scores + torch.triu(torch.full((t, t), -1e9), 1) if self.causal else scores
            y = torch.einsum("...hqk,...khd->...qhd", scores.softmax(-1), v).transpose(1, 2)
        elif self.spelling == "log_softmax exp":
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            scores = scores.masked_fill(~keep, float("-inf")) if self.causal else scores
            y = F.log_softmax(scores, dim=-1).exp() @ v
        elif self.spelling == "v on the left":
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            scores = scores.masked_fill(~keep, float("-inf")) if self.causal else scores
            y = (v.transpose(-2, -1) @ scores.softmax(-1).transpose(-2, -1)).transpose(-2, -1)
        elif self.spelling == "v on the left, queries contracted":  # no attention: sums over queries
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            y = (v.transpose(-2, -1) @ scores.softmax(-1)).transpose(-2, -1)
        elif self.spelling == "chunked online softmax":  # flash attention written out, two chunks of keys
            half = t // 2
            parts = [
                (q @ k[..., s, :].transpose(-2, -1) / math.sqrt(d), v[..., s, :])
                for s in (slice(0, half), slice(half, t))
            ]
            highest = torch.maximum(*(s.amax(-1, keepdim=True) for s, _ in parts))
            weights = [(s - highest).exp() for s, _ in parts]
            y = sum(w @ z for w, (_, z) in zip(weights, parts)) / sum(w.sum(-1, keepdim=True) for w in weights)
        elif self.spelling == "bmm":
            q, k, v = (z.reshape(b * self.heads, t, d) for z in (q, k, v))
            scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
            scores = scores.masked_fill(~keep[0], float("-inf")) if self.causal else scores
            y = torch.bmm(scores.softmax(-1), v).view(b, self.heads, t, d)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class TinyLM(nn.Module):
    def __init__(self, attention: nn.Module, vocab: int = 50, dim: int = 32) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(T, dim)
        self.attn, self.head = attention, nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        return self.head(x + self.attn(x))


SPELLINGS = [
    "sdpa is_causal",
    "sdpa bool mask",
    "sdpa float mask",
    "matmul masked_fill",
    "einsum where",
    "einsum tokens first",
    "bmm",
    "log_softmax exp",
    "v on the left",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_every_spelling_of_attention_is_one_node_with_the_right_causal_flag(spelling, causal):
    graph = graphkit.trace(TinyLM(SpelledAttention(spelling, causal)))
    (attrs,) = attention_attrs(graph)
    assert attrs["causal"] is causal
    assert not [node.op for node in graph.nodes if node.op.startswith("other:")]
    # bmm folds the heads into the batch: they are read from the shapes before the fold
    reference = graphkit.trace(TinyLM(SpelledAttention("sdpa is_causal", causal)))
    assert graph.fingerprint() == reference.fingerprint()


@pytest.mark.parametrize("spelling", ["v on the left, queries contracted", "chunked online softmax"])
def test_what_the_readme_names_as_no_attention_stays_matmuls(spelling):
    """``v^T @ probs`` sums over the queries, not the keys; a chunked online softmax normalises
    after its products with V, which the README names as not recognised. If it becomes an
    attention node, move it into SPELLINGS and out of the README's sentence."""
    graph = graphkit.trace(TinyLM(SpelledAttention(spelling, causal=False)))
    assert not attention_attrs(graph) and "matmul" in {node.op for node in graph.nodes}


@pytest.mark.parametrize("weights", [False, True], ids=["sdpa path", "need_weights"])
def test_multihead_attention_with_a_causal_mask_is_causal(weights):
    spelling = "nn.MultiheadAttention" + (" weights" if weights else "")
    for causal in (True, False):
        (attrs,) = attention_attrs(graphkit.trace(TinyLM(SpelledAttention(spelling, causal))))
        assert attrs["causal"] is causal and attrs["heads"] == 4


class MaskedByArgument(nn.Module):
    """Attention whose mask is an argument of the model's forward."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed, self.qkv, self.head = nn.Embedding(50, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, 50)

    def forward(self, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (z.unflatten(-1, (4, -1)).transpose(1, 2) for z in self.qkv(self.embed(idx)).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.head(y.transpose(1, 2).flatten(2))


class MaskBuiltInForward(nn.Module):
    """The model's own forward builds an additive causal mask from positions and hands it to
    its attention module, as transformers' models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attn, self.head = nn.Embedding(50, 32), AddedMaskAttention(), nn.Linear(32, 50)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        i = torch.arange(idx.shape[1], device=idx.device)
        mask = torch.zeros(idx.shape[1], idx.shape[1], device=idx.device).masked_fill(
            i[None, :] > i[:, None], -math.inf
        )
        return self.head(self.attn(self.embed(idx), mask))


class AddedMaskAttention(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (z.unflatten(-1, (4, -1)).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        return ((q @ k.transpose(-2, -1) * 0.35 + mask).softmax(-1) @ v).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_mask_passed_as_an_argument_decides(causal):
    ids = torch.zeros(2, T, dtype=torch.long)
    keep = torch.ones(T, T, dtype=torch.bool)
    (attrs,) = attention_attrs(graphkit.trace(MaskedByArgument(), (ids, keep.tril() if causal else keep)))
    assert attrs["causal"] is causal


def test_a_mask_built_in_the_models_forward_is_read_on_the_meta_device_too():
    for device in ("cpu", "meta"):
        with torch.device(device):
            model = MaskBuiltInForward()
        (attrs,) = attention_attrs(graphkit.trace(model))
        assert attrs["causal"] is True


def test_a_mask_buffer_without_values_is_refused_naming_the_module_and_the_buffer():
    with torch.device("meta"):
        model = TinyLM(SpelledAttention("matmul masked_fill", causal=True))
    with pytest.raises(
        TraceError,
        match=r"cannot tell whether the attention in module 'attn' is causal: .*buffer "
        r"'attn.bias' is on the meta device",
    ):
        graphkit.trace(model)


@pytest.mark.slow
def test_hugging_face_decoders_are_causal_by_their_masks_with_either_backend():

    for build in (gpt2, llama):
        for backend in ("eager", "sdpa"):
            model = build(layers=2)
            model.config._attn_implementation = backend
            assert all(a["causal"] for a in attention_attrs(graphkit.trace(model)))


# --- writes through views ---------------------------------------------------------------------


class WritesIntoSlices(nn.Module):
    """Two projections written into halves of one tensor, by ``copy_`` into ``new_empty`` (as
    DeepSeek-V3 assembles its keys), by slice assignment into zeros, or by ``index_put_``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b, self.head = nn.Linear(16, 8), nn.Linear(16, 8), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "copy_":
            out = x.new_empty(x.shape[0], 16)
            out[:, :8].copy_(self.a(x))
            out[:, 8:].copy_(self.b(x))
        elif self.how == "slice assignment":
            out = torch.zeros(x.shape[0], 16, device=x.device)
            out[:, :8] = self.a(x)
            out[:, 8:] = self.b(x)
        else:
            out = torch.zeros(x.shape[0], 2, 8, device=x.device)
            out.index_put_(
                (torch.arange(x.shape[0], device=x.device), torch.zeros(x.shape[0], dtype=torch.long, device=x.device)),
                self.a(x),
            )
            out[:, 1] = self.b(x)
            out = out.flatten(1)
        return self.head(out)


@pytest.mark.parametrize("how", ["copy_", "slice assignment", "index_put_"])
def test_writes_through_views_keep_their_edges(how):
    graph = graphkit.trace(WritesIntoSlices(how), torch.randn(2, 16))
    assert parents(graph, "head") == ["a", "b"]
    assert not [node.op for node in graph.nodes if node.op.startswith("other:")]


def test_deepseek_v3_keys_assembled_by_copies_feed_the_attention():

    graph = graphkit.trace(deepseek_v3())
    assert parents(graph, "model.layers.0.self_attn.attention") == [
        "model.layers.0.self_attn.kv_a_proj_with_mqa",
        "model.layers.0.self_attn.kv_b_proj",
        "model.layers.0.self_attn.q_b_proj",
        "model.rotary_emb",
    ]


# --- einsum attention is predicted like any other -------------------------------------------


class EinsumViT(nn.Module):
    """timm's ViT-Ti/16 whose attention is written with einsum."""

    def __init__(self) -> None:
        super().__init__()
        import timm

        self.vit = timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, depth=2, num_classes=10
        )
        for block in self.vit.blocks:
            block.attn.forward = _einsum_forward.__get__(block.attn)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit(images)


def _einsum_forward(self, x: torch.Tensor, **unused) -> torch.Tensor:
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).unbind(2)
    probs = (torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale).softmax(-1)
    return self.proj(torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, n, c))


def test_einsum_attention_is_predicted_by_the_bundled_hypernetwork():
    model = EinsumViT()
    graph = graphkit.trace(model, torch.zeros(2, 3, 32, 32))
    assert [a["heads"] for a in attention_attrs(graph)] == [3, 3]
    params = predict(model, load_checkpoint("logah-tiny-vits"), torch.zeros(2, 3, 32, 32))
    assert params["vit.blocks.0.attn.qkv.weight"].abs().sum() > 0


# --- a class name is a claim, checked against what the call computes ------------------------


class Block(nn.Module):
    """A pre-norm block (norm, attention, MLP): under a class name that claims one op, still a
    block."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SpelledAttention("sdpa is_causal", causal=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Core(nn.Module):
    """softmax(q k^T) v of its input, no parameters: under a rotary or ALiBi name, still attention."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        scores = (x @ x.transpose(-2, -1)).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        return scores.softmax(-1) @ x


class Scale(nn.Module):
    """Twice its input: under a norm's name, no norm (it reduces over nothing)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class Norm(nn.Module):
    """A hand-written RMSNorm, as examples/llama_block.py writes it."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def renamed(cls: type, name: str) -> type:
    return type(name, (cls,), {})


#: class names that each claim an op (graphkit.tracing.naming's rules), on modules that compute another
FOOLING_NAMES = ["AlibiAttention", "RotaryAttention", "PreLayerNormBlock", "RMSNormBlock", "GeluMLP", "SwishBlock"]
FOOLING_NAMES += ["MambaMixerBlock", "L2NormAttention"]


@pytest.mark.parametrize("name", FOOLING_NAMES)
@pytest.mark.parametrize("module", [SpelledAttention, Block, Core], ids=["attention", "block", "parameter-free core"])
def test_a_class_name_never_decides_what_a_module_is(module, name):
    """Issue #46: `class AlibiAttention` traced as one `alibi` node owning its projections."""
    made = (lambda cls: cls("sdpa is_causal", causal=True)) if module is SpelledAttention else (lambda cls: cls())
    graph = graphkit.trace(TinyLM(made(renamed(module, name))))
    assert graph.fingerprint() == graphkit.trace(TinyLM(made(module))).fingerprint()
    assert [node.op for node in graph.nodes].count("attention") == 1


def test_a_hand_written_module_is_the_op_its_name_claims_when_it_computes_it():
    norm = graphkit.trace(nn.Sequential(nn.Linear(32, 32), renamed(Norm, "RMSNorm")()), torch.randn(2, 32))
    assert [(node.op, sorted(node.params)) for node in norm.nodes][1:-1] == [
        ("linear", ["0.bias", "0.weight"]),
        ("rms_norm", ["1.weight"]),
    ]
    # a name alone does not make a norm: the same claim on a module that reduces over nothing
    scale = graphkit.trace(nn.Sequential(nn.Linear(32, 32), renamed(Scale, "LayerNormScale")()), torch.randn(2, 32))
    assert "layer_norm" not in [node.op for node in scale.nodes]
    assert (
        scale.fingerprint()
        == graphkit.trace(nn.Sequential(nn.Linear(32, 32), Scale()), torch.randn(2, 32)).fingerprint()
    )


# --- parameters the forward never reads ----------------------------------------------------


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.shape[0] > 8 else self.b(x)


def test_a_parameter_on_a_branch_not_taken_is_named_as_unused():
    with pytest.raises(
        TraceError,
        match=r"parameter 'b.weight' is not used by forward with these inputs "
        r"\(module 'b' \(Linear\) never runs\): remove it if it is spare, or pass",
    ):
        graphkit.trace(Branchy(), torch.randn(16, 16))
    with pytest.raises(TraceError, match=r"parameter 'a.weight' is not used"):
        graphkit.trace(Branchy(), torch.randn(2, 16))


class Patches(nn.Module):
    """A patch embedding with a masked-image-modelling token its forward reads only when given a
    mask (BEiT's, DINOv2's ``mask_token``), and a bias it never reads."""

    def __init__(self, spare: str = "mask_token") -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_parameter(spare, nn.Parameter(torch.zeros(1, 1, 16)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.proj(x)
        return x if mask is None else torch.where(mask[..., None], next(iter(self._parameters.values())), x)


class MaskedImageModel(nn.Module):
    def __init__(self, spare: str = "mask_token") -> None:
        super().__init__()
        self.embed, self.head = Patches(spare), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def test_a_mask_token_the_forward_never_reads_is_recorded_as_spare():
    """DINOv2 from transformers was refused for its mask token (read only with
    ``bool_masked_pos``, which an image classifier is never given): it is spare, recorded beside
    the graph and owned by no node."""
    graph = graphkit.trace(MaskedImageModel(), torch.randn(2, 4, 16))
    assert graph.meta["spare"] == {"embed.mask_token": [1, 1, 16]}
    assert not any("embed.mask_token" in node.params for node in graph.nodes)
    assert graph.num_params == sum(p.numel() for p in MaskedImageModel().parameters()) - 16
    assert "spare: embed (mask_token [1, 1, 16]), cannot change the output" in graph.summary()
    assert "spare" not in graphkit.trace(nn.Linear(16, 16), torch.randn(2, 16)).meta


class Discarding(nn.Module):
    """A classifier that runs a norm and a pooling head and pools without them, as CLIP's and
    SigLIP's transformers image classifiers do with their vision tower's ``post_layernorm`` and
    MAP head; with ``write`` it instead writes its projection into a buffer it returns."""

    def __init__(self, write: bool = False) -> None:
        super().__init__()
        self.write = write
        self.proj, self.post_norm, self.pool_head = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        self.pool_head(self.post_norm(x[:, 0])).tanh()  # computed, never used
        if self.write:  # a value that reaches the output only through a write into another tensor
            out = torch.zeros(x.shape[0], 11)
            out[:, 1:] = self.head(x.mean(1))
            return out
        return self.head(x.mean(1))


def test_parameters_read_only_into_discarded_values_are_spare():
    """CLIP's and SigLIP's image classifiers were refused: a parametric node whose value the
    forward discards "is not connected to the output". Such parameters cannot change the output:
    they are recorded as spare and owned by no node, and what reads them is dropped as dead code."""
    model = Discarding()
    graph = graphkit.trace(model, torch.randn(2, 4, 16))
    dead = {"post_norm.weight", "post_norm.bias", "pool_head.weight", "pool_head.bias"}
    assert set(graph.meta["spare"]) == dead
    assert not any(name.startswith(("post_norm", "pool_head")) for node in graph.nodes for name in node.params)
    assert [node.op for node in graph.nodes] == ["input", "linear", "mean_pool", "head", "output"]
    assert "spare: post_norm (weight [16], bias [16]), cannot change the output" in graph.summary()
    # written into a tensor the forward returns: live, owned, not spare
    written = graphkit.trace(Discarding(write=True), torch.randn(2, 4, 16))
    assert "head.weight" not in written.meta["spare"]
    assert any("head.weight" in node.params for node in written.nodes)


class DiscardingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.aux = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux(x)  # computed, never used
        return x + self.fc(x).relu()


def test_discarded_parameters_of_folded_blocks_are_spare_in_every_block():
    """The tracer exports a stack's first two blocks and replicates the second: what a block
    discards is spare in every block, not only in the two traced."""
    model = nn.Sequential(nn.Linear(16, 16), nn.Sequential(*[DiscardingBlock() for _ in range(5)]), nn.Linear(16, 4))
    folded = graphkit.trace(model, torch.randn(2, 16))
    assert set(folded.meta["spare"]) == {f"1.{k}.aux.{p}" for k in range(5) for p in ("weight", "bias")}
    whole = graphkit.trace(model, torch.randn(2, 16), fold_repeats=False)
    assert folded.fingerprint() == whole.fingerprint() and folded.meta["spare"] == whole.meta["spare"]


def test_an_unread_parameter_of_a_module_that_runs_is_refused_as_such():
    """Only a known spare kind passes: any other parameter unread by a module that runs may be
    one a branch not taken reads."""
    with pytest.raises(
        TraceError,
        match=r"parameter 'embed.extra' is not used by forward with these inputs \(module 'embed' \(Patches\) runs "
        r"but never reads it\)",
    ):
        graphkit.trace(MaskedImageModel("extra"), torch.randn(2, 4, 16))

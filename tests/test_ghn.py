"""LoGAH model: Table 1 sizes, full-shape prediction for every family, no tiling, gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.func import functional_call

import graphkit
from graphkit.families import build_model, resolve_config
from graphkit.ghn import PredictError, load_checkpoint, predict
from graphkit.ghn.config import LOGAH_VARIANTS, LoGAHConfig, VariantError
from graphkit.ghn.diagnostics import feature_constancy
from graphkit.ghn.encoding import targets
from graphkit.ghn.model import INIT_GAIN, LoGAH, _DecodeBatch
from graphkit.ghn.predict import first_non_finite, residual_writers
from graphkit.ghn.stream import stream_writers
from graphkit.graph import ArchGraph
from graphkit.tracing.tracer import logit_scale
from graphkit.training.data import load_source

TABLE_1 = {"tiny": 2.54e6, "small": 21.41e6, "base": 78.23e6, "large": 289.42e6}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_variant_sizes_match_the_paper(name):
    with torch.device("meta"):
        ghn = LoGAH.from_variant(name)
    count = sum(p.numel() for p in ghn.parameters())
    assert abs(count / TABLE_1[name] - 1) < 0.05, count


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown LoGAH variant 'huge'; known: tiny, small, base, large"):
        LoGAH.from_variant("huge")
    assert set(LOGAH_VARIANTS) == set(TABLE_1)


@pytest.fixture(scope="module", params=["low_rank", "ghn3"])
def ghn(request):
    torch.manual_seed(0)
    return LoGAH.from_variant("tiny", decoder=request.param).eval()


@pytest.mark.parametrize(
    "config",
    [
        dict(family="vit", num_layers=3, hidden=192, heads=3),
        dict(family="gpt2", num_layers=2, hidden=64, heads=4),
        dict(family="llama", num_layers=2, hidden=64, heads=4, kv_heads=2, vocab_size=1000),
    ],
    ids=["vit", "gpt2", "llama"],
)
def test_every_parameter_is_predicted_at_full_shape(ghn, config):
    model = build_model(config)
    with torch.no_grad():
        params = ghn.predict(graphkit.trace(model))
    assert {n: tuple(t.shape) for n, t in params.items()} == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert all(torch.isfinite(t).all() for t in params.values())
    for name, tensor in params.items():
        if name.endswith("bias"):
            assert tensor.abs().max() < 1  # tanh(p / 5)
    norms = [t for n, t in params.items() if ("ln" in n or "norm" in n) and n.endswith("weight")]
    assert norms and all(((t > 0) & (t < 2)).all() for t in norms)  # 2 sigmoid(p / 2)


class _ConvNormNet(torch.nn.Module):
    """A convolution, BatchNorm and GroupNorm, pooled into a head: the norms of timm's hybrid ViTs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.gn = torch.nn.GroupNorm(4, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gn(torch.relu(self.bn(self.conv(x)))).mean((2, 3)))


def test_batch_and_group_norm_scales_are_predicted_as_norm_scales(ghn):
    # decoded as biases (tanh(p / 5)) a fresh LoGAH put them near 0 and silenced every block
    # after them (LeViT, FastViT, MaxViT in the vision zoo): they start at 1, as LayerNorm's do
    graph = graphkit.trace(_ConvNormNet(), torch.randn(1, 3, 8, 8))
    kinds = {t.name: t.kind for t in targets(graph)}
    assert kinds["bn.weight"] == kinds["gn.weight"] == "norm"
    assert kinds["bn.bias"] == kinds["gn.bias"] == "bias"
    with torch.no_grad():
        params = ghn.predict(graph)
    for name in ("bn.weight", "gn.weight"):
        assert (params[name] - 1).abs().max() < 0.5, name  # as biases they were within 0.05 of 0


class _GatedBlock(torch.nn.Module):
    """A residual branch gated by a gain at 1 (Zaya's residual scales, Dory's suv_up)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.gain = torch.nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) * self.gain.view(1, -1, 1, 1)


class _GainNet(torch.nn.Module):
    """Two gated blocks, then a zero-initialised BatchNorm (LeViT's and MobileViT's convention)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(_GatedBlock(), _GatedBlock())
        self.bn = torch.nn.BatchNorm2d(8)
        torch.nn.init.zeros_(self.bn.weight)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.blocks(x)).mean((2, 3)))


@pytest.mark.parametrize("anchors", [False, True])
def test_one_dimensional_parameters_are_decoded_around_their_init_constants(anchors):
    # by convention a gain at 0 (tanh(p / 5)): Zaya's, Dory's and Inkling's predictions then gave
    # every input the same output; with anchors each starts where its constructor puts it
    model = _GainNet()
    graph = graphkit.trace(model, torch.randn(1, 8, 4, 4))
    # by name without block indices; the biases of the convolutions and the head are random: none
    assert graph.meta["init"] == {"blocks.gain": 1.0, "bn.bias": 0.0, "bn.weight": 0.0}
    offsets = {t.name: t.offset for t in targets(graph, anchors=anchors) if len(t.shape) == 1}
    assert offsets["blocks.0.gain"] == offsets["blocks.1.gain"] == (1.0 if anchors else 0.0)
    assert offsets["bn.weight"] == (-1.0 if anchors else 0.0) and offsets["bn.bias"] == 0.0
    torch.manual_seed(0)
    ghn = LoGAH(LoGAHConfig(init_anchors=anchors)).eval()
    with torch.no_grad():
        batched = ghn.predict(graph)  # every 1-D parameter at once
        streamed = predict(copy.deepcopy(model), ghn=ghn, example_inputs=torch.randn(1, 8, 4, 4))  # block by block
    for params in (batched, streamed):
        for name, start in (("blocks.0.gain", 1.0), ("blocks.1.gain", 1.0), ("bn.weight", 0.0)):
            expected = start if anchors else 1.0 - start  # without anchors: gains at 0, a norm's gain at 1
            assert (params[name] - expected).abs().max() < 0.1, (name, params[name])
    assert graph.fingerprint() == graphkit.trace(_GainNet(), torch.randn(1, 8, 4, 4)).fingerprint()


def _beside_plain(
    role: str, sizes: dict[str, int] | None = None, **extra: bool
) -> tuple[_GainNet, ArchGraph, LoGAH, LoGAH, set[str]]:
    """A _GainNet and its graph, a LoGAH (init anchors, one role map for ``role``, ``sizes`` its
    other LoGAHConfig sizes) and the same with ``extra`` (its weights loaded from the first's, in
    eval mode both), and what the first lacks."""
    model = _GainNet()
    graph = graphkit.trace(model, torch.randn(1, 8, 4, 4))
    torch.manual_seed(0)
    plain = LoGAH(LoGAHConfig(init_anchors=True, roles=(role,), **(sizes or {}))).eval()
    extended = LoGAH(LoGAHConfig(init_anchors=True, roles=(role,), **(sizes or {}), **extra)).eval()
    missing, unexpected = extended.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected
    return model, graph, plain, extended, set(missing)


def test_role_factors_move_their_roles_weights_and_start_at_nothing():
    """Role factors (LoGAHConfig.role_factors) are zero at init, so a checkpoint's weights decode
    as they did without them; a role's factors move that role's weights (in every block) and no
    other parameter, in training's batched decoding and predict's block-by-block writing alike; the
    loss's gradient reaches only the rows of the roles it reads."""
    model, graph, plain, factored, missing = _beside_plain("blocks.conv.weight", role_factors=True)
    assert missing == {"decoder.role_factors"}
    assert factored.decoder.role_factors.shape == (2, 2 * 32 * 32)  # the shared map's, then the one role's
    convs = {"blocks.0.conv.weight", "blocks.1.conv.weight"}
    with torch.no_grad():
        before = plain.predict(graph)
        assert all(torch.equal(before[n], p) for n, p in factored.predict(graph).items())
        factored.decoder.role_factors[1] = torch.randn(2 * 32 * 32)
        batched = factored.predict(graph)
        streamed = predict(copy.deepcopy(model), ghn=factored, example_inputs=torch.randn(1, 8, 4, 4))
    for params in (batched, streamed):
        for name, value in params.items():
            assert torch.allclose(value, before[name], atol=1e-6) != (name in convs), name
    assert all(torch.allclose(batched[n], streamed[n], atol=1e-5) for n in batched)
    factored.train()
    sum(p.square().sum() for name, p in factored.predict(graph).items() if name in convs).backward()
    shared, role = factored.decoder.role_factors.grad
    assert shared.abs().max() == 0 and role.abs().max() > 0


def test_the_correction_is_the_mlps_share_of_each_querys_factors():
    """Decoded.correction, what train-ghn --correction weighs: per query |mlp|^2 / (|mlp|^2 +
    |role's|^2), averaged over the queries; 1 while the role factors are zero (and without them),
    0 where the MLP gives nothing; the MLP's output set to one vector b and the two roles' factors
    to a0 and a1, the mean of the two shares by the queries' roles."""
    _, graph, plain, factored, _ = _beside_plain("blocks.conv.weight", role_factors=True)
    encoded = factored.encode(graph)
    roles = _DecodeBatch([encoded]).on(torch.device("cpu"))["role"]
    assert plain([encoded], details=True).correction == 1
    assert factored([encoded], details=True).correction == 1
    last, r2 = factored.decoder.mlp[-1], 2 * 32 * 32
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        factored.decoder.role_factors.copy_(torch.randn(2, r2))
        assert factored([encoded], details=True).correction == 0
        last.bias.copy_(torch.randn(r2))
        b2 = last.bias.square().sum()
        expected = torch.stack([b2 / (b2 + a.square().sum()) for a in factored.decoder.role_factors])[roles].mean()
    assert set(roles.tolist()) == {0, 1}
    assert factored([encoded], details=True).correction.item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_level_head_moves_each_one_dimensional_parameter_and_starts_at_nothing():
    """A level head (LoGAHConfig.level_head) adds its per-parameter level, and its role's level, to
    the 1-D parameters, after their output function and in their own units, where training, one
    graph at a time and block-by-block writing (predict) agree; a role's level moves that role's
    parameters only; at init both are zero, so a checkpoint's weights decode as they did without
    them; their gradients are the 1-D parameters' own; NaN is caught before anything is written."""
    model, graph, plain, leveled, missing = _beside_plain("blocks.gain", level_head=True)
    assert missing == {"decoder.level.weight", "decoder.level.bias", "decoder.role_levels"}
    assert leveled.decoder.role_levels.shape == (2,)  # the shared map's, then the one role's
    vectors = {t.name for t in targets(graph) if len(t.shape) == 1}
    gains = {"blocks.0.gain", "blocks.1.gain"}
    assert vectors == gains | {"bn.weight", "bn.bias", "blocks.0.conv.bias", "blocks.1.conv.bias", "head.bias"}
    with torch.no_grad():
        before = plain.predict(graph)
        assert all(torch.equal(before[n], p) for n, p in leveled.predict(graph).items())
        leveled.decoder.level.bias.fill_(0.25)
        leveled.decoder.role_levels[1] = 0.5
        batched = leveled.predict(graph)
        streamed = predict(copy.deepcopy(model), ghn=leveled, example_inputs=torch.randn(1, 8, 4, 4))
    for params in (batched, streamed):
        for name, value in params.items():
            shift = 0.75 if name in gains else 0.25 if name in vectors else 0.0
            assert torch.allclose(value, before[name] + shift, atol=1e-6), name
    leveled.train()
    loss = sum(p.sum() for name, p in leveled.predict(graph).items() if name in vectors)
    loss.backward()
    assert leveled.decoder.level.bias.grad.item() == pytest.approx(sum(before[n].numel() for n in vectors))
    by_role = [
        sum(before[n].numel() for n in names) for names in (vectors - gains, gains)
    ]  # the shared map's, the gains'
    assert leveled.decoder.role_levels.grad.tolist() == pytest.approx(by_role)
    with torch.no_grad():
        leveled.decoder.role_levels[1] = float("nan")
        assert leveled.decoding(graph).first_non_finite() in gains
    with pytest.raises(PredictError, match="not finite|NaN"):
        predict(copy.deepcopy(model), ghn=leveled.eval(), example_inputs=torch.randn(1, 8, 4, 4))


@pytest.mark.parametrize("chunk", [LoGAHConfig.max_mask, 8], ids=["whole", "chunked"])
def test_role_vectors_move_their_roles_one_dimensional_parameters_entry_by_entry(chunk):
    """Role vectors (LoGAHConfig.role_vectors) add their role's vector to the first ``role_rows``
    values of each of its 1-D parameters, after the output function, in training's batched
    decoding and predict's block-by-block writing alike, also where a parameter is decoded in
    chunks of K rows (K = 8: the head's bias of 10 in two); a longer parameter keeps its values past
    them; at init they are zero, so a checkpoint's weights decode as without them; a role's vector
    gets its gradient from its own parameters only; NaN is caught before anything is written."""
    sizes = {"role_rows": 6, "max_mask": chunk}
    model, graph, plain, vectored, missing = _beside_plain("blocks.gain", sizes, role_vectors=True)
    assert missing == {"decoder.role_vectors"}
    assert vectored.decoder.role_vectors.shape == (2, 6)  # the shared map's, then the one role's
    vectors = {t.name: t.shape[0] for t in targets(graph) if len(t.shape) == 1}
    gains = {"blocks.0.gain", "blocks.1.gain"}
    assert vectors["head.bias"] == 10 and all(n >= 6 for n in vectors.values())
    with torch.no_grad():
        before = plain.predict(graph)
        assert all(torch.equal(before[n], p) for n, p in vectored.predict(graph).items())
        vectored.decoder.role_vectors.copy_(torch.arange(1.0, 13.0).view(2, 6) / 10)
        batched = vectored.predict(graph)
        streamed = predict(copy.deepcopy(model), ghn=vectored, example_inputs=torch.randn(1, 8, 4, 4))
    for params in (batched, streamed):
        for name, value in params.items():
            shift = torch.zeros_like(value)
            if name in vectors:
                shift[:6] = vectored.decoder.role_vectors[int(name in gains)]
            assert torch.allclose(value, before[name] + shift, atol=1e-5), name
    vectored.train()
    sum(p.sum() for name, p in vectored.predict(graph).items() if name in vectors).backward()
    others, own = vectored.decoder.role_vectors.grad
    assert own.tolist() == [len(gains)] * 6 and others.tolist() == [len(vectors) - len(gains)] * 6
    with torch.no_grad():
        vectored.decoder.role_vectors[1, 3] = float("nan")
        assert vectored.decoding(graph).first_non_finite() in gains
    with pytest.raises(PredictError, match="not finite|NaN"):
        predict(copy.deepcopy(model), ghn=vectored.eval(), example_inputs=torch.randn(1, 8, 4, 4))


def test_role_vectors_need_role_maps():
    with pytest.raises(VariantError, match="role vectors need the low_rank decoder and role maps"):
        LoGAHConfig(role_vectors=True)


def test_role_prototypes_need_role_maps():
    with pytest.raises(VariantError, match="role prototypes need the low_rank decoder and role maps"):
        LoGAHConfig(role_prototypes=True)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_gemma_built_on_meta_is_predicted_around_its_librarys_init(device):
    # Gemma's RMSNorm scales by 1 + w, w = 0 at init; a model built on meta (graphkit predict
    # hf:...) has no values to read, so predict reads them from its library's init, then puts
    # the meta tensors back until it writes the prediction
    from transformers import GemmaConfig, GemmaForCausalLM  # noqa: PLC0415 (slow to import)

    config = GemmaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    with torch.device(device):
        model = GemmaForCausalLM(config)
    assert ("init" in graphkit.trace(model).meta) is (device == "cpu")
    torch.manual_seed(0)
    anchored, plain = (LoGAH(LoGAHConfig(init_anchors=flag)).eval() for flag in (True, False))
    norms = [name for name, _ in model.named_parameters() if name.endswith("norm.weight")]
    assert len(norms) == 5
    for ghn, start in ((anchored, 0.0), (plain, 1.0)):
        params = predict(copy.deepcopy(model), ghn=ghn)
        assert all((params[name] - start).abs().max() < 0.1 for name in norms), start


def _cohere(device: str = "cpu", scale: float = 0.0625) -> torch.nn.Module:
    from transformers import CohereConfig, CohereForCausalLM  # noqa: PLC0415 (slow to import)

    config = CohereConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        logit_scale=scale,
        pad_token_id=0,  # its embedding row of zeros: a forward of token 0 alone gives logits of 0
    )
    torch.manual_seed(0)
    with torch.device(device):
        return CohereForCausalLM(config)


@pytest.mark.parametrize("scale", [0.0625, 1.0])
def test_a_models_logit_scale_is_recorded_and_undone_by_its_final_norm(scale):
    # Cohere multiplies its logits by 1/16, which the graph cannot show (the tracer folds
    # constants): decoded as a model at scale 1 its logits were 16 times too small, near uniform
    model = _cohere(scale=scale)
    graph = graphkit.trace(model)
    assert graph.meta.get("logit_scale", 1.0) == pytest.approx(scale, rel=1e-6)
    assert logit_scale(model, graph) == pytest.approx(scale, rel=1e-6)
    factors = {t.name: t.factor for t in targets(graph, anchors=True) if t.factor != 1.0}
    assert factors == ({"model.norm.weight": pytest.approx(1 / scale)} if scale != 1.0 else {})
    assert all(t.factor == 1.0 for t in targets(graph, anchors=False))
    torch.manual_seed(0)
    ghn = LoGAH(LoGAHConfig(init_anchors=True)).eval()
    plain = copy.deepcopy(graph)
    plain.meta.pop("logit_scale", None)
    with torch.no_grad():
        reference = ghn.predict(plain)
        batched = ghn.predict(graph)
    streamed = predict(copy.deepcopy(model), ghn=ghn)  # traced again, block by block
    for params in (batched, streamed):
        for name, value in reference.items():
            expected = value / scale if name == "model.norm.weight" else value
            torch.testing.assert_close(params[name], expected, rtol=1e-5, atol=1e-6)
    # what the hypernetwork meant: the logits of the same prediction in a model at scale 1
    x = torch.arange(16).remainder(64).view(2, 8)
    at_one = _cohere(scale=1.0)
    with torch.no_grad():
        meant = functional_call(at_one, reference, (x,)).logits
        got = functional_call(model, batched, (x,)).logits
    torch.testing.assert_close(got, meant, rtol=1e-4, atol=1e-5)


def _llama(tied: bool, gemma: bool = False) -> torch.nn.Module:
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    sizes = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    torch.manual_seed(0)
    if gemma:
        return GemmaForCausalLM(GemmaConfig(**sizes, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied))
    return LlamaForCausalLM(LlamaConfig(**sizes, num_key_value_heads=1, tie_word_embeddings=tied))


@pytest.mark.parametrize(
    "tied, gemma, scaled",
    [(False, False, True), (True, False, True), (True, True, False), (False, True, True)],
    ids=["untied", "tied", "tied-gemma", "untied-gemma"],
)
def test_a_table_gain_is_decoded_through_its_factors_and_keeps_tied_logits(tied, gemma, scaled):
    # what the blocks write is small beside a larger stream input (docs/experiments.md, "The
    # stream's input"), written as the stream's writers a quarter (test_ghn_stream has the other
    # form); where a tied head's norm cannot undo the gain (Gemma's 1 + w) there is none
    model = _llama(tied, gemma)
    graph = graphkit.trace(model)
    table = "model.embed_tokens.weight"
    factors = {t.name: t.factor for t in targets(graph, anchors=True, table_gain=4.0) if t.factor != 1.0}
    writers = stream_writers(graph) or frozenset()
    expected = {name: 0.25 for name in writers - {table}} if scaled else {}
    assert factors == expected and len(expected) == 4 * scaled
    assert all(t.factor == 1.0 for t in targets(graph, anchors=False, table_gain=4.0))
    for decoder in ("ghn3", "low_rank"):
        torch.manual_seed(0)
        gained = LoGAH(LoGAHConfig(init_anchors=True, table_gain=4.0, decoder=decoder)).eval()
        plain = LoGAH(LoGAHConfig(init_anchors=True, decoder=decoder)).eval()
        plain.load_state_dict(gained.state_dict())
        with torch.no_grad():
            reference, batched = plain.predict(graph), gained.predict(graph)
        streamed = predict(copy.deepcopy(model), ghn=gained, grow=False, keep_init=False)  # block by block
        for params in (batched, streamed):
            for name, value in reference.items():
                torch.testing.assert_close(params[name], value * expected.get(name, 1.0), rtol=1e-5, atol=1e-6)
    if tied and scaled:  # the logits' scale is the gain-1 prediction's
        x = torch.arange(16).remainder(64).view(2, 8)
        with torch.no_grad():
            scaled_logits = functional_call(model, batched, (x,)).logits
            plain_logits = functional_call(model, reference, (x,)).logits
        ratio = scaled_logits.std() / plain_logits.std()
        assert 0.5 < ratio < 2, ratio
    with pytest.raises(VariantError, match="table gain must be a positive number; got nan"):
        LoGAHConfig(table_gain=float("nan"))


def test_a_logit_scale_is_measured_only_where_it_is_one_constant():
    on_meta = _cohere("meta")
    graph = graphkit.trace(on_meta)
    assert "logit_scale" not in graph.meta and "init" not in graph.meta  # no values to measure on
    assert logit_scale(on_meta, graph) is None
    # predict measures it on a copy built as the library builds it, as it reads the init constants
    torch.manual_seed(0)
    ghn = LoGAH(LoGAHConfig(init_anchors=True)).eval()
    with torch.no_grad():
        reference = ghn.predict(graphkit.trace(_cohere(scale=1.0)))
    predicted = predict(on_meta, ghn=ghn)
    torch.testing.assert_close(predicted["model.norm.weight"], reference["model.norm.weight"] * 16)
    assert all(p.device.type == "cpu" for p in on_meta.parameters())
    # a gain decoded around 0 (Gemma's 1 + w) is not scaled by a factor: left as it is
    graph = graphkit.trace(_cohere())
    graph.meta["init"]["model.norm.weight"] = 0.0
    assert all(t.factor == 1.0 for t in targets(graph, anchors=True))
    # the head fed by no layer of its own (a graph without a head): nothing measured
    model = _GainNet()
    assert logit_scale(model, graphkit.trace(model, torch.randn(1, 8, 4, 4))) in (None, 1.0)


def test_init_constants_need_every_block_to_agree():
    model = _GainNet()
    with torch.no_grad():
        model.blocks[1].gain.fill_(2.0)
    assert "blocks.gain" not in graphkit.trace(model, torch.randn(1, 8, 4, 4)).meta["init"]
    with torch.device("meta"):
        on_meta = _GainNet()
    graph = graphkit.trace(on_meta, torch.randn(1, 8, 4, 4, device="meta"))
    assert "init" not in graph.meta  # unknown, not none
    with pytest.raises(graphkit.errors.EncodingError, match=r"_GainNet: its graph records no init constants"):
        targets(graph, anchors=True)


def test_wide_embeddings_are_not_tiled():
    torch.manual_seed(0)
    ghn = LoGAH(LoGAHConfig(max_mask=4096))  # a small K, so GPT-2's 50,257 rows span 13 chunks
    model = build_model(dict(family="gpt2", num_layers=1, hidden=32, heads=2))
    with torch.no_grad():
        wte = ghn.predict(graphkit.trace(model))["transformer.wte.weight"]
    assert wte.shape == (50257, 32)
    blocks = wte[: 24 * 2048].reshape(24, 2048, 32)
    for i in range(24):
        for j in range(i + 1, 24):
            assert not torch.allclose(blocks[i], blocks[j]), (i, j)


def test_gradients_reach_the_hypernetwork_through_the_model():
    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny")
    model = build_model(dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4), device="cpu")
    params = ghn.predict(graphkit.trace(model))
    logits = functional_call(model, params, (torch.randn(4, 3, 8, 8),))
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    assert ghn.decoder.mlp[0].weight.grad.abs().sum() > 0 and ghn.encoder.op_embed.weight.grad.abs().sum() > 0
    assert ghn.encoder.layers[0].qkv.weight.grad.abs().sum() > 0


def test_predict_loads_into_a_meta_model_that_then_runs(ghn):

    model = build_model(dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4))
    params = predict(model, ghn)
    assert not any(p.is_meta for p in model.parameters())
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())
    assert torch.isfinite(model(torch.randn(2, 3, 8, 8))).all()


@pytest.mark.slow
def test_predict_refuses_nan(ghn):

    broken = copy.deepcopy(ghn)
    with torch.no_grad():
        broken.encoder.norm.bias.fill_(float("nan"))
    model = build_model(dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4))
    with pytest.raises(PredictError, match="predicted NaN or Inf for '.*'; the model was left unchanged"):
        predict(model, broken)
    assert all(p.is_meta for p in model.parameters())


def test_ghn3_decoder_matches_equation_2_and_tiles():
    d = 64
    decoder = LoGAH.from_variant("tiny", decoder="ghn3").decoder
    count = sum(p.numel() for n, p in decoder.named_parameters() if not n.startswith("slot"))
    assert abs(count / (4 * d * d * 16 * 16 + 32 * d * d + 8 * d**3) - 1) < 0.015, count  # eq. 2 omits biases
    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny", decoder="ghn3").eval()
    with torch.no_grad():
        params = ghn.predict(graphkit.trace(build_model(dict(family="gpt2", num_layers=1, hidden=32, heads=2))))
    wte = params["transformer.wte.weight"]
    assert wte.shape == (50257, 32) and torch.equal(wte[:d], wte[d : 2 * d])  # the repetition LoGAH removes
    assert not torch.equal(wte[:d, :16], wte[:d, 16:])


def test_one_batched_pass_equals_one_graph_at_a_time():

    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny").eval()
    graphs = [
        graphkit.trace(build_model(c))
        for c in (
            dict(family="gpt2", num_layers=1, hidden=32, heads=2),
            dict(family="vit", num_layers=3, hidden=64, heads=2),
        )
    ]
    with torch.no_grad():
        together = ghn([ghn.encode(g) for g in graphs])
        for graph, batched in zip(graphs, together):
            alone = ghn.predict(graph)
            assert all(torch.allclose(alone[n], batched[n], atol=1e-5) for n in alone)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["low_rank", "ghn3"])
def test_prediction_norms_are_the_parameters_norms_with_their_gradient(decoder):
    """Training's regulariser comes from ``Prediction.norms`` without a pass over the decoded
    weights: it must equal the sum of every predicted parameter's L2 norm, value and gradient,
    across graphs of two families and for parameters cut into several chunks (K = 64)."""
    torch.manual_seed(0)
    ghn = LoGAH(LoGAHConfig(max_mask=64, decoder=decoder))
    with torch.no_grad():  # a trained-looking gain head: each weight's scale differs
        for p in ghn.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    graphs = [
        ghn.encode(graphkit.trace(build_model(c)))
        for c in (
            dict(family="gpt2", num_layers=1, hidden=96, heads=2, vocab_size=300),
            dict(family="vit", num_layers=2, hidden=80, heads=2, image_size=8, patch_size=2),
        )
    ]
    out = ghn(graphs, details=True)
    explicit = torch.stack([sum(p.norm() for p in params.values()) for params in out.params])
    assert torch.allclose(out.norms, explicit, rtol=1e-5), (out.norms, explicit)
    assert torch.equal(out.nodes, ghn.encoder(graphs))
    grad = torch.autograd.grad(
        out.norms @ torch.tensor([1.0, 2.0]), list(ghn.parameters()), allow_unused=True, retain_graph=True
    )
    want = torch.autograd.grad(explicit @ torch.tensor([1.0, 2.0]), list(ghn.parameters()), allow_unused=True)
    for (name, _), a, b in zip(ghn.named_parameters(), grad, want):
        a, b = (torch.zeros(1) if g is None else g for g in (a, b))
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-6 * b.abs().max().item() + 1e-9), name


def test_first_non_finite_names_nan_and_inf_but_not_an_overflowing_sum():

    fine = {"a": torch.ones(3, 4), "huge": torch.full((8,), 3e38)}  # finite values whose sum overflows
    assert first_non_finite(fine) is None
    for value in (float("nan"), float("inf"), float("-inf")):
        broken = torch.ones(1000)
        broken[537] = value
        assert first_non_finite({**fine, "w": broken}) == "w"


@pytest.mark.parametrize(
    "config",
    [
        dict(family="vit", num_layers=2, hidden=128, heads=4, image_size=8, patch_size=2),
        dict(family="gpt2", num_layers=2, hidden=96, heads=4, vocab_size=300, context=32),
    ],
)
def test_untrained_predictions_are_well_scaled_and_not_rank_one(config):
    """An untrained LoGAH must start where a model can learn: weights at RMS INIT_GAIN / sqrt(fan-in)
    and no matrix collapsed onto one direction (a bias in the r -> K map made 97% of every
    matrix's energy one rank-1 term)."""

    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny").eval()
    graph = graphkit.trace(build_model(config))
    with torch.no_grad():
        params = ghn.predict(graph)
    for t in targets(graph):
        if t.kind != "weight" or min(t.matrix_shape) < 8:
            continue
        value = params[t.name].reshape(t.matrix_shape)
        assert 0.5 < value.std().item() * t.fan_in**0.5 / INIT_GAIN < 2, t.name
        energy = torch.linalg.svdvals(value) ** 2
        assert energy[0] / energy.sum() < 0.5, t.name


def test_weight_scale_stays_bounded_whatever_the_gain_head_says():
    """The predicted scale can neither blow up nor reach zero: RMS in (0, 2 INIT_GAIN / sqrt(fan-in))."""

    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny").eval()
    graph = graphkit.trace(
        build_model(dict(family="vit", num_layers=1, hidden=64, heads=2, image_size=8, patch_size=2))
    )
    for bias, bound in ((50.0, lambda r: 1.99 < r < 2.001), (-20.0, lambda r: 0 < r < 1e-3)):
        with torch.no_grad():
            ghn.decoder.gain.bias.fill_(bias)
            params = ghn.predict(graph)
        for t in targets(graph):
            if t.kind == "weight":
                ratio = params[t.name].pow(2).mean().sqrt().item() * t.fan_in**0.5 / INIT_GAIN
                assert bound(ratio), (t.name, ratio)


GPT2_TINY = dict(family="gpt2", num_layers=3, hidden=64, heads=4, vocab_size=300, context=32)
VIT_TINY = dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4)


@pytest.mark.parametrize(
    "config, writers",
    [
        (GPT2_TINY, [f"transformer.h.{i}.{m}.c_proj.weight" for i in range(3) for m in ("attn", "mlp")]),
        (VIT_TINY, [f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.proj", "mlp.fc2")]),
        (
            dict(family="llama", num_layers=2, hidden=64, heads=4, kv_heads=2, vocab_size=300),
            [f"model.layers.{i}.{m}.weight" for i in range(2) for m in ("self_attn.o_proj", "mlp.down_proj")],
        ),
    ],
)
def test_residual_writers_are_the_weights_that_end_each_branch(config, writers):

    assert residual_writers(graphkit.trace(build_model(config))) == writers


@pytest.mark.slow
def test_predict_scales_residual_branches_where_the_family_init_does():
    """GPT-2's init makes each branch's output weights 1 / sqrt(2 n_layer) smaller; predictions
    for GPT-2 follow it by default (a ViT's, whose timm init does not, are left as predicted),
    and ``residual_scale`` turns it on or off whatever the family."""

    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny").eval()
    for config, default in ((GPT2_TINY, True), (VIT_TINY, False)):
        raw = predict(build_model(config), ghn, residual_scale=False, keep_init=False)
        writers = residual_writers(graphkit.trace(build_model(config)))
        for flag in (None, True):
            scaled = predict(build_model(config), ghn, residual_scale=flag, keep_init=False)
            on = default if flag is None else flag
            for name, value in raw.items():
                factor = len(writers) ** -0.5 if on and name in writers else 1.0
                torch.testing.assert_close(scaled[name], value * factor, msg=name)


@pytest.mark.parametrize(
    "checkpoint, config, scales",
    [
        # gpts-1k's first eval model, unscaled and at GPT-2's branch scale
        (
            "logah-tiny-gpts",
            dict(family="gpt2", num_layers=6, hidden=88, heads=22, vocab_size=50257, context=1024),
            (False, True),
        ),
        # a llamas-1k-sized LLaMA with GQA, as predict() leaves it
        ("logah-tiny-llamas", dict(family="llama", num_layers=6, hidden=256, heads=4, kv_heads=2), (None,)),
    ],
)
@pytest.mark.slow
def test_a_predicted_language_model_lets_the_tokens_through(checkpoint, config, scales):
    """What reaches the LM head of a predicted in-space model varies from token to token: the
    bundled GPT-2 and LLaMA hypernetworks decode each parameter role through its own map (role
    maps), and their features' constancy (mean over their token-to-token spread) is about 1-2,
    scaled or not (random init: below 1). The shared-map checkpoints before them wrote the same
    direction from every block: GPT-2 180 unscaled, 60 at its branch scale, LLaMA 380; unigram
    models."""

    ghn = load_checkpoint(checkpoint)
    x, _ = load_source("stdlib-text").batch(resolve_config(config), 8, torch.Generator().manual_seed(0), split="eval")
    constancy = {}
    for scale in ("random init", *scales):  # random init: the control
        torch.manual_seed(0)
        model = build_model(config, "cpu")
        if scale != "random init":
            predict(model, ghn, residual_scale=scale, keep_init=False)  # the prediction's own features
        constancy[scale] = feature_constancy(model, dict(model.named_parameters()), x, "lm_head")
    assert constancy.pop("random init") < 1 and all(c < 5 for c in constancy.values()), constancy

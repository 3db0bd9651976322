"""``keep_init``: the prediction added onto the model's own initialisation (weight matrices
``W0 + P``, or ``W0 + shrink * P``; norms and biases ``P``), in ``predict``, the CLI and ``eval-ghn``."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import MODEL_FILES, one_line_error
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

import graphkit
from graphkit.cli import app
from graphkit.families import FAMILIES, build_model
from graphkit.ghn import PredictError, load_checkpoint, predict
from graphkit.ghn.checkpoint import bundled_checkpoint, bundled_for
from graphkit.ghn.evaluate import EvalConfig, EvalError, initialise, summarize
from graphkit.ghn.keep_init import (
    KeepInitError,
    add_prediction,
    default_shrink,
    initialise_as_built,
    saturated_init,
    should_keep_init,
    shrunk,
)
from graphkit.ghn.model import LoGAH
from graphkit.ghn.predict import predicted_params, residual_writers
from graphkit.modelfile import load_model_file
from graphkit.training.data import load_source

GPT2 = dict(family="gpt2", num_layers=2, hidden=64, heads=4, vocab_size=256, context=64)
VIT = dict(family="vit", num_layers=2, hidden=64, heads=2, image_size=8, patch_size=2, num_classes=10)
LLAMA = dict(family="llama", num_layers=2, hidden=64, heads=4, kv_heads=2, vocab_size=256)
#: a timm ViT pooled by the mean, which only the vision zoo's checkpoint trained on, as a mini zoo records it
SIGLIP = dict(
    family="timm",
    model="vit_base_patch16_siglip_gap_224",
    image_size=32,
    num_classes=10,
    shrink=dict(depth=2, embed_dim=64, num_heads=2, patch_size=8),
)
TIED_LLAMA = {**LLAMA, "tied": True}
runner = CliRunner()


@pytest.fixture(scope="module", params=["low_rank", "ghn3"])
def ghn(request):
    torch.manual_seed(0)
    return LoGAH.from_variant("tiny", decoder=request.param).eval()


def expected(
    init: dict[str, torch.Tensor], prediction: dict[str, torch.Tensor], shrink: float = 1.0
) -> dict[str, torch.Tensor]:
    """The keep-init rule written out: matrices init + shrink x prediction, 1-D parameters the prediction."""
    return {name: init[name] + shrink * p if p.dim() >= 2 else p for name, p in prediction.items()}


@pytest.mark.slow
@pytest.mark.parametrize("config", [GPT2, VIT], ids=["gpt2", "vit"])
def test_keep_init_writes_the_init_plus_the_prediction(ghn, config):
    """Into a model with weights, into its own tensors, through both decoders' writes (in place
    and through a buffer: the ViT's 4-D patch kernel), residual branches scaled (GPT-2) on the
    prediction only."""
    torch.manual_seed(1)
    model = build_model(config, "cpu")
    init = {name: p.detach().clone() for name, p in model.named_parameters()}
    storage = {name: p.data_ptr() for name, p in model.named_parameters()}
    graph = graphkit.trace(model)
    prediction = predicted_params(ghn, graph)
    written = predict(model, ghn, graph=graph, keep_init=True)
    assert written.keys() == prediction.keys()
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == storage  # in place, no copy
    for name, value in expected(init, prediction).items():
        torch.testing.assert_close(model.get_parameter(name).detach(), value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("config", [GPT2, TIED_LLAMA, VIT], ids=["gpt2", "tied-llama", "vit"])
def test_shrink_adds_the_scaled_prediction_and_implies_keep_init(ghn, config):
    """``W0 + shrink * P`` with ``P`` as predict writes it (GPT-2's residual branches scaled, so
    their weights get both factors), the head tied to the embeddings shrunk once, and the ViT,
    whose family does not keep its init, keeping it because shrink asks for it."""
    torch.manual_seed(1)
    model = build_model(config, "cpu")
    init = {name: p.detach().clone() for name, p in model.named_parameters()}
    graph = graphkit.trace(model)
    prediction = predicted_params(ghn, graph)
    predict(model, ghn, graph=graph, shrink=0.25)
    for name, value in expected(init, prediction, 0.25).items():
        torch.testing.assert_close(model.get_parameter(name).detach(), value, rtol=1e-5, atol=1e-6, msg=name)
    if config is TIED_LLAMA:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_the_family_sets_the_shrink_unless_told_or_trained_onto_the_init(monkeypatch):
    """``Family.shrink`` is predict's factor when none is given (with the init kept, by the
    family or by the caller); a hypernetwork trained onto the init predicts corrections at full
    scale, so it gets 1 whatever its family says; a given shrink wins over both."""
    ghn = load_checkpoint(bundled_checkpoint("llama"))
    graph = graphkit.trace(build_model(LLAMA))
    monkeypatch.setitem(FAMILIES, "llama", replace(FAMILIES["llama"], shrink=0.5))
    assert default_shrink(graph) == 0.5 and default_shrink(graph, {"train": {"keep_init": True}}) == 1.0
    assert default_shrink(graph, {"train": {"keep_init": True}}, 0.25) == 0.25  # a choice wins over both
    prediction = predicted_params(ghn, graph)
    for given, factor in ((None, 0.5), (0.25, 0.25)):
        torch.manual_seed(0)
        model = build_model(LLAMA, "cpu")
        init = {name: p.detach().clone() for name, p in model.named_parameters()}
        predict(model, ghn, graph=graph, keep_init=True, shrink=given)
        for name, value in expected(init, prediction, factor).items():
            torch.testing.assert_close(model.get_parameter(name).detach(), value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("shrink", [0, -0.5, 1.5, math.nan, math.inf, "half", True])
def test_shrink_must_be_a_number_above_0_and_at_most_1(shrink):
    with pytest.raises(PredictError, match=r"^shrink must be a number above 0 and at most 1 .*; got "):
        predict(build_model(GPT2), shrink=shrink)


def test_shrink_needs_the_init_kept():
    with pytest.raises(PredictError, match="shrink scales the prediction added onto the model's own init; it needs"):
        predict(build_model(GPT2), shrink=0.5, keep_init=False)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--shrink", "0"], "shrink must be a number above 0 and at most 1"),
        (["--shrink", "nan"], "shrink must be a number above 0 and at most 1"),
        (["--shrink", "0.5", "--no-keep-init"], "it needs keep_init, which is off"),
    ],
)
def test_the_cli_refuses_a_bad_shrink_before_loading_the_model(tmp_path, flags, message):
    """Before the model file is read: this one does not exist, and the error is the option's."""
    result = runner.invoke(app, ["predict", str(tmp_path / "absent.py"), *flags])
    assert result.exit_code == 1 and message in one_line_error(result), result.output


@pytest.mark.slow
def test_the_cli_writes_a_shrunk_prediction_onto_the_init(tmp_path):
    """``predict`` on a LLaMA keeps its init with half the prediction, its family's default (the
    file builds it on meta, so the init is drawn as transformers draws it): it says so, and the
    weights it writes are that init plus half the prediction, the norms as predicted;
    ``--shrink 0.25`` says its factor."""
    model_file = tmp_path / "small_llama.py"
    model_file.write_text(
        "import graphkit.families as families\n\n\n"
        f"def build_model():\n    return families.build_model({LLAMA!r}, 'meta')\n"
    )
    files, said = {}, {}
    for flags in ([], ["--no-keep-init"], ["--shrink", "0.25"]):
        out = tmp_path / f"{''.join(flags) or 'default'}.safetensors"
        result = runner.invoke(app, ["predict", str(model_file), "--out", str(out), *flags])
        assert result.exit_code == 0, result.output
        said[tuple(flags)] = next((line for line in result.stdout.splitlines() if "adding the" in line), None)
        files[tuple(flags)] = load_file(out)
    assert said[()] == (
        "adding the prediction x 0.5 onto small_llama.py's own initialisation (the default for llama models; "
        "--no-keep-init: the prediction alone)"
    )
    assert said[("--no-keep-init",)] is None and "x 0.25 onto" in said[("--shrink", "0.25")]
    alone, shrunk_ = files[("--no-keep-init",)], files[()]
    for name, value in alone.items():
        if value.dim() >= 2:  # what is left once half the prediction is taken out: transformers' init, std 0.02,
            left = shrunk_[name] - 0.5 * value  # and nothing of the prediction (a whole one would leave half)
            correlation = torch.corrcoef(torch.stack([left.flatten(), value.flatten()]))[0, 1]
            assert 0.018 < left.std() < 0.022 and abs(correlation) < 0.1, (name, left.std(), correlation)
        else:
            assert torch.equal(shrunk_[name], value), name


@pytest.mark.slow
def test_the_family_decides_unless_told():
    gpt2, vit, llama = (graphkit.trace(build_model(c)) for c in (GPT2, VIT, LLAMA))
    assert should_keep_init(gpt2) and not should_keep_init(vit) and should_keep_init(llama)
    assert not should_keep_init(gpt2, False) and should_keep_init(vit, True)
    assert (default_shrink(gpt2), default_shrink(vit), default_shrink(llama)) == (1.0, 1.0, 0.5)


def test_the_start_follows_the_checkpoints_family_then_the_models(monkeypatch):
    """A start is measured for a checkpoint on the held-out models of its own pool, so the family
    its config.json names decides: the zoo-decoders checkpoint's ``transformers`` for a Qwen2 it
    predicts, which is of no graphkit family, the LLaMA one's for a Mistral; a checkpoint of no
    registered family leaves it to the model's (a Mistral's: the llama family's, which lists it
    in ``traced_as``); a choice wins over both."""
    monkeypatch.setitem(FAMILIES, "transformers", replace(FAMILIES["transformers"], keep_init=True, shrink=0.25))
    graph = graphkit.trace(build_model(LLAMA))
    graph.meta["family"] = "qwen2"  # a transformers decoder, traced as its model type
    assert not should_keep_init(graph) and default_shrink(graph) == 1.0  # no family of its own
    zoo = {"family": "transformers"}
    assert should_keep_init(graph, None, zoo) and default_shrink(graph, zoo) == 0.25
    assert not should_keep_init(graph, False, zoo) and default_shrink(graph, zoo, 0.75) == 0.75
    graph.meta["family"] = "mistral"
    assert should_keep_init(graph, None, {"family": "llama"}) and default_shrink(graph, {"family": "llama"}) == 0.5
    # a checkpoint of no registered family: the model's, the llama family's for a Mistral (its traced_as)
    assert should_keep_init(graph, None, {"family": "nobody"}) and default_shrink(graph, {"family": "nobody"}) == 0.5
    graph.meta["family"] = "gpt2"  # the model's family where the checkpoint names none registered
    assert should_keep_init(graph, None, {"family": "nobody"}) and default_shrink(graph, {}) == 1.0


@pytest.mark.slow
def test_predict_follows_the_family_default():
    """GPT-2 keeps its init by default, a LLaMA keeps it with half the prediction (shrink and
    perturb), and so does a timm model the vision zoo's checkpoint predicts (the family its
    config.json names); a ViT gets the prediction alone."""
    for config, kept in ((GPT2, 1.0), (LLAMA, 0.5), (VIT, 0.0), (SIGLIP, 0.5)):
        torch.manual_seed(0)
        model = build_model(config, "cpu")
        init = {name: p.detach().clone() for name, p in model.named_parameters()}
        graph = graphkit.trace(model)
        ghn = load_checkpoint(bundled_for(graph))
        assert ghn.info["family"] == ("timm" if config is SIGLIP else config["family"])
        prediction = predicted_params(ghn, graph)
        predict(model, ghn, graph=graph)
        want = expected(init, prediction, kept) if kept else prediction
        for name, value in want.items():
            torch.testing.assert_close(model.get_parameter(name).detach(), value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_meta_built_gpt2_keeps_its_library_init_and_runs():
    """On meta there is no init to keep: transformers' own is drawn (0.02, the branch ends
    0.02 / sqrt(2 n_layer)) and the prediction added; the model then gives a finite loss on text,
    below the unigram level a prediction alone of this checkpoint is near."""
    ghn = load_checkpoint(bundled_checkpoint("gpt2"))
    model = build_model(GPT2, "meta")
    graph = graphkit.trace(model)
    prediction = predicted_params(ghn, graph)
    torch.manual_seed(0)
    predict(model, ghn, graph=graph, keep_init=True)
    assert not any(p.is_meta for p in model.parameters())
    writers = set(residual_writers(graph))
    for name, p in prediction.items():
        kept = model.get_parameter(name).detach() - p
        if p.dim() < 2:
            assert torch.equal(kept, torch.zeros_like(kept)), name
        else:
            scale = 0.02 / math.sqrt(2 * GPT2["num_layers"]) if name in writers else 0.02
            assert abs(kept.std().item() / scale - 1) < 0.15, (name, kept.std().item())
    source = load_source("stdlib-text", seq_len=32)
    inputs, labels = source.batch(GPT2, 4, torch.Generator().manual_seed(0), split="eval")
    with torch.no_grad():
        logits = model(inputs).logits
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert torch.isfinite(loss) and loss < math.log(256)


def test_a_meta_parameter_no_library_fills_is_refused_and_the_model_left_on_meta():
    """A timm ViT fills its position table and class token in ``init_weights``; one whose
    ``init_weights`` is gone has no initialisation for them, so there is nothing to keep."""
    ghn = load_checkpoint(bundled_checkpoint("vit"))
    model = build_model(VIT, "meta")
    model.init_weights = None  # as a module of its own class without that method would be
    with pytest.raises(KeepInitError, match=r"no initialisation for its meta parameter '(cls_token|pos_embed)'"):
        predict(model, ghn, keep_init=True)
    assert all(p.is_meta for p in model.parameters())


def test_initialise_as_built_uses_each_module_reset_where_the_model_has_no_init():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    params = {name: torch.empty(p.shape) for name, p in model.named_parameters()}
    for name, value in params.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(value))
    initialise_as_built(model, dict(model.named_parameters()))
    assert torch.equal(model[1].weight, torch.ones(8)) and model[0].weight.abs().max() <= 8**-0.5
    model.add_module("extra", nn.Module())
    model.extra.scale = nn.Parameter(torch.empty(3))
    with pytest.raises(KeepInitError, match="no initialisation for its meta parameter 'extra.scale'"):
        initialise_as_built(model, {"extra.scale": model.extra.scale})


def test_an_init_weights_that_needs_arguments_is_left_to_each_module_reset():
    """A model whose ``init_weights`` takes a required argument (what it means is the model's own)
    is not called with a guess, nor does it fail with a TypeError: each torch layer's
    ``reset_parameters`` fills its parameters instead."""

    class Scheme(nn.Sequential):
        def init_weights(self, scheme: str) -> None:
            raise AssertionError(f"called with {scheme!r}")

    with torch.device("meta"):
        model = Scheme(nn.Linear(8, 8), nn.LayerNorm(8))
    for name, p in list(model.named_parameters()):
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(torch.empty(p.shape)))
    initialise_as_built(model, dict(model.named_parameters()))
    assert torch.equal(model[1].weight, torch.ones(8)) and 0 < model[0].weight.abs().max() <= 8**-0.5


def test_keep_init_must_be_a_flag():
    with pytest.raises(PredictError, match="keep-init must be true or false; got 'yes'"):
        predict(build_model(GPT2), keep_init="yes")


@pytest.mark.slow
def test_the_cli_keeps_the_init_for_gpt2_unless_told_not_to(tmp_path):
    model_file = tmp_path / "small_gpt2.py"
    model_file.write_text(
        "import torch\nfrom transformers import GPT2Config, GPT2LMHeadModel\n\n\ndef build_model():\n"
        "    with torch.device('meta'):\n"
        "        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64))\n"
    )
    files = {}
    for flag in ("", "--keep-init", "--no-keep-init"):
        out = tmp_path / f"{flag or 'default'}.safetensors"
        result = runner.invoke(app, ["predict", str(model_file), "--out", str(out), *([flag] if flag else [])])
        assert result.exit_code == 0, result.output
        kept = "adding the prediction onto small_gpt2.py's own initialisation" in result.stdout
        assert kept == (flag != "--no-keep-init"), result.stdout
        assert ("the default for gpt2 models" in result.stdout) == (flag == ""), result.stdout
        files[flag] = load_file(out)
    alone, kept = files["--no-keep-init"], files[""]
    for name, value in alone.items():
        if value.dim() >= 2 and name.endswith("weight") and "wpe" not in name:
            assert 0.005 < (kept[name] - value).std() < 0.03, name  # transformers' init, 0.02 or 0.01
        elif value.dim() < 2:
            assert torch.equal(kept[name], value), name
    refused = runner.invoke(app, ["predict", str(model_file), "--keep-init=no"])
    assert "--keep-init" in one_line_error(refused) if refused.exit_code == 1 else refused.exit_code == 2


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_hand_written_model_with_saturated_logits_is_predicted_alone_by_default(tmp_path, tied):
    """A GPT whose head is tied to an ``nn.Embedding`` left at torch's N(0, 1) scores random
    tokens at tens of nats: the prediction added onto that init (GPT-2's default) kept it and
    lost to the own init after 100 steps, where the prediction alone won by 2.4 nats. Untied, the
    same model's logits are small and the default stands; ``--keep-init`` is followed as given."""
    path = tmp_path / "gpt.py"
    path.write_text((MODEL_FILES / "torch_gpt.py").read_text().replace("TIED = False", f"TIED = {tied}"))
    outputs = {}
    for flag in ("", "--keep-init"):
        out = tmp_path / f"{flag or 'default'}.safetensors"
        result = runner.invoke(app, ["predict", str(path), "--out", str(out), *([flag] if flag else [])])
        assert result.exit_code == 0, result.output
        alone = "predicting gpt.py alone, not onto its own initialisation (the default for" in result.stdout
        assert alone == (tied and not flag), result.stdout
        kept = "adding the prediction" in result.stdout and "onto gpt.py's own initialisation" in result.stdout
        assert kept == (not alone), result.stdout
        outputs[flag] = load_file(out)["tok.weight"].std().item()
    assert (outputs[""] < 0.5) == tied and outputs["--keep-init"] > 0.9  # the own init's table: std 1


def test_saturation_is_read_in_the_logits_of_an_output_of_several_fields(tmp_path):
    """nanoGPT returns ``(logits, loss)``: its saturated logits are read as training reads them
    (before, only a tensor or an output's ``.logits`` was, and such an init was kept)."""
    path = tmp_path / "gpt.py"
    source = (MODEL_FILES / "torch_gpt.py").read_text().replace("TIED = False", "TIED = True")
    path.write_text(source.replace("return self.head(x)", "return self.head(x), None"))
    model = load_model_file(path).model
    loss, uniform = saturated_init(model, graphkit.trace(model))
    assert loss > 10 * uniform and uniform == pytest.approx(math.log(256))


def test_saturation_is_read_only_for_hand_written_models_with_weights():
    """A library's model keeps its library's convention; a meta one has no logits to read."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256, n_positions=32))
    with torch.no_grad():
        model.transformer.wte.weight.normal_(0, 1)  # saturated, but a library's model
    assert saturated_init(model, graphkit.trace(model)) is None


def test_eval_keep_init_is_the_random_init_plus_the_prediction():
    """eval-ghn's keep_init row starts from the very init of its random row (same seed)."""
    ghn = load_checkpoint(bundled_checkpoint("gpt2"))
    graph = graphkit.trace(build_model(GPT2))
    prediction = predicted_params(ghn, graph)
    torch.manual_seed(0)
    random = build_model(GPT2, "cpu")
    torch.manual_seed(0)
    kept = initialise(build_model(GPT2, "cpu"), "keep_init", prediction)
    init = {name: p.detach() for name, p in random.named_parameters()}
    for name, value in expected(init, prediction).items():
        torch.testing.assert_close(kept.get_parameter(name).detach(), value, msg=name)
    assert add_prediction(random, prediction) is random


def test_eval_keep_init_shrinks_the_prediction_it_adds():
    """eval-ghn --shrink: the keep_init row starts from random's init plus the prediction times
    the factor, as predict(shrink=...) writes it; the factor is checked where it enters."""
    prediction = {"w": torch.ones(3, 2), "b": torch.full((3,), 2.0)}
    assert (
        torch.equal(shrunk(prediction, 0.5)["w"], torch.full((3, 2), 0.5))
        and shrunk(prediction, 0.5)["b"] is prediction["b"]
    )
    inits = ("predicted", "random", "orthogonal", "keep_init")
    assert EvalConfig(dataset="-", inits=inits, shrink=0.5).shrink == 0.5
    with pytest.raises(EvalError, match="shrink must be a number above 0 and at most 1 .*; got nan"):
        EvalConfig(dataset="-", inits=inits, shrink=math.nan)
    with pytest.raises(EvalError, match="shrink 0.5 scales the keep_init row; add keep_init to inits"):
        EvalConfig(dataset="-", shrink=0.5)


def test_eval_summary_reports_keep_init_beside_the_others_and_stays_as_it_was_without():
    assert EvalConfig(dataset="-", inits=("predicted", "random", "orthogonal", "keep_init")).inits[-1] == "keep_init"
    scores = {"accuracy_0": 0.0, "accuracy_5": 0.0, "accuracy": 0.0}
    rows = [
        {"id": a, "init": init, "task": "text", "horizons": [0, 5], "loss_0": loss, "loss_5": loss - 1}
        | {"loss": loss - 1, **scores}
        for a, losses in (("a", (3.0, 9.0, 9.5, 2.5)), ("b", (3.0, 9.0, 9.5, 3.5)))
        for init, loss in zip(("predicted", "random", "orthogonal", "keep_init"), losses)
    ]
    summary = summarize(rows)
    assert summary["keep_init_wins"]["5"] == {"predicted": 0.5, "random": 1.0, "orthogonal": 1.0}
    assert summary["keep_init_beats_random"] == 1.0 and summary["predicted_beats_keep_init"] == 0.5
    assert summary["shrink"] == 1.0  # rows written before shrink existed added the prediction whole
    assert summarize([r | {"shrink": 0.5} if r["init"] == "keep_init" else r for r in rows])["shrink"] == 0.5
    without = summarize([r for r in rows if r["init"] != "keep_init"])
    assert "keep_init_wins" not in without and set(without["wins"]["5"]) == {"random", "orthogonal"}

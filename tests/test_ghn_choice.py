"""Which bundled hypernetwork predicts a model: chosen by what the model is (its input and the op
kinds it has), not by its family's name; a model no bundled one trained on every op of is refused
in one line naming the ops; a model with tied embeddings is warned about while no checkpoint has
trained on one. Every model is built from a small config on the meta device."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import ROOT, gpt2, llama, meta, mistral, one_line_error, timm_vit
from torch import nn
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.datasets.shrink import decoder_plans
from graphkit.families import FAMILIES, build_model, get_family, register_family
from graphkit.ghn import LoGAH, LoGAHConfig
from graphkit.ghn.checkpoint import (
    BUNDLED,
    HAND_WRITTEN_FIRST,
    ZOO_BUNDLED,
    UntrainedOpError,
    bundled_checkpoint,
    bundled_for,
    bundled_info,
    bundled_names,
    check_graph,
    checkpoint_task,
    load_checkpoint,
)
from graphkit.ghn.keep_init import keep_init_as_is
from graphkit.ghn.predict import predict, prediction_refusal, reason_of, refusal_reason
from graphkit.ghn.space import input_task, outside_training_space, space_distance, tied_embeddings, training_space
from graphkit.params import load_params, read_params
from graphkit.sources import load_model_source
from graphkit.tracing import trace
from graphkit.training.data import calibration_inputs, data_config, load_source
from graphkit.training.loop import score

PRETRAINED = ROOT / "graphkit" / "ghn" / "pretrained"
runner = CliRunner()

#: the refusal's tail: which checkpoints exist, by the input they were trained on
LISTED = (
    "(bundled: text: logah-tiny-gpts, logah-tiny-llamas, logah-tiny-zoo-decoders; "
    "image: logah-tiny-vits, logah-tiny-zoo-vision)"
)


def decoder(model_type: str, **config):
    """transformers' causal LM of ``model_type``: 2 layers, width 64, 4 heads sharing 2 key/value
    heads, 256 tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
    built = AutoConfig.for_model(model_type, **{"num_key_value_heads": 2, "head_dim": 16, **small, **config})
    return meta(lambda: AutoModelForCausalLM.from_config(built))


def softplus_vit_graph():
    """A timm ViT at 32 px whose MLPs use softplus, traced: an op no image checkpoint trained on."""
    from timm.models.vision_transformer import VisionTransformer

    build = dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, num_classes=10, act_layer=nn.Softplus)
    return trace(meta(lambda: VisionTransformer(**build)))


def small_timm(name: str):
    """A timm model of name's architecture at 32 px, 2 blocks (a Swin: 2 a stage, so that one shifts)."""
    if name.startswith("swin"):
        return timm_vit(name, img_size=32, patch_size=2, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4))
    return timm_vit(name, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)


def test_the_bundled_checkpoints_record_what_they_are_chosen_by():
    """task, trained ops and trained_on in each config.json, as train-ghn records them (or, for
    the two trained before it did, read off their dataset and ops); the language models' trained
    on tied models too; every family's checkpoint on 2 CPU cores (the LLaMA one, on an H200 until
    its retraining in two stages on 2026-11-28)."""
    for name in dict.fromkeys(BUNDLED.values()):
        info = bundled_info(name)
        dataset = Path(info["dataset"]).name
        assert info["task"] == checkpoint_task({"trained_ops": info["trained_ops"]})
        # a checkpoint trained further (the ViT one: vits-digits, then its mix with pre-norm ViTs) names each stage's
        stages = [stage["dataset"] for stage in info.get("stages", [{"dataset": dataset}])]
        assert stages[-1] == dataset and info["trained_on"] == list(dict.fromkeys(stages))
        assert info["space"]["tied"] is (info["task"] == "text")
        assert info["machine"] == "2 CPU cores"
    assert {n: bundled_info(n)["task"] for n in dict.fromkeys(BUNDLED.values())} == {
        "logah-tiny-gpts": "text",
        "logah-tiny-llamas": "text",
        "logah-tiny-vits": "image",
    }


def test_the_zoo_checkpoints_record_their_mini_zoo_its_ops_and_the_tied_models_it_held():
    """The checkpoints trained across families: each on its mini zoo's train families, recording
    the ops that only some families have (Swin's roll, layer scale, MoE, state-space layers) and,
    for the decoders, that tied models were among them (Gemma, OPT, BLOOM tie theirs)."""
    assert ZOO_BUNDLED == ("logah-tiny-zoo-vision", "logah-tiny-zoo-decoders")
    assert bundled_names() == [*dict.fromkeys(BUNDLED.values()), *ZOO_BUNDLED]
    vision, decoders = (bundled_info(name) for name in ZOO_BUNDLED)
    assert (vision["task"], vision["trained_on"], vision["space"]["tied"]) == ("image", ["zoo-vits-mini"], False)
    # MaxViT's tanh, VOLO's fold and Apertus's xielu: their families no longer held out alone
    assert {"tanh", "fold"} <= set(vision["trained_ops"]) and "xielu" in decoders["trained_ops"]
    assert (decoders["task"], decoders["trained_on"], decoders["space"]["tied"]) == (
        "text",
        ["zoo-decoders-mini"],
        True,
    )
    assert {"roll", "scale", "mean_pool", "batch_norm", "conv"} <= set(vision["trained_ops"])
    assert {"moe", "ssm", "gelu", "layer_norm", "softcap"} <= set(decoders["trained_ops"])
    assert vision["space"]["resolution"] == [32, 128] and decoders["space"]["vocabulary"][0] == 256
    # the decoder one reads a wrapped projection (Moshi's q_proj.linear) by its wrapper's name
    assert (vision["logah"]["role_key"], decoders["logah"]["role_key"]) == ("leaf", "layer")


def test_input_task_is_read_off_the_graph():
    assert input_task(trace(gpt2(layers=1))) == "text"
    assert input_task(trace(small_timm("vit_small_patch16_224"))) == "image"
    assert checkpoint_task({"trained_ops": ["input", "embedding", "linear"]}) == "text"
    assert checkpoint_task({"task": "image", "trained_ops": ["embedding"]}) == "image"  # recorded wins
    assert checkpoint_task({}) is None


@pytest.mark.parametrize(
    ("build", "chosen"),
    [
        # LLaMA's ops, of another family: the decoders' zoo one, at LLaMA's 32,000 tokens too
        (lambda: decoder("mistral", vocab_size=32000), "logah-tiny-zoo-decoders"),
        (lambda: mistral(layers=2), "logah-tiny-zoo-decoders"),
        (lambda: decoder("qwen2"), "logah-tiny-zoo-decoders"),  # with q/k/v biases
        (lambda: llama(layers=2), "logah-tiny-llamas"),
        (lambda: gpt2(layers=2), "logah-tiny-gpts"),
        (lambda: small_timm("deit_small_patch16_224"), "logah-tiny-vits"),
        # layer scale, which the family's checkpoint never saw: predicted as the plain ViT it computes
        (lambda: small_timm("deit3_small_patch16_224"), "logah-tiny-vits"),
        (lambda: small_timm("vit_base_patch16_siglip_gap_224"), "logah-tiny-zoo-vision"),  # pooled by the mean
        # ViT's ops, of a family no checkpoint trained on (the vision zoo holds ConViT out)
        (
            lambda: timm_vit("convit_tiny", img_size=32, patch_size=8, depth=2, local_up_to_layer=1),
            "logah-tiny-zoo-vision",
        ),
        pytest.param(
            lambda: small_timm("swin_tiny_patch4_window7_224"), "logah-tiny-zoo-vision", marks=pytest.mark.slow
        ),
        (lambda: decoder("gemma"), "logah-tiny-zoo-decoders"),  # gelu MLP
        (
            lambda: decoder("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
            "logah-tiny-zoo-decoders",
        ),
    ],
    ids=[
        "mistral-32000",
        "mistral",
        "qwen2",
        "llama",
        "gpt2",
        "deit",
        "deit3",
        "siglip-gap",
        "convit",
        "swin",
        "gemma",
        "qwen3_moe",
    ],
)
def test_a_model_gets_the_checkpoint_trained_on_its_input_and_its_ops(build, chosen):
    """The family's own checkpoint where it holds every op (a DeiT-III's plain twin, without its
    layer scale, gets the ViT one). A model of another family whose ops a family's checkpoint has
    gets the one trained across families, at any vocabulary (a Mistral of 32,000 tokens starts
    4.35 nats lower from the LLaMA one, and is 0.05 behind after 300 steps in both seeds; a
    Mistral or a Qwen2 of 256 tokens is behind from it at every horizon:
    benchmarks/hand_written_checkpoints.py --group library and --group vocabularies; ConViT, a
    family no checkpoint trained on: from the ViT one it starts at 3.71 against 2.33). Ops only
    a zoo checkpoint trained on take it (a SigLIP's mean pooling, a Swin's shifted windows, a
    Gemma's gelu, a Qwen3-MoE's experts)."""
    graph = trace(build())
    assert bundled_for(graph).name == chosen and prediction_refusal(graph) is None


@pytest.mark.parametrize(
    ("traced", "task", "nearest", "missing"),
    [
        (softplus_vit_graph, "image", "logah-tiny-vits", "softplus"),
        (lambda: trace(decoder("gpt2", activation_function="tanh")), "text", "logah-tiny-gpts", "tanh"),
    ],
    ids=["softplus-vit", "tanh-gpt2"],
)
def test_a_model_with_an_op_no_checkpoint_of_its_task_trained_on_is_refused_in_one_line(traced, task, nearest, missing):
    graph = traced()
    with pytest.raises(UntrainedOpError) as error:
        bundled_for(graph)
    assert str(error.value) == (
        f"no bundled hypernetwork was trained on every op of this {task} model: the nearest, {nearest}, "
        f"never saw {missing} {LISTED}; train one with `graphkit train-ghn` on models with these ops and pass --ghn"
    )
    reason = f"missing op{'s' if ',' in missing else ''}: {missing}"
    assert refusal_reason(graph) == (reason, str(error.value), tuple(missing.split(", ")))


def test_a_refusal_at_a_node_is_counted_without_the_node():
    """The zoo report counts refusals by reason: the same error at another node is the same reason."""
    graph = trace(decoder("gpt2"))
    refusal = refusal_reason(graph, LoGAH(LoGAHConfig(num_ops=3)))
    newer = "has op 'embedding', which is newer than the 3 ops this hypernetwork reads"
    assert refusal.message.startswith(f"node 'transformer.wte' {newer}") and refusal.missing == ()
    assert refusal.reason == reason_of(refusal.message) and refusal.reason.startswith(f"node '...' {newer}")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen2", "mistral"])
def test_a_decoder_of_another_family_is_predicted_whole_and_runs(model_type):
    """What the choice is for: the prediction of a Qwen2 (its q/k/v biases) or a Mistral, built
    on meta, by the checkpoint trained on their families (the decoders' zoo one) fills every
    parameter and runs."""
    model = decoder(model_type)
    params = predict(model)
    assert sum(p.numel() for p in params.values()) == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits = model(torch.randint(256, (1, 8))).logits
    assert logits.shape == (1, 8, 256) and torch.isfinite(logits).all()


@pytest.fixture
def zoo_vision(tmp_path):
    """A checkpoint added later, as train-ghn writes one trained on a vision zoo: the bundled
    ViT's weights, a config that records mean pooling among its trained ops, registered as a
    family's bundled checkpoint and removed afterwards."""
    folder = tmp_path / "logah-tiny-zoo-vision"
    folder.mkdir()
    shutil.copy(PRETRAINED / "logah-tiny-vits" / "model.safetensors", folder)
    info = json.loads((PRETRAINED / "logah-tiny-vits" / "config.json").read_text())
    info.update(family="zoo-vision", trained_on=["zoo-vits-mini"], trained_ops=[*info["trained_ops"], "mean_pool"])
    info["space"]["resolution"] = [32, 32]
    (folder / "config.json").write_text(json.dumps(info))
    register_family(
        dataclasses.replace(
            get_family("vit"),
            name="zoo-vision",
            recipes=(),
            data=None,
            bundled_ghn=str(folder),
            attention_adapter=None,
            traced_as=(),
        )
    )
    yield folder
    del FAMILIES["zoo-vision"]


@pytest.mark.slow
def test_a_checkpoint_added_later_is_chosen_by_its_config_alone(zoo_vision):
    """A SigLIP ViT (the vit family) pools by the mean, which the family's own checkpoint never
    trained on: the new one that did predicts it. A plain DeiT fits both and gets its family's
    own; a hand-written ViT of no family gets the one whose training space (32 px) it lies nearer."""
    siglip = trace(small_timm("vit_base_patch16_siglip_gap_224"))
    assert bundled_for(siglip) == zoo_vision and prediction_refusal(siglip) is None
    deit = trace(small_timm("deit_small_patch16_224"))
    assert bundled_for(deit).name == "logah-tiny-vits"
    vit = build_model({"family": "vit", "num_layers": 2, "hidden": 64, "heads": 2, "patch_size": 8}, "meta")
    custom = trace(vit)
    custom.meta["family"] = "custom"
    infos = {"vits": bundled_info("logah-tiny-vits"), "zoo": bundled_info(str(zoo_vision))}
    assert space_distance(infos["zoo"], custom) < space_distance(infos["vits"], custom)
    assert bundled_for(custom) == zoo_vision


@pytest.mark.slow
def test_every_example_is_accepted_by_predict():
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert len(examples) == 5
    for file in examples:
        graph = trace(load_model_source(str(file), weights=False).model)
        assert prediction_refusal(graph) is None, (file.name, prediction_refusal(graph))


@pytest.mark.slow
def test_predict_cli_takes_a_model_of_no_family_whose_ops_a_checkpoint_trained_on():
    """The hand-written LLaMA of examples/ (family "custom") was refused for its family's name;
    it gets the checkpoint trained across transformers' decoders, and the CLI says why, and which
    of its names no training family had (its role prototypes place them)."""
    result = runner.invoke(app, ["predict", str(ROOT / "examples" / "llama_block.py")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert (
        "bundled hypernetwork logah-tiny-zoo-decoders: trained on text models and on every op kind llama_block.py "
        "has; trained across families, it fine-tunes a hand-written model better than a family's"
    ) in said
    assert (
        "4 of llama_block.py's parameter roles are none this hypernetwork trained on; each decodes through the "
        "trained role nearest its node: embed.weight as "
    ) in said
    assert "wq.weight as " in said and "w1.weight" not in said  # the MLP's names are some training family's
    assert "trained on zoo-decoders-mini" in result.stdout


def test_predict_cli_predicts_a_meta_built_model_through_a_checkpoint_with_role_prototypes(tmp_path):
    """hf: and timm: models are built on the meta device, so their trace records no init. Naming
    the stand-in roles encoded that graph bare, and the zoo checkpoints (role prototypes, 1-D
    parameters decoded around the init) refused every such model (2026-12-06). The CLI encodes
    the graph predict encodes, with the init record of the model as its library builds it."""
    spec, out = "hf:mamba?num_hidden_layers=1&hidden_size=32&vocab_size=300", tmp_path / "mamba.safetensors"
    result = runner.invoke(app, ["predict", spec, "--no-keep-init", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "bundled hypernetwork logah-tiny-zoo-decoders" in result.stdout
    ghn = load_checkpoint(bundled_for(trace(load_model_source(spec, weights=False).model)))
    assert ghn.config.role_prototypes and ghn.config.init_anchors
    model = load_model_source(spec, weights=False).model
    expected = predict(model, ghn, keep_init=False)
    written = read_params(out)[0]
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[name], expected[name].detach().cpu()) for name in written)


def test_a_hand_written_decoder_gets_the_decoders_zoo_checkpoint_and_a_hand_written_vit_the_vit_one():
    """A model of no family is predicted by HAND_WRITTEN_FIRST's checkpoint where its ops allow:
    nanoGPT and a hand-written LLaMA fine-tune better from the decoders' zoo checkpoint than from the
    GPT-2 or LLaMA one (benchmarks/hand_written_checkpoints.py), a hand-written ViT worse from the
    vision zoo's than from the ViT one. The same models built by their library keep their family's."""
    assert HAND_WRITTEN_FIRST == ("logah-tiny-zoo-decoders",)
    hand_written = {
        "nano_gpt.py": "logah-tiny-zoo-decoders",
        "torch_gpt.py": "logah-tiny-zoo-decoders",
        "torch_vit.py": "logah-tiny-vits",
    }
    for name, chosen in hand_written.items():
        loaded = load_model_source(str(ROOT / "tests" / "model_files" / name), weights=False)
        graph = trace(loaded.model, loaded.example_inputs)
        assert graph.meta["family"] == "custom" and bundled_for(graph).name == chosen, name
    llama_block = trace(load_model_source(str(ROOT / "examples" / "llama_block.py"), weights=False).model)
    assert bundled_for(llama_block).name == "logah-tiny-zoo-decoders"
    assert bundled_for(trace(gpt2(layers=2))).name == "logah-tiny-gpts"
    assert bundled_for(trace(llama(layers=2))).name == "logah-tiny-llamas"


CONVNET = (
    "import torch\n"
    "model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),\n"
    "                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10{bias}))\n"
    "def example_inputs():\n"
    "    return torch.randn(2, 3, 32, 32)\n"
)


def test_predict_cli_says_a_batch_norm_models_statistics_are_its_constructors(tmp_path):
    """Scored in eval mode with its constructor's running statistics a predicted BatchNorm model
    is not the model its hypernetwork trained (docs/experiments.md, "BatchNorm statistics")."""
    source = tmp_path / "convnet.py"
    source.write_text(CONVNET.format(bias=""))
    result = runner.invoke(app, ["predict", str(source)])
    assert result.exit_code == 0, result.output
    assert "convnet.py has BatchNorm: its running statistics stay its constructor's" in " ".join(result.stdout.split())
    plain = runner.invoke(app, ["predict", str(ROOT / "examples" / "llama_block.py")])
    assert plain.exit_code == 0 and "BatchNorm" not in plain.stdout


def test_predict_cli_balances_the_classes_over_the_images_it_is_given(tmp_path):
    """--balance-on moves the output layer's bias alone, and the model it writes predicts every
    class equally often on average over the images it was balanced on."""
    digits_vit = ROOT / "tests" / "model_files" / "digits_vit.py"
    plain, balanced = tmp_path / "plain.safetensors", tmp_path / "balanced.safetensors"
    assert runner.invoke(app, ["predict", str(digits_vit), "--out", str(plain)]).exit_code == 0
    result = runner.invoke(app, ["predict", str(digits_vit), "--balance-on", "digits", "--out", str(balanced)])
    assert result.exit_code == 0, result.output
    assert "balancing its classes over 128 training images of digits (labels unused)" in " ".join(result.stdout.split())
    before, after = read_params(plain)[0], read_params(balanced)[0]
    assert before.keys() == after.keys()
    assert [name for name in before if not torch.equal(before[name], after[name])] == ["head.bias"]
    model = load_model_source(str(digits_vit), weights=False).model
    load_params(model, balanced)
    images = torch.cat(calibration_inputs(data_config(model), "digits", batches=4, batch_size=32))
    with torch.no_grad():
        prior = model.eval()(images).softmax(-1).mean(0)
    assert (prior * 10 - 1).abs().max() < 0.01
    load_params(model, plain)
    with torch.no_grad():
        assert (model(images).softmax(-1).mean(0) * 10 - 1).abs().max() > 0.05  # what balancing took out


def test_predict_cli_balancing_a_batch_norm_model_estimates_its_statistics_on_the_same_images(tmp_path):
    source, out = tmp_path / "convnet.py", tmp_path / "convnet.safetensors"
    source.write_text(CONVNET.format(bias=""))
    result = runner.invoke(app, ["predict", str(source), "--balance-on", "digits", "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = " ".join(result.stdout.split())
    assert "over 128 training images of digits (labels unused); its BatchNorm statistics estimated on them" in printed
    assert "stay its constructor's" not in printed
    params = read_params(out)[0]
    assert not torch.allclose(params["1.running_var"], torch.ones(16))  # estimated, not the constructor's


def test_predict_cli_refuses_to_balance_what_it_cannot_in_one_line_writing_nothing(tmp_path):
    digits_vit, out = str(ROOT / "tests" / "model_files" / "digits_vit.py"), tmp_path / "out.safetensors"
    text = runner.invoke(app, ["predict", digits_vit, "--balance-on", "stdlib-text", "--out", str(out)])
    assert one_line_error(text) == (
        "error: --balance-on balances an image classifier's classes; stdlib-text is text data, whose tokens have a "
        "prior of their own; accepted: digits, cifar10:DIR, cifar100:DIR, imagefolder:DIR"
    )
    missing = runner.invoke(app, ["predict", digits_vit, "--balance-on", f"cifar10:{tmp_path / 'none'}"])
    assert "does not exist" in one_line_error(missing)
    language_model = runner.invoke(app, ["predict", str(ROOT / "examples" / "gpt2.py"), "--balance-on", "digits"])
    assert "digits is image data but a" in one_line_error(language_model)
    source = tmp_path / "convnet.py"
    source.write_text(CONVNET.format(bias=", bias=False"))
    unbiased = runner.invoke(app, ["predict", str(source), "--balance-on", "digits", "--out", str(out)])
    assert one_line_error(unbiased).endswith("the output layer has no bias to balance the logits with")
    assert not out.exists()


@pytest.mark.slow
def test_tied_embeddings_are_read_off_the_graph_and_recorded_in_the_training_space():
    tied, untied = trace(gpt2(layers=1, tied=True)), trace(gpt2(layers=1))
    assert tied_embeddings(tied) and not tied_embeddings(untied)
    assert tied_embeddings(trace(decoder("qwen2", tie_word_embeddings=True))) and not tied_embeddings(
        trace(small_timm("deit_small_patch16_224"))
    )
    assert training_space([untied])["tied"] is False and training_space([untied, tied])["tied"] is True
    ghn = load_checkpoint(BUNDLED["gpt2"])
    check_graph(ghn, tied)
    assert ghn.info["space"]["tied"] is True  # gpts-1k draws both, and so did the bundled checkpoint
    phrase = "its input and output embeddings are tied, and it trained on untied models only"
    assert phrase not in (outside_training_space(ghn.info, tied) or "")
    unseen = {**ghn.info, "space": {**ghn.info["space"], "tied": False}}  # a checkpoint of untied models only
    assert phrase in outside_training_space(unseen, tied)
    assert phrase not in (outside_training_space(unseen, untied) or "")


def test_a_model_of_a_family_no_training_graph_had_is_named_beyond_the_space():
    gpt, llama_graph = trace(gpt2(layers=1)), trace(llama(layers=1))
    hand_written = trace(nn.Sequential(nn.Linear(8, 8)), torch.randn(2, 8))
    assert training_space([gpt, hand_written, gpt])["families"] == ["gpt2"]  # a hand-written model names none
    space = {"space": training_space([gpt])}
    assert outside_training_space(space, gpt) is None
    beyond = outside_training_space(space, llama_graph)  # its vocabulary too
    assert beyond.endswith(", its family llama is not the one it trained on (gpt2)")
    assert outside_training_space(space, hand_written) is None  # custom: no family to name
    two = {"space": {**space["space"], "families": ["gpt2", "mistral"]}}
    assert outside_training_space(two, llama_graph).endswith(
        "its family llama is none of the 2 it trained on (gpt2, mistral)"
    )
    many = {"space": {**space["space"], "families": ["a", "b", "c", "gpt2"]}}
    assert outside_training_space(many, llama_graph).endswith("its family llama is none of the 4 it trained on")
    before = {"space": {key: value for key, value in space["space"].items() if key != "families"}}
    assert "family" not in outside_training_space(before, llama_graph)  # a checkpoint from before families were


def zoo_decoder(model_type: str, tied: bool) -> dict:
    """A decoder zoo record's config: ``model_type`` at the mini zoo's smallest plan, ``tied`` or not."""
    from transformers import AutoConfig

    overrides = decoder_plans(AutoConfig.for_model(model_type).to_dict(), model_type)[0][1]
    return {"family": "transformers", "model_type": model_type, "shrink": {**overrides, "tie_word_embeddings": tied}}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "checkpoint"),
    [
        ({"family": "gpt2", "num_layers": 4, "hidden": 128, "heads": 4}, BUNDLED["gpt2"]),
        ({"family": "llama", "num_layers": 4, "hidden": 256, "heads": 4}, BUNDLED["llama"]),
        ("qwen2", "logah-tiny-zoo-decoders"),
        ("granite", "logah-tiny-zoo-decoders"),
    ],
    ids=["gpt2", "llama", "zoo-qwen2", "zoo-granite"],
)
def test_a_tied_language_model_is_predicted_below_the_unigram_loss_as_its_untied_twin_is(config, checkpoint):
    """Issue #44 item 6: the GPT-2 and LLaMA checkpoints trained on tied and untied models alike
    (GPT-2's encoder reading which nodes share the table, --tie-feature), the decoder zoo's on the
    zoo's own mix. Trained on untied models only, the GPT-2 one predicted a tied GPT-2 at 10.4, its
    own init's loss, where its untied twin started at 2.9 (docs/experiments.md, "Tied embeddings")."""
    source = load_source("stdlib-text")
    losses = {}
    for tied in (True, False):
        torch.manual_seed(0)
        if isinstance(config, str):
            model = build_model(zoo_decoder(config, tied), "cpu")
        else:
            model = build_model({**config, "tied": tied}, "cpu")
        graph = trace(model)
        assert tied_embeddings(graph) is tied
        if not isinstance(config, str):  # a family's model gets its family's checkpoint by itself
            assert bundled_for(graph).name == checkpoint
        generator = torch.Generator().manual_seed(0)
        batches = [source.batch(data_config(model), 8, generator, "eval") for _ in range(2)]
        own = score(model, batches, "text")[0]
        ghn = load_checkpoint(checkpoint)
        predict(model, ghn, graph=graph, keep_init=keep_init_as_is(graph, ghn.info))
        losses[tied] = score(model, batches, "text")[0]
        assert losses[tied] < min(own - 2, source.unigram_loss()), (tied, losses[tied], own)
    assert abs(losses[True] - losses[False]) < 0.4, losses


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_predict_cli_names_tying_in_its_out_of_space_warning(tied, tmp_path):
    """The bundled GPT-2 checkpoint trained on both, so neither warns; the same checkpoint with a
    training space of untied models only warns for the tied model alone."""
    file = tmp_path / "gpt.py"
    file.write_text(
        "from graphkit.families import build_model\n"
        "model = build_model({'family': 'gpt2', 'num_layers': 4, 'hidden': 128, 'heads': 4, "
        f"'tied': {tied}}})\n"
    )
    untied_only = tmp_path / "untied-only"
    shutil.copytree(bundled_checkpoint("gpt2"), untied_only)
    info = json.loads((untied_only / "config.json").read_text())
    info["space"]["tied"] = False
    (untied_only / "config.json").write_text(json.dumps(info))
    for ghn, warns in ((None, False), (untied_only, tied)):
        result = runner.invoke(app, ["predict", str(file), *(["--ghn", str(ghn)] if ghn else [])])
        assert result.exit_code == 0, result.output
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert warnings == (
            [
                "warning: gpt.py lies outside the space this hypernetwork was trained on: its input and output "
                "embeddings are tied, and it trained on untied models only; the scores above were measured "
                "on the held-out architectures of its training data, not on this model"
            ]
            if warns
            else []
        )


def qwen2_05b():
    """Qwen2-0.5B's architecture at full size (494M parameters, its head tied to its embedding), on meta."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    return meta(lambda: AutoModelForCausalLM.from_config(config))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("build", "inputs", "chosen"),
    [
        (
            lambda: timm_vit("swin_tiny_patch4_window7_224"),
            lambda: torch.randn(1, 3, 224, 224),
            "logah-tiny-zoo-vision",
        ),
        (qwen2_05b, lambda: torch.randint(151936, (1, 16)), "logah-tiny-zoo-decoders"),
    ],
    ids=["swin-t", "qwen2-0.5b"],
)
def test_full_size_zoo_models_are_predicted_on_meta_and_run(build, inputs, chosen):
    """The real zoo at full size, as timm and transformers build it: every parameter predicted
    into a meta-built model by the checkpoint chosen for it, and the model runs to finite logits."""
    model = build()
    graph = trace(model)
    assert bundled_for(graph).name == chosen
    params = predict(model, graph=graph)
    assert not any(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in params.values()) == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        output = model(inputs())
    logits = getattr(output, "logits", output)
    assert logits.shape[-1] in (1000, 151936) and torch.isfinite(logits).all()


def test_predict_leaves_a_spare_parameter_at_the_models_own_init(tmp_path):
    """transformers' DINOv2 holds a mask token its classifier never reads: `predict` was refused
    at the trace; it now predicts every other parameter and leaves the token as the library
    builds it (zeros), on a meta-built model as on one with weights, and says so."""
    spec = "hf:dinov2?image_size=16&patch_size=8&hidden_size=32&num_hidden_layers=1&num_attention_heads=2&num_labels=10"
    out = tmp_path / "dinov2.safetensors"
    result = runner.invoke(app, ["predict", spec, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "left at the model's own init, as they cannot change its output (spare): dinov2.embeddings.mask_token" in (
        " ".join(result.stdout.split())
    )
    tensors, _ = read_params(out)
    assert torch.equal(tensors["dinov2.embeddings.mask_token"], torch.zeros(1, 32))
    model = load_model_source(spec, weights=True).model
    with torch.no_grad():
        model.dinov2.embeddings.mask_token.fill_(0.5)
    own = model.classifier.weight.detach().clone()
    written = predict(model)
    assert "dinov2.embeddings.mask_token" not in written and "classifier.weight" in written
    assert torch.equal(model.dinov2.embeddings.mask_token, torch.full((1, 32), 0.5))
    assert not torch.equal(model.classifier.weight, own)

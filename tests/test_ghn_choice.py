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
from conftest import ROOT, gpt2, llama, meta, mistral, timm_vit
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.families import FAMILIES, build_model, get_family, register_family
from graphkit.ghn.checkpoint import (
    BUNDLED,
    UntrainedOpError,
    bundled_for,
    bundled_info,
    check_graph,
    checkpoint_task,
    load_checkpoint,
)
from graphkit.ghn.predict import predict, prediction_refusal, refusal_reason
from graphkit.ghn.space import input_task, outside_training_space, space_distance, tied_embeddings, training_space
from graphkit.sources import load_model_source
from graphkit.tracing import trace

PRETRAINED = ROOT / "graphkit" / "ghn" / "pretrained"
runner = CliRunner()

#: the refusal's tail: which checkpoints exist, by the input they were trained on
LISTED = "(bundled: text: logah-tiny-gpts, logah-tiny-llamas; image: logah-tiny-vits)"


def decoder(model_type: str, **config):
    """transformers' causal LM of ``model_type``: 2 layers, width 64, 4 heads sharing 2 key/value
    heads, 256 tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
    built = AutoConfig.for_model(model_type, **{"num_key_value_heads": 2, "head_dim": 16, **small, **config})
    return meta(lambda: AutoModelForCausalLM.from_config(built))


def small_timm(name: str):
    """A timm model of name's architecture at 32 px, 2 blocks (a Swin: 2 a stage, so that one shifts)."""
    if name.startswith("swin"):
        return timm_vit(name, img_size=32, patch_size=2, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4))
    return timm_vit(name, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)


def test_the_bundled_checkpoints_record_what_they_are_chosen_by():
    """task, trained ops and trained_on in each config.json, read off what each stored (its
    dataset and ops); none trained on tied models; the weights are those bundled before."""
    for name in dict.fromkeys(BUNDLED.values()):
        info = bundled_info(name)
        dataset = Path(info["dataset"]).name
        assert info["task"] == checkpoint_task({"trained_ops": info["trained_ops"]})
        assert info["trained_on"] == [dataset] and info["space"]["tied"] is False
        assert info["machine"] == "2 CPU cores"
    assert {n: bundled_info(n)["task"] for n in dict.fromkeys(BUNDLED.values())} == {
        "logah-tiny-gpts": "text",
        "logah-tiny-llamas": "text",
        "logah-tiny-vits": "image",
    }


def test_input_task_is_read_off_the_graph():
    assert input_task(trace(gpt2(layers=1))) == "text"
    assert input_task(trace(small_timm("vit_small_patch16_224"))) == "image"
    assert checkpoint_task({"trained_ops": ["input", "embedding", "linear"]}) == "text"
    assert checkpoint_task({"task": "image", "trained_ops": ["embedding"]}) == "image"  # recorded wins
    assert checkpoint_task({}) is None


@pytest.mark.parametrize(
    ("build", "chosen"),
    [
        (lambda: mistral(layers=2), "logah-tiny-llamas"),
        (lambda: decoder("qwen2"), "logah-tiny-llamas"),  # with q/k/v biases
        (lambda: llama(layers=2), "logah-tiny-llamas"),
        (lambda: gpt2(layers=2), "logah-tiny-gpts"),
        (lambda: small_timm("deit_small_patch16_224"), "logah-tiny-vits"),
    ],
    ids=["mistral", "qwen2", "llama", "gpt2", "deit"],
)
def test_a_model_gets_the_checkpoint_trained_on_its_input_and_its_ops(build, chosen):
    graph = trace(build())
    assert bundled_for(graph).name == chosen and prediction_refusal(graph) is None


@pytest.mark.parametrize(
    ("build", "task", "nearest", "missing"),
    [
        (lambda: small_timm("deit3_small_patch16_224"), "image", "logah-tiny-vits", "scale"),
        pytest.param(
            lambda: small_timm("swin_tiny_patch4_window7_224"),
            "image",
            "logah-tiny-vits",
            "mean_pool, roll",
            marks=pytest.mark.slow,
        ),
        (lambda: decoder("gemma"), "text", "logah-tiny-llamas", "gelu"),
    ],
    ids=["deit3", "swin", "gemma"],
)
def test_a_model_with_an_op_no_checkpoint_of_its_task_trained_on_is_refused_in_one_line(build, task, nearest, missing):
    graph = trace(build())
    with pytest.raises(UntrainedOpError) as error:
        bundled_for(graph)
    assert str(error.value) == (
        f"no bundled hypernetwork was trained on every op of this {task} model: the nearest, {nearest}, "
        f"never saw {missing} {LISTED}; train one with `graphkit train-ghn` on models with these ops and pass --ghn"
    )
    reason = f"missing op{'s' if ',' in missing else ''}: {missing}"
    assert refusal_reason(graph) == (reason, str(error.value), tuple(missing.split(", ")))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen2", "mistral"])
def test_a_decoder_of_another_family_is_predicted_whole_and_runs(model_type):
    """What the choice is for: the LLaMA checkpoint's prediction of a Qwen2 (its q/k/v biases
    through the shared map) or a Mistral, built on meta, fills every parameter and runs."""
    model = decoder(model_type)
    params = predict(model)
    assert sum(p.numel() for p in params.values()) == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits = model(torch.randint(256, (1, 8))).logits
    assert logits.shape == (1, 8, 256) and torch.isfinite(logits).all()


@pytest.fixture
def zoo_vision(tmp_path):
    """A checkpoint added later, as train-ghn writes one trained on a vision zoo: the bundled
    ViT's weights, a config that records layer scale among its trained ops, registered as a
    family's bundled checkpoint and removed afterwards."""
    folder = tmp_path / "logah-tiny-zoo-vision"
    folder.mkdir()
    shutil.copy(PRETRAINED / "logah-tiny-vits" / "model.safetensors", folder)
    info = json.loads((PRETRAINED / "logah-tiny-vits" / "config.json").read_text())
    info.update(family="zoo-vision", trained_on=["zoo-vits-mini"], trained_ops=[*info["trained_ops"], "scale"])
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
    """DeiT-III (timm's deit module: the vit family) has layer scale, which the family's own
    checkpoint never trained on: the new one that did predicts it. A plain DeiT fits both and
    gets its family's own; a hand-written ViT of no family gets the one whose training space
    (32 px) it lies nearer."""
    deit3 = trace(small_timm("deit3_small_patch16_224"))
    assert bundled_for(deit3) == zoo_vision and prediction_refusal(deit3) is None
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
    """The hand-written LLaMA of examples/ (family "custom") was refused for its family's name."""
    result = runner.invoke(app, ["predict", str(ROOT / "examples" / "llama_block.py")])
    assert result.exit_code == 0, result.output
    assert "bundled hypernetwork logah-tiny-llamas: trained on text models and on every op kind llama_block.py has" in (
        result.stdout
    )
    assert "trained on llamas-1k" in result.stdout and "(100.0%)" in result.stdout


@pytest.mark.slow
def test_tied_embeddings_are_read_off_the_graph_and_recorded_in_the_training_space():
    tied, untied = trace(gpt2(layers=1, tied=True)), trace(gpt2(layers=1))
    assert tied_embeddings(tied) and not tied_embeddings(untied)
    assert tied_embeddings(trace(decoder("qwen2", tie_word_embeddings=True))) and not tied_embeddings(
        trace(small_timm("deit_small_patch16_224"))
    )
    assert training_space([untied])["tied"] is False and training_space([untied, tied])["tied"] is True
    ghn = load_checkpoint(BUNDLED["gpt2"])
    check_graph(ghn, tied)  # accepted: its ops are all trained; only the warning tells
    phrase = "its input and output embeddings are tied, and it trained on untied models only"
    assert phrase in outside_training_space(ghn.info, tied)
    assert phrase not in (outside_training_space(ghn.info, untied) or "")
    seen = {**ghn.info, "space": {**ghn.info["space"], "tied": True}}  # a checkpoint that trained on tied models
    assert phrase not in (outside_training_space(seen, tied) or "")


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_predict_cli_names_tying_in_its_out_of_space_warning(tied, tmp_path):
    file = tmp_path / "gpt.py"
    file.write_text(
        "from graphkit.families import build_model\n"
        "model = build_model({'family': 'gpt2', 'num_layers': 4, 'hidden': 128, 'heads': 4, "
        f"'tied': {tied}}})\n"
    )
    result = runner.invoke(app, ["predict", str(file)])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    if tied:
        assert warnings == [
            "warning: gpt.py lies outside the space this hypernetwork was trained on: its input and output "
            "embeddings are tied, and it trained on untied models only; the scores above were measured inside "
            "that space, not on this model"
        ]
    else:
        assert warnings == []

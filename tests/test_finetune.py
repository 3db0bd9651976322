"""Up-training (graphkit.finetune, `graphkit finetune`): the loop, its run folder and resume, both
formats of what it writes, and the refusals before any work."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import MODEL_FILES, ROOT, gpt2
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.errors import ConfigError, DataError, TrainError
from graphkit.finetune import (
    LR_SCALE_KEY,
    FinetuneConfig,
    finetune,
    lr_factor_phrase,
    lr_scale_of,
    lr_scale_phrase,
    starting_weights,
)
from graphkit.modelfile import load_model_file
from graphkit.params import read_params, save_params, weights_digest
from graphkit.sources import load_model_source
from graphkit.training.data import data_config, load_source, model_inputs, output_loss
from graphkit.training.loop import (
    estimate_batch_norm,
    forward,
    forward_inputs,
    param_groups,
    up_train,
    warmup_factor,
)

runner = CliRunner()


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=48, vocab_size=256,
        max_position_embeddings=32,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_up_training_lowers_the_loss_on_the_batches_it_trains_on():
    model = tiny_llama()
    batch = (torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0)),) * 2
    batch = (batch[0][:, :-1], batch[0][:, 1:])
    losses, scores = up_train(model, "text", lambda step: batch, 20, 3e-3, held_out=[batch], at=(0, 20))
    assert len(losses) == 20 and losses[-1] < losses[0]
    assert scores[20][0] < scores[0][0]


def test_a_warm_up_raises_the_rate_linearly_from_the_first_step():
    """AdamW's first step moves each weight by about lr, whatever its gradient: under a warm-up of
    4 steps it moves it by about lr / 4, and by step 4 the rate is whole."""
    assert [warmup_factor(step, 4) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0
    batch = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = (batch[:, :-1], batch[:, 1:])
    moved = {}
    for warmup in (0, 4):
        model = tiny_llama()
        before = model.get_parameter("model.layers.0.mlp.up_proj.weight").detach().clone()
        up_train(model, "text", lambda step: batch, 1, 1e-3, weight_decay=0.0, warmup=warmup)
        moved[warmup] = (model.get_parameter("model.layers.0.mlp.up_proj.weight") - before).abs().max().item()
    assert moved[0] == pytest.approx(1e-3, rel=0.01) and moved[4] == pytest.approx(1e-3 / 4, rel=0.01)
    with pytest.raises(TrainError, match="warmup -1: must be 0"):
        up_train(tiny_llama(), "text", lambda step: batch, 1, 1e-3, warmup=-1)


@pytest.mark.slow
def test_a_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path):
    """Step i draws its batch and dropout from a seed of its own, the checkpoint holds the
    optimizer's state and the warm-up's rate is the step's: 2 steps, then a resume to 4, give the
    weights of 4 steps in one go, a warm-up of 3 steps across the resume."""
    config = dict(steps=4, batch_size=2, seq_len=16, checkpoint_every=2, log_every=1, device="cpu", warmup=3)
    whole = tiny_llama()
    finetune(whole, tmp_path / "whole", FinetuneConfig(**config), progress=False)
    parts = tiny_llama()
    finetune(parts, tmp_path / "parts", FinetuneConfig(**{**config, "steps": 2}), progress=False)
    resumed = tiny_llama()  # the command builds the model anew from its source, then loads the checkpoint
    finetune(resumed, tmp_path / "parts", FinetuneConfig(**config), resume=True, progress=False)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    steps = [json.loads(line)["step"] for line in (tmp_path / "parts" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 2, 3, 4, 4]  # the first part's end (with its held-out line), then steps 3 and 4


def test_a_resume_with_other_options_is_refused(tmp_path):
    config = dict(steps=1, batch_size=2, seq_len=8, device="cpu")
    finetune(tiny_llama(), tmp_path, FinetuneConfig(**config), progress=False)
    with pytest.raises(TrainError, match=r"was trained with --lr 0.0003, not 0.001"):
        finetune(tiny_llama(), tmp_path, FinetuneConfig(**{**config, "steps": 2, "lr": 1e-3}), resume=True)
    with pytest.raises(TrainError, match=r"was trained with --warmup 0, not 5"):
        finetune(tiny_llama(), tmp_path, FinetuneConfig(**{**config, "steps": 2, "warmup": 5}), resume=True)
    with pytest.raises(TrainError, match=r"^warmup must be an integer >= 0; got -1"):
        FinetuneConfig(**{**config, "warmup": -1})


def test_a_resume_from_another_model_of_the_same_shapes_is_refused(tmp_path):
    config = dict(steps=1, batch_size=2, seq_len=8, device="cpu")
    finetune(tiny_llama(seed=0), tmp_path, FinetuneConfig(**config), progress=False)
    recorded = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())["source"]
    assert recorded == weights_digest(tiny_llama(seed=0)) != weights_digest(tiny_llama(seed=1))
    before = (tmp_path / "checkpoint" / "model.safetensors").read_bytes()
    with pytest.raises(TrainError, match=r"was up-trained from another model \(its starting weights differ"):
        finetune(tiny_llama(seed=1), tmp_path, FinetuneConfig(**{**config, "steps": 2}), resume=True)
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == before
    finetune(tiny_llama(seed=0), tmp_path, FinetuneConfig(**{**config, "steps": 2}), resume=True, progress=False)


@pytest.mark.parametrize(("option", "value"), [("steps", 0), ("lr", 0.0), ("seed", -1), ("weight_decay", float("nan"))])
def test_a_bad_option_is_refused_where_it_enters(option, value):
    with pytest.raises(TrainError, match=option.replace("_", "-")):
        FinetuneConfig(**{option: value})


def model_file(tmp_path) -> str:
    """A MODEL.py building a tiny LLaMA (the command loads it as a user's file)."""
    path = tmp_path / "model.py"
    path.write_text(
        "import torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\ntorch.manual_seed(0)\n"
        "model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, "
        "intermediate_size=48, vocab_size=256, max_position_embeddings=32))\n"
    )
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("format", ["hf", "graphkit"])
def test_finetune_writes_the_trained_model_in_either_format(format, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    args = ["finetune", model_file(tmp_path), "--steps", "3", "-b", "2", "--seq-len", "16", "--out", str(out)]
    warmup = ["--warmup", "2"] if format == "graphkit" else []
    result = runner.invoke(app, [*args, "--format", format, "--device", "cpu", *warmup])
    assert result.exit_code == 0, result.output
    assert "step 3: loss" in result.stdout and "held-out loss" in result.stdout
    checkpoint, _ = read_params(out / "checkpoint" / "model.safetensors")
    if format == "hf":
        loaded = AutoModelForCausalLM.from_pretrained(out)
        assert json.loads((out / "config.json").read_text())["graphkit"]["finetune"]["steps"] == 3
        trained = loaded.state_dict()
    else:
        trained, metadata = read_params(out / "model.safetensors")
        assert json.loads(metadata["graphkit_finetune"])["steps"] == 3
        assert json.loads(metadata["graphkit_finetune"])["warmup"] == 2
    assert all(torch.equal(trained[name], value) for name, value in checkpoint.items())
    again = runner.invoke(app, [*args, "--format", format])  # a second fresh run into the same folder
    assert again.exit_code == 1 and "already holds" in again.stderr and "--resume" in again.stderr


@pytest.mark.slow
def test_finetune_refuses_hf_for_a_model_no_stock_class_loads_before_training(tmp_path):
    out = tmp_path / "run"
    args = ["finetune", str(ROOT / "examples" / "vit_tiny_cifar.py"), "--format", "hf", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "VisionTransformer: not a transformers model; --format graphkit writes it" in result.stderr
    assert not (out / "checkpoint").exists()


@pytest.mark.slow
def test_finetune_trains_an_image_model_on_digits(tmp_path):
    out = tmp_path / "run"
    args = ["finetune", str(ROOT / "examples" / "vit_tiny_cifar.py"), "--steps", "2", "-b", "4", "--out", str(out)]
    result = runner.invoke(app, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    tensors, _ = read_params(out / "model.safetensors")
    assert "blocks.0.attn.qkv.weight" in tensors


VIT_FIELDS = "image_size=16&patch_size=8&hidden_size=32&num_hidden_layers=1&num_attention_heads=2&intermediate_size=64"


@pytest.mark.parametrize(
    "spec",
    [
        f"hf:vit?{VIT_FIELDS}&num_labels=10",
        f"hf:deit?{VIT_FIELDS}&num_labels=10",
        "hf:resnet?num_labels=10&embedding_size=8&hidden_sizes=[8,8,16,16]&depths=[1,1,1,1]",
        "timm:test_convnext?num_classes=10",
        'hf:siglip2?num_labels=10&vision_config={"hidden_size":32,"intermediate_size":64,"num_attention_heads":2,'
        '"num_hidden_layers":1,"num_patches":16,"patch_size":4}',
        'hf:clip?num_labels=10&vision_config={"num_hidden_layers":1,"hidden_size":32,"intermediate_size":64,'
        '"num_attention_heads":2,"image_size":32,"patch_size":8}',
        "hf:pp_lcnet?num_labels=10&scale=0.25&class_expand=64",
        "timm:test_efficientnet?num_classes=10&in_chans=1",
    ],
    ids=["hf-vit", "hf-deit", "hf-resnet", "timm-convnext", "hf-siglip2", "hf-clip", "hf-pp-lcnet", "timm-grey"],
)
def test_finetune_trains_a_timm_or_transformers_image_classifier_on_digits(spec, tmp_path):
    """Image classifiers take digits shaped by the images they read (a transformers config's image
    size, else 224 px for a ResNet's, which has none; timm's input size) and the classes they score
    (``num_labels``, timm's ``num_classes``), as language models take text, and SigLIP 2 its
    images cut into patches; before, their graph was read as one of graphkit's families' and
    every timm model but a ViT was refused. CLIP's classifier takes images although its config's
    text part has a vocabulary: its forward reads no token ids. PP-LCNet's classifier returns its
    logits as ``last_hidden_state``; a timm model built for grey images takes one channel."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["finetune", spec, "--steps", "2", "-b", "2", "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(torch.isfinite(torch.tensor(line["loss"])) for line in lines if "loss" in line)


CNN = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
)


def example_inputs():
    return torch.zeros(2, 1, 8, 8)
"""


def test_a_hand_written_image_classifier_fine_tunes_its_classes_read_off_its_logits(tmp_path):
    """A MODEL.py's own CNN, of no family and no ``num_classes``: its example images give the
    image size and channels, the logits it returns for them the classes. Reading them runs it in
    eval mode, so its BatchNorm statistics stay as they were, and leaves its mode as it was."""
    path = tmp_path / "cnn.py"
    path.write_text(CNN)
    namespace: dict = {}
    exec(compile(CNN, str(path), "exec"), namespace)
    model, images = namespace["model"], namespace["example_inputs"]() + 1
    assert data_config(model, images) == {"family": "Sequential", "image_size": 8, "in_chans": 1, "num_classes": 10}
    assert model.training and torch.equal(model[1].running_mean, torch.zeros(8))
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["finetune", str(path), "--steps", "2", "-b", "2", "--out", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("returns", ["self.head(x)", "self.head(x), None"], ids=["logits", "logits-and-loss"])
def test_a_hand_written_language_model_of_no_family_fine_tunes_on_text(tmp_path, returns):
    """A GPT built from torch's own encoder layers is of none of graphkit's families, and its
    config could not be read off its graph ("a graph of family 'custom'"): its logits say its
    vocabulary, its position table the longest windows (32, below --seq-len's 64). Its logits
    are read as training reads them, also out of nanoGPT's ``(logits, loss)`` (refused before)."""
    path = tmp_path / "gpt.py"
    path.write_text((MODEL_FILES / "torch_gpt.py").read_text().replace("return self.head(x)", f"return {returns}"))
    assert data_config(load_model_file(path).model) == {"family": "GPT", "vocab_size": 256, "context": 32}
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["finetune", str(path), "--steps", "2", "-b", "2", "--out", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["eval_loss"] > 0


def test_nanogpt_is_trained_and_scored_with_its_targets(tmp_path):
    """nanoGPT's forward returns only the last position's logits unless it is given the targets,
    as its own training loop gives them: the loop passes them (a model whose forward takes no
    ``targets`` gets none), and `graphkit finetune` trains it (it was refused: "text logits
    (2, 1, 256) do not fit targets (2, 64)")."""
    path = tmp_path / "nano_gpt.py"
    path.write_text((MODEL_FILES / "nano_gpt.py").read_text().replace("= 2, 8, 512, 256, 64", "= 1, 2, 32, 256, 64"))
    nano, torch_gpt = load_model_file(path).model, load_model_file(MODEL_FILES / "torch_gpt.py").model
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    assert nano(x)[0].shape == (2, 1, 256)  # its inference form
    assert forward_inputs(nano, x, y)[1].keys() == {"targets"} and forward_inputs(torch_gpt, x, y) == ((x,), {})
    loss, _ = output_loss("text", forward(nano, x, y), y)
    torch.testing.assert_close(loss, nano(x, y.contiguous())[1])  # the loss nanoGPT computes for itself
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["finetune", str(path), "--steps", "2", "-b", "2", "--out", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["eval_loss"] > 0


@pytest.mark.parametrize(
    "spec",
    [
        "hf:mamba?num_hidden_layers=1&hidden_size=32&vocab_size=300",
        'hf:gemma3?text_config={"num_hidden_layers":1,"hidden_size":32,"intermediate_size":64,"num_attention_heads":2,'
        '"num_key_value_heads":1,"head_dim":16,"vocab_size":300}&vision_config={"num_hidden_layers":1,'
        '"hidden_size":32,"intermediate_size":64,"num_attention_heads":2}',
    ],
    ids=["mamba-no-context", "gemma3-text-config"],
)
def test_finetune_trains_a_language_model_with_no_position_limit_or_a_multimodal_config(spec, tmp_path):
    """A causal LM whose config bounds no sequence length (Mamba, BLOOM's ALiBi) takes windows
    of --seq-len, and one whose vocabulary is its multimodal config's text part's (Gemma 3,
    Llama 4, Qwen 3.5) takes text; both were refused, their graph read as a graphkit family's."""
    out = tmp_path / "run"
    args = ["finetune", spec, "--steps", "2", "-b", "2", "--seq-len", "16", "--out", str(out), "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert data_config(load_model_source(spec, weights=False).model)["vocab_size"] == 300


def test_images_are_cut_into_patches_as_siglip2s_image_processor_cuts_them():
    """SigLIP 2 reads flattened patches; fine-tuning cuts the sources' images as transformers'
    image processor does (row-major grid, each patch's pixels row by row, channels last), so that
    a model fine-tuned here reads images as it will be given them."""
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    images = torch.randn(3, 3, 8, 12)
    inputs = model_inputs(images, {"patch_inputs": 4})
    expected = torch.stack([convert_image_to_patches(image, 4) for image in images])
    assert torch.equal(inputs["pixel_values"], expected)
    assert inputs["pixel_attention_mask"].shape == (3, 6) and bool(inputs["pixel_attention_mask"].all())
    assert inputs["spatial_shapes"].tolist() == [[2, 3]] * 3
    assert model_inputs(images, {"image_size": 8}) is images  # any other model takes the images


def test_a_fresh_run_that_fails_before_its_first_checkpoint_leaves_nothing_to_block_a_rerun(tmp_path):
    """The error says to rerun with a lower --lr; the same --out must take that rerun, which a
    metrics log left without a checkpoint would refuse (and --resume, with nothing to resume).
    A run that fails after a checkpoint keeps it, to resume from."""
    out = tmp_path / "run"
    args = ["finetune", f"hf:vit?{VIT_FIELDS}&num_labels=10", "-b", "2", "--log-every", "1", "--device", "cpu"]
    result = runner.invoke(app, [*args, "--out", str(out), "--steps", "5", "--lr", "1e9"])
    assert result.exit_code == 1 and "up-train with a lower --lr" in result.output, result.output
    assert not out.exists()
    result = runner.invoke(app, [*args, "--out", str(out), "--steps", "2"])
    assert result.exit_code == 0, result.output
    kept = tmp_path / "kept"
    result = runner.invoke(app, [*args, "--out", str(kept), "--steps", "5", "--lr", "1e9", "--checkpoint-every", "1"])
    assert result.exit_code == 1 and (kept / "checkpoint").is_dir() and (kept / "metrics.jsonl").is_file()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "hf:imagegpt?n_layer=1&n_embd=32&n_head=2&n_positions=64",
            "imagegpt model: its output does not fit stdlib-text",
        ),
        ("timm:test_vit?num_classes=0", "VisionTransformer was built with num_classes=0 and returns features"),
        ("timm:test_resnet?features_only=True", "FeatureListNet reads images but returns no class logits"),
        (
            "timm:test_resnet?global_pool=&num_classes=10",
            "ResNet.forward raised RuntimeError in module 'fc' (Linear): mat1 and mat2 shapes cannot be multiplied",
        ),
    ],
    ids=["imagegpt", "timm-features", "timm-feature-maps", "timm-broken-head"],
)
def test_a_model_whose_output_the_data_cannot_score_is_refused_before_training(spec, message, tmp_path):
    """ImageGPT's image classifier reads colour tokens, as a language model does, and scores
    classes: text data cannot train it. A timm model without a classifier returns its features,
    which were read as logits of 64 classes and trained; one built ``features_only`` returns
    feature maps; one whose head cannot take its unpooled features fails in its own forward, which
    was an "unexpected RuntimeError". One line, before any step, and no run folder."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["finetune", spec, "--steps", "2", "-b", "2", "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_an_image_classifier_with_too_few_classes_or_non_square_images_is_refused_in_one_line():
    """The refusal says how to build a model that fits the data, and non-square images, which
    the sources cannot give, are named before any batch is drawn."""
    import timm

    source = load_source("digits")
    few = timm.create_model("test_convnext", pretrained=False, num_classes=5)
    with pytest.raises(DataError, match="digits has 10 classes but the ConvNeXt config has num_classes 5; build"):
        source.check(data_config(few))
    wide = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(10))
    wide.pretrained_cfg, wide.num_classes = {}, 10  # a timm-like classifier reading 3 x 32 x 48 images
    with pytest.raises(ConfigError, match="Sequential reads 32 x 48 images; the data sources give square ones"):
        data_config(wide, torch.zeros(2, 3, 32, 48))


@pytest.mark.slow
def test_finetune_starts_from_a_params_file_and_resumes_only_with_it(tmp_path):
    """`predict --out P` then `finetune MODEL --params P`: the run starts from P's weights (the
    digest it records), and a resume without P is another starting point, refused."""
    params = tmp_path / "start.safetensors"
    save_params(tiny_llama(seed=1), params)
    out = tmp_path / "run"
    args = ["finetune", model_file(tmp_path), "--steps", "1", "-b", "2", "--seq-len", "8", "--out", str(out)]
    result = runner.invoke(app, [*args, "--params", str(params), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert state["source"] == weights_digest(tiny_llama(seed=1)) != weights_digest(tiny_llama(seed=0))
    _, metadata = read_params(out / "model.safetensors", tensors=False)
    assert json.loads(metadata["graphkit_finetune"])["params"] == "start.safetensors"
    resumed = runner.invoke(app, [*args[:3], "2", *args[4:], "--resume"])
    assert resumed.exit_code == 1 and "was up-trained from another model" in resumed.stderr


def test_finetune_refuses_params_converted_for_another_model_in_one_line(tmp_path):
    params = tmp_path / "gqa.safetensors"
    result = runner.invoke(
        app, ["convert", str(ROOT / "examples" / "vit_tiny_cifar.py"), "-a", "gqa", "-k", "2", "--out", str(params)]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "run"
    args = ["finetune", str(ROOT / "examples" / "vit_tiny_cifar.py"), "--params", str(params), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: --params {params}: holds a model converted to gqa (its metadata), and "
        f"{ROOT / 'examples' / 'vit_tiny_cifar.py'} is not; finetune the converted model "
        "(`graphkit convert ... -a gqa --format hf`) instead"
    )
    assert not (out / "checkpoint").exists()


def test_parameters_named_in_the_lr_scale_train_at_their_factor_and_the_rest_at_the_lr():
    model = tiny_llama()
    scale = {"model.embed_tokens.weight": 0.25, "lm_head.weight": 0.25, "model.norm.weight": 0.5}
    groups = param_groups(model, 1e-3, scale)
    assert [group["lr"] for group in groups] == [1e-3, 2.5e-4, 5e-4]
    named = dict(model.named_parameters())
    assert groups[1]["params"] == [named["model.embed_tokens.weight"], named["lm_head.weight"]]
    assert sum(len(group["params"]) for group in groups) == len(named)
    assert param_groups(model, 1e-3) == [{"params": list(named.values()), "lr": 1e-3}]
    with pytest.raises(TrainError, match=r"^lr scale for head\.weight: the model has no such parameter$"):
        param_groups(model, 1e-3, {"head.weight": 0.5})
    with pytest.raises(TrainError, match=r"lr scale of lm_head\.weight must be a positive number; got 0"):
        FinetuneConfig(lr_scale={"lm_head.weight": 0})


@pytest.mark.parametrize(
    ("recorded", "why"),
    [
        ("[0.5]", "not a JSON object"),
        ('{"lm_head.weight": -1}', "not a JSON object"),
        ('{"lm_head.weight": NaN}', "not a JSON object"),
        ("{", "not a JSON object"),
        ('{"head.weight": 0.5}', "records an lr factor for head.weight, which"),
    ],
)
def test_finetune_refuses_a_params_files_lr_factors_it_cannot_apply_in_one_line(tmp_path, recorded, why):
    params = tmp_path / "start.safetensors"
    save_params(tiny_llama(), params, metadata={LR_SCALE_KEY: recorded})
    out = tmp_path / "run"
    args = ["finetune", model_file(tmp_path), "--steps", "1", "-b", "2", "--seq-len", "8", "--out", str(out)]
    result = runner.invoke(app, [*args, "--params", str(params), "--device", "cpu"])
    assert result.exit_code == 1 and why in result.stderr and f"--params {params}: " in result.stderr
    assert "--no-lr-scale" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (out / "checkpoint").exists()
    if why.startswith("not"):
        with pytest.raises(TrainError):
            lr_scale_of(params)


VIT_64PX = (
    "import timm\nmodel = timm.create_model('vit_small_patch16_224', pretrained=False, num_classes=10, img_size=64, "
    "patch_size=16, embed_dim=192, num_heads=3, depth=3)\n"
)


@pytest.mark.slow
def test_a_resized_kernel_fine_tuned_at_the_factor_predict_records_keeps_the_predictions_head_start(tmp_path):
    """A ViT at 64 px with patch 16 is predicted at patch 2 and its kernel resized (each weight
    1/64 of a trained one): `predict --out` records lr x 1/64 for it, `finetune --params` trains
    it so, and after 40 steps the prediction is far ahead of its own init, where at one lr it is
    not (measured: 0.97 against own init's 2.19; one lr 2.32)."""
    model = tmp_path / "vit.py"
    model.write_text(VIT_64PX)
    params = tmp_path / "predicted.safetensors"
    predicted = runner.invoke(app, ["predict", str(model), "--out", str(params)])
    assert predicted.exit_code == 0, predicted.output
    assert "fine-tune patch_embed.proj.weight at lr x 1/64" in predicted.stdout
    assert json.loads(read_params(params, tensors=False)[1][LR_SCALE_KEY]) == {"patch_embed.proj.weight": 1 / 64}
    losses = {}
    for arm, extra in {"scaled": ["--params", str(params)], "one lr": ["--params", str(params), "--no-lr-scale"],
                       "own init": []}.items():  # fmt: skip
        out = tmp_path / arm.replace(" ", "-")
        args = ["finetune", str(model), "--steps", "40", "-b", "16", "--out", str(out), "--device", "cpu", *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert ("training patch_embed.proj.weight at lr x 1/64" in result.stdout) == (arm == "scaled")
        record = json.loads(read_params(out / "model.safetensors", tensors=False)[1]["graphkit_finetune"])
        assert record.get("lr_scale") == ({"patch_embed.proj.weight": 1 / 64} if arm == "scaled" else None)
        losses[arm] = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["eval_loss"]
    assert losses["scaled"] < 0.7 * min(losses["one lr"], losses["own init"]), losses


def test_a_python_user_gets_the_commands_refusals(tmp_path):
    """What `graphkit finetune` refuses, the library refuses in the same line: a bad data spec when
    the config is made, a model without weights (and no --params) before any training, an lr
    factor for a parameter the model lacks before the file's weights are loaded."""
    with pytest.raises(DataError, match="^unknown data source 'nosuch'"):
        FinetuneConfig(data="nosuch")
    with pytest.raises(TrainError, match=r"^gpt2\.py: the model is on the meta device; finetune needs its weights$"):
        starting_weights(gpt2(), "gpt2.py")
    params = tmp_path / "start.safetensors"
    save_params(tiny_llama(), params, metadata={LR_SCALE_KEY: '{"head.weight": 0.5}'})
    model = tiny_llama(seed=1)  # weights other than the file's: a load would show
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TrainError, match=r"records an lr factor for head\.weight, which llama\.py does not have"):
        starting_weights(model, "llama.py", params, lr_scale_of(params))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert lr_factor_phrase(1 / 64) == "lr x 1/64" and lr_factor_phrase(0.25) == "lr x 1/4"


def test_the_lr_factors_of_a_grown_model_are_said_in_one_line_grouped_by_factor():
    scales = {f"blocks.{i}.{w}.weight": 1 / 3 for i in range(12) for w in ("qkv", "proj")}
    scales = {**scales, "patch_embed.proj.weight": 1 / 64, "head.weight": 1 / 3}
    assert lr_scale_phrase(scales) == (
        "patch_embed.proj.weight at lr x 1/64, 25 weights (blocks.0.qkv.weight, blocks.0.proj.weight, ...) at lr x 1/3"
    )
    assert lr_scale_phrase({"a.weight": 0.25, "b.weight": 0.25}) == "2 weights (a.weight, b.weight) at lr x 1/4"
    # a grown Qwen2's widths: 128 -> 384 and, in its MLP, 341 -> 1,024; one phrase, one group
    mixed = {"mlp.down_proj.weight": 341 / 1024, "attn.q_proj.weight": 1 / 3, "attn.k_proj.weight": 1 / 3}
    assert lr_scale_phrase(mixed) == ("3 weights (mlp.down_proj.weight, attn.q_proj.weight, ...) at lr x 1/3")


def test_batch_norm_statistics_are_estimated_from_the_inputs():
    # a predicted model scored with its constructor's statistics (mean 0, variance 1) is not the
    # model its hypernetwork trained, on batch statistics (docs/experiments.md, "BatchNorm statistics")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5)).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "batches" not in k}
    inputs = [torch.randn(8, 3, 5, 5) * 3 + 2 for _ in range(3)]
    assert estimate_batch_norm(model, inputs)
    with torch.no_grad():
        features = model[0](torch.cat(inputs))
    bn = model[1]
    assert torch.allclose(bn.running_mean, features.mean((0, 2, 3)), atol=1e-4)
    assert not torch.allclose(bn.running_var, torch.ones(4), atol=0.5)
    assert not model.training and all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert bn.momentum == 0.1  # restored
    plain = torch.nn.Linear(3, 2)
    assert not estimate_batch_norm(plain, [torch.randn(2, 3)])

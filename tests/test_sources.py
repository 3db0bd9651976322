"""Model sources: every command that takes a MODEL.py also takes a Hugging Face model folder,
``timm:NAME?k=v`` and ``hf:MODEL_TYPE?k=v``, offline, with one-line errors for bad input."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_cli_outputs import one_line_error, run

from graphkit import sources
from graphkit.compiler import read_params
from graphkit.errors import ModelSourceError
from graphkit.modelfile import ModelFile
from graphkit.sources import load_model_source, parse_spec, parse_value
from graphkit.tracing import trace

TINY_LLAMA = (
    "hf:llama?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&intermediate_size=128&vocab_size=256"
)
TINY_VIT = "timm:vit_tiny_patch16_224?img_size=32&depth=2&num_classes=10"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Hugging Face model folders of one tiny random LLaMA: whole, sharded, config only, weights
    only as a pickle, and a config that needs remote code (whose code would leave a mark if run)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=128,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(root / "llama")
        model.save_pretrained(root / "sharded", max_shard_size="20KB")
    finally:
        hf_logging.enable_progress_bar()
    for name in ("config-only", "bin-only", "remote", "no-config"):
        (root / name).mkdir()
    for name in ("config-only", "bin-only"):
        (root / name / "config.json").write_bytes((root / "llama" / "config.json").read_bytes())
    torch.save(model.state_dict(), root / "bin-only" / "pytorch_model.bin")
    (root / "remote" / "config.json").write_text(
        json.dumps(
            {
                "model_type": "my_llama",
                "architectures": ["MyLlamaForCausalLM"],
                "auto_map": {
                    "AutoConfig": "modeling_my.MyConfig",
                    "AutoModelForCausalLM": "modeling_my.MyLlamaForCausalLM",
                },
            }
        )
    )
    (root / "remote" / "modeling_my.py").write_text(f"open({str(root / 'ran')!r}, 'w').write('remote code ran')\n")
    (root / "no-config" / "model.safetensors").write_bytes(b"")
    return {name: root / name for name in ("llama", "sharded", "config-only", "bin-only", "remote", "no-config")} | {
        "root": root
    }


# -- the values of key=value -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("32", 32),
        ("1e-5", 1e-5),
        ("-0.5", -0.5),
        ("True", True),
        ("true", True),
        ("false", False),
        ("null", None),
        ("None", None),
        ("[2,2]", [2, 2]),
        ("(7, 7)", (7, 7)),
        ("{'rope_type': 'default'}", {"rope_type": "default"}),
        ("'gelu'", "gelu"),
        ("gelu", "gelu"),
        ("gelu_pytorch_tanh", "gelu_pytorch_tanh"),
        ("", ""),
    ],
)
def test_values_are_literals_else_text(text, value):
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


@pytest.mark.parametrize("text", ["[2,2", "(1,", "'open", "{'a': 1"])
def test_a_literal_that_does_not_close_is_refused(text):
    with pytest.raises(ValueError, match="opens a literal that does not parse"):
        parse_value(text)


def test_spec_names_and_keys():
    assert parse_spec("timm:x?a=1&b=[2,2]&c=gelu", "x?a=1&b=[2,2]&c=gelu") == ("x", {"a": 1, "b": [2, 2], "c": "gelu"})
    assert parse_spec("hf:llama", "llama") == ("llama", {})
    with pytest.raises(ModelSourceError, match=r"hf:llama\?a: 'a' is not key=value"):
        parse_spec("hf:llama?a", "llama?a")
    with pytest.raises(ModelSourceError, match="a is given twice"):
        parse_spec("hf:llama?a=1&a=2", "llama?a=1&a=2")
    with pytest.raises(ModelSourceError, match="the value of b does not parse"):
        parse_spec("hf:llama?b=[1", "llama?b=[1")


def test_an_image_classifier_spec_takes_its_class_count():
    """``num_labels`` is every transformers config's class count, held in its defaults only as
    ``id2label``: hf: takes it (an image classifier has 2 classes unless told)."""
    tiny = "hf:vit?image_size=16&patch_size=8&hidden_size=32&num_hidden_layers=1&num_attention_heads=2"
    assert load_model_source(tiny, weights=False).model.classifier.out_features == 2
    assert load_model_source(tiny + "&num_labels=10", weights=False).model.classifier.out_features == 10


@pytest.mark.parametrize("size, expected", [("32", (3, 32, 32)), ("(32,64)", (3, 32, 64))])
def test_a_timm_spec_with_an_image_size_is_traced_at_that_size(size, expected):
    """timm keeps its published ``input_size`` (224 px) in ``pretrained_cfg`` whatever ``img_size``
    the model is built for, and the tracer read the images from there: an EfficientFormerV2 built at
    32 px, whose attention-bias tables hold a 32-px grid, failed on a 224-px image."""
    loaded = load_model_source(f"timm:efficientformerv2_s0?img_size={size}&num_classes=10", weights=False)
    assert tuple(loaded.model.pretrained_cfg["input_size"]) == expected
    graph = trace(loaded.model)
    assert [tuple(shape[1:]) for shape in graph.meta["input_shapes"]] == [expected]


# -- Hugging Face folders ----------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model source reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("folder", ["llama", "sharded"])
def test_a_folder_loads_its_safetensors_offline(folders, folder, offline):
    model = load_model_source(folders[folder]).model
    saved = load_file(folders["llama"] / "model.safetensors")
    assert type(model).__name__ == "LlamaForCausalLM"
    state = model.state_dict()
    assert saved.keys() <= state.keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in saved.items())
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def test_a_folder_for_tracing_is_built_on_meta_without_reading_weights(folders, offline):
    loaded = load_model_source(folders["bin-only"], weights=False)  # the pickle is never opened
    assert loaded.path == folders["bin-only"] and loaded.name == "bin-only"
    assert all(p.is_meta for p in loaded.model.parameters())
    assert loaded.model.config.num_hidden_layers == 2


def test_a_folder_without_weights_gets_the_librarys_initialisation(folders):
    model = load_model_source(folders["config-only"]).model
    saved = load_file(folders["llama"] / "model.safetensors")
    weight = model.get_parameter("model.layers.0.mlp.up_proj.weight")
    assert weight.device.type == "cpu" and weight.shape == saved["model.layers.0.mlp.up_proj.weight"].shape
    assert not torch.equal(weight, saved["model.layers.0.mlp.up_proj.weight"])
    assert 0 < weight.std() < 0.1  # LLaMA's init: normal, std 0.02


def test_a_folder_whose_weights_do_not_match_its_config_is_refused(folders, tmp_path):
    folder = tmp_path / "deeper"
    folder.mkdir()
    config = json.loads((folders["llama"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    (folder / "model.safetensors").symlink_to(folders["llama"] / "model.safetensors")
    with pytest.raises(ModelSourceError, match=r"the weights do not match config.json: they lack model\.layers\.2\."):
        load_model_source(folder)
    saved = load_file(folders["llama"] / "model.safetensors")["model.layers.0.mlp.down_proj.weight"]
    narrower = saved.shape[1] // 2
    (folder / "config.json").write_text(json.dumps(config | {"intermediate_size": narrower}))
    with pytest.raises(ModelSourceError) as refused:  # transformers says "look at the above report", and shows none
        load_model_source(folder)
    assert str(refused.value) == (
        f"{folder}: the weights do not match config.json: model.layers.0.mlp.down_proj.weight is {list(saved.shape)} "
        f"in the weights but {[saved.shape[0], narrower]} in the model config.json describes (and 5 more)"
    )


def test_too_large_to_hold_is_refused_before_allocating():
    huge = "hf:llama?num_hidden_layers=2&hidden_size=65536&intermediate_size=262144&num_attention_heads=64"
    with pytest.raises(ModelSourceError, match=r"its weights need [\d.]+ GiB and [\d.]+ GiB are free"):
        load_model_source(huge, weights=True)


# -- through the commands ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, headline",
    [
        ("{llama}", "LlamaForCausalLM (llama): 26,784 parameters"),
        (TINY_VIT, "VisionTransformer (vit): 1,040,842 parameters"),
        (TINY_LLAMA, "LlamaForCausalLM (llama): 106,816 parameters"),
        # a vision model type has no causal LM: its image classifier
        ("hf:vit?image_size=16&patch_size=8&hidden_size=32&num_hidden_layers=1&num_attention_heads=2", "ViTFor"),
        # GPT-1's causal mask is a buffer made in __init__: on meta it holds no values, so it is built with them
        ("hf:openai-gpt?n_layer=1&n_embd=32&n_head=2&vocab_size=64&n_positions=16", "OpenAIGPTLMHeadModel"),
    ],
)
def test_trace_takes_every_form(folders, source, headline, offline):
    result = run("trace", source.format(**folders))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(headline)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["{llama}", TINY_VIT, TINY_LLAMA])
def test_predict_takes_every_form(folders, source, tmp_path):
    out = tmp_path / "p.safetensors"
    result = run("predict", source.format(**folders), "--out", out)
    assert result.exit_code == 0, result.output
    assert "predicted" in result.stdout and "(100.0%)" in result.stdout
    params, _ = read_params(out)
    assert params and all(torch.isfinite(t).all() for t in params.values())


@pytest.mark.slow
def test_convert_converts_the_folders_weights(folders, tmp_path):
    """-k 2 on a model with 2 K/V heads changes nothing: the converted file holds the folder's weights."""
    out = tmp_path / "c.safetensors"
    result = run("convert", folders["sharded"], "-a", "gqa", "-k", "2", "--out", out)
    assert result.exit_code == 0, result.output
    converted, _ = read_params(out)
    saved = load_file(folders["llama"] / "model.safetensors")
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        assert torch.equal(converted[name], saved[name])


@pytest.mark.slow
def test_draw_takes_a_spec(tmp_path):
    out = tmp_path / "g.svg"
    result = run("draw", TINY_VIT, "--out", out)
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0


def test_a_path_that_exists_wins_over_the_prefixes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("timm:not_a_model").write_text(
        "import torch\nmodel = torch.nn.Linear(3, 2)\ndef example_inputs():\n    return torch.zeros(1, 3)\n"
    )
    result = run("trace", "timm:not_a_model")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Linear (custom): 8 parameters")


@pytest.mark.slow
def test_help_shows_every_form():
    for command in ("trace", "draw", "predict", "convert"):
        result = run(command, "--help")
        assert result.exit_code == 0
        text = " ".join(result.stdout.replace("│", " ").split())
        for form in ("MODEL.py", "FOLDER", "timm:NAME?k=v", "hf:TYPE?k=v"):
            assert form in text, (command, form)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, source, message",
    [
        (
            "trace",
            "timm:vit_tiny_patch16_22",
            "timm has no model 'vit_tiny_patch16_22'; did you mean vit_tiny_patch16_224",
        ),
        pytest.param(  # builds the default model on meta to suggest its keys
            "trace",
            "timm:vit_tiny_patch16_224?img_sz=32",
            "vit_tiny_patch16_224 takes no key 'img_sz'; did you mean img_size?",
            marks=pytest.mark.slow,
        ),
        (
            "trace",
            "timm:vit_tiny_patch16_224?img_size=abc",
            "timm cannot build vit_tiny_patch16_224 with img_size='abc': TypeError:",
        ),
        ("trace", "timm:vit_tiny_patch16_224?depth=[2,", "the value of depth does not parse"),
        ("trace", "timm:vit_tiny_patch16_224?pretrained=true", "pretrained is not accepted: graphkit never downloads"),
        ("trace", "timm:", "timm: needs a model name"),
        ("trace", "hf:qwen9", "transformers has no model type 'qwen9'; did you mean"),
        ("trace", "hf:qwen2?hiden_size=64", "Qwen2Config has no field 'hiden_size'; did you mean hidden_size"),
        ("trace", "hf:vit?num_labels=-1", "num_labels must be an integer >= 0 (0: no classifier); got -1"),
        ("trace", "hf:vit?num_labels=nan", "num_labels must be an integer >= 0 (0: no classifier); got 'nan'"),
        (
            "trace",
            "hf:qwen2?num_hidden_layers=abc",
            "transformers cannot build Qwen2Config: StrictDataclassFieldValidationError: Validation error for field "
            "'num_hidden_layers'",
        ),
        ("trace", "hf:t5", "transformers has neither a causal LM nor an image classifier for 't5'"),
        ("trace", "hf:meta-llama/Llama-3.2-1B", "not a hub repository; graphkit never downloads"),
        ("trace", "tim:vit_tiny_patch16_224", "no such file or folder; a model is one of MODEL.py | FOLDER | timm:"),
        ("trace", "{no-config}", "no config.json, so not a Hugging Face model folder"),
        ("trace", "{remote}", "model_type 'my_llama' is not one transformers defines and names remote code (auto_map)"),
        ("trace", "{llama}/config.json", "a file of a Hugging Face model folder; give the folder that holds it"),
        ("convert", "{bin-only}", "its weights are only in pytorch_model.bin, which graphkit never loads"),
        ("predict", "hf:qwen9", "transformers has no model type 'qwen9'"),
        ("draw", "timm:vit_tiny_patch16_22", "timm has no model 'vit_tiny_patch16_22'"),
    ],
)
def test_bad_sources_are_one_line_errors(folders, tmp_path, command, source, message):
    out = tmp_path / {"draw": "g.svg", "trace": "g.json"}.get(command, "p.safetensors")
    args = ["-a", "gqa", "-k", "1"] if command == "convert" else []
    result = run(command, source.format(**folders), *args, "--out", out)
    line = one_line_error(result)
    assert message in line, line
    assert not out.exists()
    assert not (folders["root"] / "ran").exists()  # remote code never runs


def test_a_class_only_remote_code_defines_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["MyLlama"], "auto_map": {"AutoModel": "m.MyLlama"}})
    )
    with pytest.raises(ModelSourceError, match="defines no model class 'MyLlama' and names remote code"):
        load_model_source(tmp_path, weights=False)


def test_a_prefix_is_one_entry_of_the_table(monkeypatch, tmp_path):
    """load_model_source reads prefixes from PREFIXES alone: a new entry is a new source, and a
    path that exists is still read as a path whatever its name."""
    seen = []

    def load(source: str, spec: str, weights: bool) -> ModelFile:
        seen.append((source, spec, weights))
        return ModelFile(path=None, model=torch.nn.Linear(2, 2), source=source)

    monkeypatch.setitem(sources.PREFIXES, "toy", sources.SourceForm("toy:N", "toy:N", "a toy", load))
    assert isinstance(load_model_source("toy:7?a=1", weights=False).model, torch.nn.Linear)
    assert seen == [("toy:7?a=1", "7?a=1", False)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy:8").mkdir()
    with pytest.raises(ModelSourceError, match="toy:8"):  # a folder, read as one (it has no config.json)
        load_model_source("toy:8")
    assert len(seen) == 1
    with pytest.raises(
        ModelSourceError, match=r"no such file or folder; a model is one of MODEL.py \| FOLDER \| timm:"
    ):
        load_model_source("nope:1")


def test_a_config_class_whose_own_defaults_fail_its_validation_still_names_its_fields():
    """Gemma 4's assistant config refuses its own defaults (transformers 5.x): reading the fields
    an hf: spec may set must not raise the library's error, which the CLI showed as unexpected."""
    from transformers import PretrainedConfig

    class Strict(PretrainedConfig):
        model_type = "graphkit-strict-test"

        def __init__(self, width: int = 0, **kwargs):
            if width <= 0:
                raise ValueError("width must be positive")
            self.width = width
            super().__init__(**kwargs)

    assert {"width", "num_labels"} <= set(sources._config_fields(Strict))

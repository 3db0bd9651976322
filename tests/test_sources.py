"""Model sources: every command that takes a MODEL.py also takes a Hugging Face model folder,
``timm:NAME?k=v`` and ``hf:MODEL_TYPE?k=v``, offline, with one-line errors for bad input."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from graphkit.errors import ModelSourceError
from graphkit.sources import load_model_source, parse_spec, parse_value


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


def test_too_large_to_hold_is_refused_before_allocating():
    huge = "hf:llama?num_hidden_layers=2&hidden_size=65536&intermediate_size=262144&num_attention_heads=64"
    with pytest.raises(ModelSourceError, match=r"its weights need [\d.]+ GiB and [\d.]+ GiB are free"):
        load_model_source(huge, weights=True)


def test_a_class_only_remote_code_defines_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["MyLlama"], "auto_map": {"AutoModel": "m.MyLlama"}})
    )
    with pytest.raises(ModelSourceError, match="defines no model class 'MyLlama' and names remote code"):
        load_model_source(tmp_path, weights=False)

"""The library behind `graphkit convert` (graphkit.conversion): a Python user gets the command's
rules and one-line errors from ConvertConfig, and the same conversion and files from
convert_attention and save_conversion."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import ROOT, gpt2

from graphkit.conversion import ConvertConfig, check_convert_output, convert_attention, save_conversion
from graphkit.errors import ConvertError, DataError
from graphkit.families import build_model, resolve_config
from graphkit.fileio import OutputError
from graphkit.params import read_params

LLAMA = resolve_config({"family": "llama", "num_layers": 2, "hidden": 64, "heads": 4, "vocab_size": 256, "context": 32})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"attention": "mqa"}, "unknown attention 'mqa'; accepted: gqa, kdgqa, dgqa, pgqa, mla"),
        ({"attention": "gqa", "format": "onnx"}, "unknown --format 'onnx'; accepted: graphkit, hf"),
        ({"attention": "pgqa", "format": "hf"}, "--format hf writes gqa or mla: no stock transformers class computes"),
        ({"attention": "mla", "kv_rank": 8, "format": "hf"}, "-a mla --format hf needs --rope-dims"),
        ({"attention": "mla"}, "-a mla needs --kv-rank"),
        ({"attention": "gqa", "kv_rank": 8}, "--kv-rank applies to -a mla, not gqa"),
        ({"attention": "gqa", "rope_dims": 4}, "--rope-dims applies to -a mla, not gqa"),
        ({"attention": "mla", "kv_rank": 8, "kv_heads": 2}, "--kv-heads applies to gqa and the key-driven variants"),
        ({"attention": "pgqa", "alpha": 0.5}, "--alpha applies only to dgqa, not pgqa"),
        ({"attention": "kdgqa", "grouping": "search"}, "--grouping search applies to gqa; kdgqa allocates its own"),
        ({"attention": "gqa", "data": "digits"}, "--data applies to --grouping keynorm, similarity, search and to"),
    ],
)
def test_every_rule_between_the_options_is_a_convert_error_when_the_config_is_made(options, message):
    with pytest.raises(ConvertError, match="^" + re.escape(message)):
        ConvertConfig(**options)


def test_a_bad_data_spec_fails_when_the_config_is_made():
    with pytest.raises(DataError, match="^unknown data source 'nosuch'; accepted: digits"):
        ConvertConfig(attention="gqa", grouping="keynorm", data="nosuch")


def test_a_conversion_from_python_is_the_commands(tmp_path):
    """GQA with measured groups on a LLaMA that holds weights: the KV cache falls to the K/V heads'
    share, the metadata names the variant and groups, and the file holds every converted tensor."""
    torch.manual_seed(0)
    model = build_model(LLAMA, "cpu")
    config = ConvertConfig(attention="gqa", kv_heads=2, grouping="keynorm")
    conversion = convert_attention(model, config, source="llama.py")
    assert conversion.after * 2 == conversion.before
    assert conversion.metadata["graphkit_attention"] == "gqa" and conversion.metadata["graphkit_kv_heads"] == "2"
    assert "graphkit_groups" in conversion.metadata  # measured, so recorded
    out = save_conversion(conversion, tmp_path / "gqa.safetensors", config)
    tensors, metadata = read_params(out)
    assert metadata["graphkit_attention"] == "gqa"
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 64)


def test_a_model_without_weights_or_with_nan_is_refused_naming_the_source(tmp_path):
    config = ConvertConfig(attention="gqa", kv_heads=2)
    with pytest.raises(ConvertError, match=r"^gpt2\.py: the model is on the meta device; convert needs its weights"):
        convert_attention(gpt2(), config, source="gpt2.py")
    model = build_model(LLAMA, "cpu")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("inf")
    with pytest.raises(ConvertError, match=r"^LlamaForCausalLM: its parameter 'model.layers.1.mlp.up_proj.weight'"):
        convert_attention(model, config)


def test_the_output_is_checked_for_the_format():
    with pytest.raises(OutputError):
        check_convert_output(ROOT / "README.md", "graphkit")  # a file graphkit did not write
    with pytest.raises(OutputError):
        check_convert_output(ROOT / "README.md", "hf")  # a folder is written there

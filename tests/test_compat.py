"""Private torch / transformers APIs are guarded: removing each one degrades, never crashes."""

import importlib
import subprocess
import sys
import types
import warnings

import pytest
import torch
from helpers import gpt2, llama, meta, timm_vit
from typer.core import TyperGroup
from typer.main import get_command

import graphkit
from graphkit import compat
from graphkit.attention import ConvertError, convert
from graphkit.cli import app
from graphkit.compat import aten_name, fx_flag, skip_weight_init
from graphkit.families import build_model


@pytest.mark.parametrize(
    "build",
    [
        lambda: timm_vit("vit_tiny_patch16_224", img_size=32, patch_size=8),
        lambda: gpt2(layers=2),
        lambda: llama(layers=2),
    ],
    ids=["vit", "gpt2", "llama"],
)
@pytest.mark.slow
def test_trace_without_the_private_fx_flag(monkeypatch, build):
    """torch 2.11 has no torch.fx.config.do_not_emit_stack_traces; tracing must not need it.
    (This torch reads the flag itself, so it stays in torch; graphkit's view of it is removed.)"""
    model = meta(build)
    expected = graphkit.trace(model).fingerprint()
    without = types.SimpleNamespace(
        **{k: v for k, v in vars(importlib.import_module("torch.fx.config")).items() if k != "do_not_emit_stack_traces"}
    )
    monkeypatch.setattr(compat, "_fx_config", lambda: without)
    with compat.fx_flag("do_not_emit_stack_traces", True) as present:
        assert not present
    assert graphkit.trace(model).fingerprint() == expected
    monkeypatch.setattr(compat, "_fx_config", lambda: None)  # no torch.fx.config at all
    assert graphkit.trace(model).fingerprint() == expected


def test_fx_flag_restores_and_skips():
    config = importlib.import_module("torch.fx.config")
    with fx_flag("no_such_flag_in_any_torch", 1) as present:
        assert present is False
    assert not hasattr(config, "no_such_flag_in_any_torch")
    if hasattr(config, "do_not_emit_stack_traces"):
        before = config.do_not_emit_stack_traces
        with fx_flag("do_not_emit_stack_traces", not before) as present:
            assert present and config.do_not_emit_stack_traces is (not before)
        assert config.do_not_emit_stack_traces is before


class _PublicOnly:
    """An op target as a future torch might expose it: no private _schema, only its str()."""

    def __str__(self) -> str:
        return "aten.scaled_dot_product_attention.default"


def test_aten_name_without_private_attributes():
    assert aten_name(torch.ops.aten.view.default) == "view"
    assert aten_name(torch.ops.aten.view) == "view"
    assert aten_name(_PublicOnly()) == "scaled_dot_product_attention"
    assert aten_name(len) == "len"


def test_hf_models_build_without_no_init_weights(monkeypatch):
    """Without transformers' private no_init_weights a model is still built (initialised)."""
    for name in ("transformers.initialization", "transformers.modeling_utils"):
        module = importlib.import_module(name)
        if hasattr(module, "no_init_weights"):
            monkeypatch.delattr(module, "no_init_weights")
    assert type(skip_weight_init()).__name__ == "nullcontext"
    model = build_model({"family": "gpt2", "num_layers": 1, "hidden": 16, "heads": 2, "context": 8}, device="cpu")
    assert torch.isfinite(model.transformer.wte.weight).all() and model.transformer.wte.weight.std() > 0


def test_llama_conversion_on_an_old_transformers_is_refused_unchanged(monkeypatch):
    """transformers without masking_utils (before 4.53): a one-line ConvertError, nothing converted."""

    model = llama(layers=1)
    before = {n: p.shape for n, p in model.named_parameters()}
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)
    with pytest.raises(
        ConvertError, match=r"module 'model.layers.0.self_attn': converting LLaMA-style attention needs .*4.53 or newer"
    ):
        convert(model, "gqa", 1)
    assert {n: p.shape for n, p in model.named_parameters()} == before


@pytest.mark.slow
def test_to_pyg_prints_no_warning_about_torch_jit(tmp_path):
    """Importing torch_geometric warns that torch.jit.script is deprecated; graphkit hides
    exactly that warning, so to_pyg() prints nothing."""

    code = (
        "import graphkit, torch\n"
        "from graphkit.datasets.pyg import PygGraphDataset\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "print(graphkit.trace(m, torch.randn(2, 4)).to_pyg().num_nodes)\n"
    )
    result = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "torch.jit.script" not in result.stderr and result.stdout.strip().isdigit()


@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning])
def test_pyg_import_hides_the_torch_jit_warning_of_every_torch_release(category, monkeypatch):
    """torch 2.11 (with PyG 2.8.0) deprecates torch.jit.script with a DeprecationWarning, later
    releases with a FutureWarning: pyg_data() hides both, and nothing else."""

    def import_warning(name):
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`.", category)
        warnings.warn("something else", UserWarning)
        return name

    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(compat.importlib, "import_module", import_warning)
        warnings.simplefilter("always")
        imported = compat.pyg_data()
    assert imported == "torch_geometric.data"
    assert [str(w.message) for w in caught] == ["something else"]


def test_usage_errors_are_told_from_the_public_bad_parameter():
    """typer vendors click as the private typer._click; the errors its parser raises are told
    apart without naming it, and the bare command's help signal is not one of them."""
    raised = {}
    for name, args in {"unknown option": ["--nope"], "no arguments": []}.items():
        try:
            TyperGroup.make_context(get_command(app), "graphkit", args)  # the parser, without the CLI's handling
        except Exception as e:
            raised[name] = e
    assert compat.is_usage_error(raised["unknown option"]) and "--nope" in raised["unknown option"].format_message()
    assert type(raised["no arguments"]).__name__ == "NoArgsIsHelpError"
    assert not compat.is_usage_error(raised["no arguments"]) and not compat.is_usage_error(ValueError("a bug"))

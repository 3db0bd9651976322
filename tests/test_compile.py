"""Compiler: records, graphs and configs back into models; parameters in and out as safetensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import ROOT
from typer.testing import CliRunner

import graphkit
from graphkit.attention import convert
from graphkit.cli import app
from graphkit.compiler import CompileError, compile_model, load_params, read_params, save_params
from graphkit.datasets import load
from graphkit.datasets.generate import generate
from graphkit.families import build_model

GPT = dict(family="gpt2", num_layers=2, hidden=32, heads=2, vocab_size=100, context=16, tied=True)
VIT = dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4)
LLAMA = dict(family="llama", num_layers=2, hidden=32, heads=4, kv_heads=2, vocab_size=100, context=16)


def logits(model, family):
    torch.manual_seed(0)
    if family == "vit":
        return model(torch.randn(2, 3, 8, 8))
    return model(torch.randint(0, 100, (2, 6))).logits


@pytest.mark.parametrize("config", [GPT, VIT, LLAMA], ids=["gpt2-tied", "vit", "llama"])
def test_save_and_load_reproduce_the_outputs(config, tmp_path):
    torch.manual_seed(1)
    original = build_model(config, device="cpu")
    path = save_params(original, tmp_path / "model.safetensors", config=config)
    tensors, metadata = read_params(path)
    assert set(tensors) == {n for n, _ in original.named_parameters()}  # tied weights stored once
    assert '"family": "' + config["family"] in metadata["graphkit_config"]
    torch.manual_seed(2)
    fresh = build_model(config, device="cpu")
    assert not torch.equal(logits(fresh, config["family"]), logits(original, config["family"]))
    report = load_params(fresh, path)
    assert report.coverage == 1.0 and report.missing == ()
    assert torch.equal(logits(fresh, config["family"]), logits(original, config["family"]))


def test_loading_into_a_meta_model_gives_real_tensors_and_keeps_ties():
    source = build_model(GPT, device="cpu")
    model = build_model(GPT)
    load_params(model, dict(source.named_parameters()))
    assert not any(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight


def test_tied_alias_names_are_accepted():
    model = build_model(GPT, device="cpu")
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    params["lm_head.weight"] = params.pop("transformer.wte.weight")
    assert load_params(model, params).coverage == 1.0


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda p: p.update({"transformer.h.0.attn.c_atn.weight": p.pop("transformer.h.0.attn.c_attn.weight")}),
            "parameter 'transformer.h.0.attn.c_atn.weight' is not a parameter of "
            "GPT2LMHeadModel; did you mean 'transformer.h.0.attn.c_attn.weight'",
        ),
        (
            lambda p: p.update({"transformer.ln_f.weight": torch.ones(31)}),
            r"parameter 'transformer.ln_f.weight' has shape \[31\] but the model expects \[32\]",
        ),
        (
            lambda p: p.pop("transformer.ln_f.bias"),
            "1 of 28 parameters are missing, the first is 'transformer.ln_f.bias'",
        ),
    ],
)
def test_bad_parameters_change_nothing(mutate, message):
    model = build_model(GPT, device="cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    mutate(params)
    with pytest.raises(CompileError, match=message):
        load_params(model, params)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no partial model


def test_non_strict_loading_reports_coverage():
    model = build_model(GPT, device="cpu")
    report = load_params(model, {"transformer.ln_f.weight": torch.ones(32)}, strict=False)
    assert report.loaded == 1 and 0 < report.coverage < 0.01 and len(report.missing) == 27


def test_bad_files(tmp_path):
    model = build_model(GPT, device="cpu")
    with pytest.raises(CompileError, match="nope.safetensors: no such parameter file"):
        load_params(model, tmp_path / "nope.safetensors")
    junk = tmp_path / "weights.bin"
    torch.save(dict(model.named_parameters()), junk)
    with pytest.raises(CompileError, match="weights.bin: not a safetensors file"):
        load_params(model, junk)
    with pytest.raises(CompileError, match="is on the meta device"):
        save_params(build_model(GPT), tmp_path / "meta.safetensors")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile") / "tiny"
    generate(str(ROOT / "tests" / "recipes" / "tiny-vits.json"), out, num=4)
    return out


@pytest.mark.slow
def test_compile_a_record_and_its_graph(dataset):
    record = load(dataset)[0]
    model = compile_model(record)
    assert next(model.parameters()).device.type == "cpu"
    assert graphkit.trace(model).fingerprint() == record["fingerprint"]
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 10)
    from_graph = compile_model(record.graph, device="meta")
    assert graphkit.trace(from_graph).fingerprint() == record["fingerprint"]


def test_compile_refuses_a_graph_it_cannot_reproduce(dataset):
    graph = load(dataset)[0].graph
    attention = next(i for i, n in enumerate(graph.nodes) if n.op == "attention")
    node = graph.nodes[attention]
    graph.nodes[attention] = type(node)(
        op=node.op, name=node.name, module=node.module, params=node.params, attrs={**node.attrs, "causal": True}
    )
    with pytest.raises(CompileError, match="traces to fingerprint"):
        compile_model(graph)
    with pytest.raises(CompileError, match="compile_model takes a dataset record, an ArchGraph or a config"):
        compile_model(42)


def test_compile_command(dataset, tmp_path):
    runner = CliRunner()
    first = load(dataset).ids[0]
    params = tmp_path / "params.safetensors"
    save_params(compile_model(load(dataset)[first]), params)
    out = tmp_path / "model.safetensors"
    result = runner.invoke(app, ["compile", str(dataset), first, "--params", str(params), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "traces to the stored fingerprint" in result.stdout and "(100.0%)" in result.stdout
    assert load_params(compile_model(load(dataset)[first]), out).coverage == 1.0
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 16)
    result = runner.invoke(
        app, ["compile", str(dataset), first, "--params", str(bad), "--out", str(tmp_path / "x.safetensors")]
    )
    assert (
        result.exit_code == 1
        and result.stderr.startswith("error: ")
        and "bad.safetensors: not a safetensors file" in result.stderr
    )
    assert not (tmp_path / "x.safetensors").exists()
    assert Path(out).exists()


@pytest.mark.slow
@pytest.mark.parametrize("config", [VIT, dict(GPT, tied=False), LLAMA], ids=["vit", "gpt2", "llama"])
@pytest.mark.parametrize("variant", ["gqa", "dgqa"])
def test_graphs_of_converted_models_compile_back(config, variant):

    converted = convert(build_model(config, device="cpu"), variant, kv_heads=1)
    graph = graphkit.trace(converted)
    rebuilt = compile_model(graph)
    assert graphkit.trace(rebuilt).fingerprint() == graph.fingerprint()
    load_params(rebuilt, converted.state_dict(), strict=True)
    assert torch.equal(logits(rebuilt.eval(), config["family"]), logits(converted.eval(), config["family"]))


def test_compile_a_record_with_another_attention(dataset):
    record = load(dataset)[0]
    model = compile_model(record, attention="kdgqa", kv_heads=1)
    attrs = next(n.attrs for n in graphkit.trace(model).nodes if n.op == "attention")
    assert (attrs["variant"], attrs["kv_heads"]) == ("kdgqa", 1)

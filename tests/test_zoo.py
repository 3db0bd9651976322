"""The zoo datasets (graphkit.datasets.zoo): timm's vision transformers and transformers' decoders
as they are published, their coverage on a sample, the report, resume, and predict on zoo models."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.datasets import load
from graphkit.datasets import zoo as zoo_module
from graphkit.datasets.zoo import TIMM_TRANSFORMER_MODULES, ZOOS, Zoo, ZooError, generate_zoo
from graphkit.families import ConfigError, build_model
from graphkit.ghn import bundled_for, predict
from graphkit.ghn.predict import prediction_refusal
from graphkit.tracing import trace

pytestmark = pytest.mark.slow


def test_a_zoo_sample_becomes_a_dataset_with_its_report(tmp_path):
    out = tmp_path / "zoo-vits"
    result = generate_zoo("zoo-vits", out, limit=6, workers=2)
    assert (result.candidates, result.failed, result.coverage, result.traced) == (6, 0, 1.0, 6)
    report = json.loads((out / "report.json").read_text())
    assert report["libraries"]["timm"] and report["records"] == result.records <= 6
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["libraries"] == report["libraries"] and manifest["zoo"] == "zoo-vits"
    assert "timm " + report["libraries"]["timm"] in (out / "README.md").read_text()
    dataset = load(out)
    assert len(dataset) == result.records and not (out / zoo_module.CACHE_DIR).exists()
    record = dataset[dataset.ids[0]]
    assert record.config["family"] == "timm" and record.graph.num_params == record["num_params"]
    assert sum(p.numel() for p in record.build_model().parameters()) == record["num_params"]
    again = generate_zoo("zoo-vits", out, limit=6, resume=True)  # finished: nothing to redo
    assert (again.traced, again.resumed, again.records) == (0, 6, result.records)


def test_an_interrupted_zoo_resumes_from_the_models_it_finished(tmp_path, monkeypatch):
    out = tmp_path / "zoo"

    def interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(zoo_module, "_assemble", interrupted)
        with pytest.raises(KeyboardInterrupt):
            generate_zoo("zoo-vits", out, limit=3)
    assert len(list((out / zoo_module.CACHE_DIR).glob("*.json"))) == 3
    with pytest.raises(ZooError, match="already holds a dataset; pass --resume"):
        generate_zoo("zoo-vits", out, limit=3)
    with pytest.raises(ZooError, match="holds a run made with"):
        generate_zoo("zoo-vits", out, limit=2, resume=True)
    result = generate_zoo("zoo-vits", out, limit=3, resume=True)
    assert (result.traced, result.resumed, result.candidates) == (0, 3, 3) and len(load(out)) == result.records


def _hangs_or_dies(config, device="meta"):
    if config["model"] == "hangs":
        time.sleep(60)
    if config["model"] == "dies":
        os._exit(3)
    return build_model({"family": "timm", "model": "test_vit"}, device)


def test_a_model_that_hangs_or_kills_its_process_is_a_report_line(tmp_path, monkeypatch):
    monkeypatch.setitem(
        ZOOS,
        "zoo-test",
        Zoo("zoo-test", "timm", "a test zoo", lambda: ["dies", "hangs", "test_vit"]),
    )
    monkeypatch.setattr(zoo_module, "build_model", _hangs_or_dies)
    monkeypatch.setattr(zoo_module, "MODEL_TIMEOUT", 5.0)
    result = generate_zoo("zoo-test", tmp_path / "z", workers=3)
    failed = {f["model"]: f["reason"] for f in result.report["failed"]}
    assert failed == {"dies": "the tracing process died (exit code 3)", "hangs": "not traced within 5 s"}
    assert result.records == 1 and result.coverage == pytest.approx(1 / 3, abs=1e-4)
    assert "- `hangs`: not traced within 5 s" in (tmp_path / "z" / "report.md").read_text()


def test_every_timm_transformer_module_traces_cleanly_on_a_sample():
    """The coverage pin: the first model of every module zoo-vits reads traces and validates
    with no op outside the vocabulary (the whole zoo is measured in BENCHMARKS.md)."""
    import timm

    firsts = [timm.list_models(module=module)[0] for module in TIMM_TRANSFORMER_MODULES]
    outcomes = [zoo_module._outcome("zoo-vits", name) for name in firsts]
    unclean = {o["model"]: o.get("error") or o["other_ops"] for o in outcomes if "error" in o or o["other_ops"]}
    assert not unclean


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mistral", "qwen2", "phi3", "gemma", "gpt_neox", "opt"])
def test_reference_decoders_trace_cleanly(model_type):
    outcome = zoo_module._outcome("zoo-decoders", model_type)
    assert "error" not in outcome and outcome["other_ops"] == [], outcome.get("error")
    assert outcome["row"]["family"] == "transformers" and outcome["row"]["num_layers"] >= 12


def test_predict_works_on_a_zoo_model_or_says_why_not():
    """On a sample: DeiT-Tiny (timm's vision_transformer family) is predicted by the bundled
    ViT hypernetwork, and the predicted model runs; BEiT and Swin have ops it never trained on
    (layer scale, pooling, shifted windows) and get the vision zoo checkpoint, and so does VOLO,
    whose fold the vision zoo checkpoint learnt once its family stayed in training, and GhostNet-V3,
    whose hard sigmoid is the sigmoid op (it was ``other:aten.hardsigmoid``); CSPDarkNet-53's leaky
    ReLU lies outside graphkit's vocabulary, and predict says so in one line."""
    deit = build_model({"family": "timm", "model": "deit_tiny_patch16_224"}, "cpu")
    assert prediction_refusal(trace(deit)) is None and bundled_for(trace(deit)).name == "logah-tiny-vits"
    params = predict(deit)
    assert all(torch.isfinite(p).all() for p in params.values())
    with torch.no_grad():
        assert torch.isfinite(deit(torch.randn(1, 3, 224, 224))).all()
    for name in ("beit_base_patch16_224", "swin_tiny_patch4_window7_224", "volo_d1_224", "ghostnetv3_050"):
        graph = trace(build_model({"family": "timm", "model": name}))
        assert prediction_refusal(graph) is None and bundled_for(graph).name == "logah-tiny-zoo-vision"
    darknet = build_model({"family": "timm", "model": "cspdarknet53"})
    nearest = "no bundled hypernetwork was trained on every op of this image model: the nearest, logah-tiny-zoo-vision"
    assert prediction_refusal(trace(darknet)).startswith(f"{nearest}, never saw other:aten.leaky_relu (bundled: ")


def test_bad_zoo_options_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ZooError, match="unknown zoo 'zoo-cnns'; known zoos: zoo-vits, zoo-decoders"):
        generate_zoo("zoo-cnns", tmp_path / "a")
    for option, value, named in (("workers", 0, "workers"), ("limit", -1, "num"), ("workers", True, "workers")):
        with pytest.raises(ZooError, match=f"--{named} must be an integer of at least 1"):
            generate_zoo("zoo-vits", tmp_path / "a", **{option: value})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ZooError, match="exists and is not a folder"):
        generate_zoo("zoo-vits", tmp_path / "file")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "README.md").write_text("mine")
    with pytest.raises(Exception, match="is not empty and holds no graphkit dataset"):
        generate_zoo("zoo-vits", tmp_path / "project")
    assert (tmp_path / "project" / "README.md").read_text() == "mine" and not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match=r"vit config: unknown key 'model'"):  # one registry: vit is no library
        build_model({"family": "vit", "model": "x"})
    with pytest.raises(ZooError, match=r"timm cannot build 'no_such_vit': RuntimeError: Unknown model"):
        build_model({"family": "timm", "model": "no_such_vit"})


@pytest.mark.parametrize(("model_type", "mixers"), [("mamba", 32), ("qwen3_next", 6), ("rwkv", 32)])
def test_recurrent_mixers_are_one_node_each(model_type, mixers):
    """Mamba's selective scan, Qwen3-Next's gated DeltaNet and RWKV's time mixing are no softmax
    attention: each mixer module is one ``ssm`` node owning its projections (vocabulary v3).
    Qwen3-Next with 8 of its 48 layers (6 DeltaNets, then full attention every fourth): its
    layers alternate, so none fold, and each DeltaNet's chunked loop cost 10 s of tracing."""
    config = zoo_module.ZOOS["zoo-decoders"].config(model_type)
    if model_type == "qwen3_next":
        config = {**config, "shrink": {"num_hidden_layers": 8}}
    graph = zoo_module.trace_zoo_model(build_model(config), config)
    assert not [n.op for n in graph.nodes if n.op.startswith("other:")]
    assert [n.op for n in graph.nodes].count("ssm") == mixers


def test_squared_relu_is_a_vocabulary_op():
    outcome = zoo_module._outcome("zoo-decoders", "arcee")  # Arcee's MLP: relu(x).square()
    assert outcome["other_ops"] == [] and "square" in outcome["row"]["node_op"]


def _library_cannot_build(config, device="meta"):
    if config["model"] == "broken":
        raise ZooError("timm cannot build 'broken': TypeError: unsupported operand type(s)")
    return build_model({"family": "timm", "model": "test_vit"}, device)


def test_a_model_its_library_cannot_build_is_reported_and_not_counted(tmp_path, monkeypatch):
    """Coverage is over the candidates the library builds: a reference config transformers itself
    cannot instantiate (Hunyuan's, whose head_dim is None) is listed apart and not held against
    the tracer."""
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: ["broken", "test_vit"]))
    monkeypatch.setattr(zoo_module, "build_model", _library_cannot_build)
    result = generate_zoo("zoo-test", tmp_path / "z")
    report = result.report
    assert (report["candidates"], report["buildable"], report["clean"], report["coverage"]) == (2, 1, 1, 1.0)
    assert (result.failed, result.unbuildable, report["failed"]) == (0, 1, [])
    assert report["unbuildable"] == [
        {"model": "broken", "reason": "timm cannot build 'broken': TypeError: unsupported operand type(s)"}
    ]
    text = (tmp_path / "z" / "report.md").read_text()
    assert (
        "- built by the library: 1" in text and "## The library cannot build them (not counted)\n\n- `broken`" in text
    )


@pytest.mark.slow
def test_the_report_counts_predictable_models_and_the_refusals_by_missing_op(tmp_path, monkeypatch):
    """timm's test ViTs are predicted (the plain one by the ViT checkpoint, the one with layer
    scale by the vision zoo's); timm's test EfficientNet with EvoNorm has a variance outside the
    vocabulary and a pow no bundled vision hypernetwork trained on, and is counted under both."""
    names = ["test_vit", "test_vit2", "test_efficientnet_evos"]
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: names))
    report = generate_zoo("zoo-test", tmp_path / "z").report
    assert (report["traced"], report["predictable"]) == (3, 2)
    assert report["predict_refusals"] == {"missing ops: other:aten.var, pow": 1}
    assert report["predict_missing_ops"] == {"other:aten.var": 1, "pow": 1}
    text = (tmp_path / "z" / "report.md").read_text()
    assert "predictable by graphkit's bundled hypernetworks (`graphkit predict`): 2 of 3 traced" in text
    assert "- missing ops: other:aten.var, pow: 1\n" in text


class _LongBranch(torch.nn.Module):
    """A language model with a module that only runs on sequences of 64 tokens or more (DeepSeek-V4
    compresses its keys every 128 tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.compress = torch.nn.Linear(8, 8)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        return h + self.compress(h) if input_ids.shape[1] >= 64 else h


def test_a_branch_short_inputs_leave_untaken_is_traced_with_longer_ones():
    """Guessed inputs are tried again, longer (up to the position limit), where they leave a
    parameter unread: the zoo did so, and since 2026-12-03 ``trace`` itself, so ``graphkit trace``
    takes such a model too. Inputs a user gives are traced as they are."""
    from transformers import PretrainedConfig

    model = _LongBranch()
    model.config = PretrainedConfig(vocab_size=16, max_position_embeddings=100)
    with pytest.raises(Exception, match="'compress.weight' is not used by forward"):
        trace(model, {"input_ids": torch.zeros(2, 8, dtype=torch.long)})
    graph = trace(model)
    assert "compress" in {n.module for n in graph.nodes} and graph.meta["input_shapes"] == [[2, 100]]


def test_a_decoder_with_cross_attention_is_traced_with_encoder_states():
    """TrOCR's decoder attends to an image encoder: its cross-attention runs once encoder states are
    given, as a second input."""
    outcome = zoo_module._outcome("zoo-decoders", "trocr")
    assert "error" not in outcome and outcome["other_ops"] == [], outcome.get("error")
    assert outcome["row"]["node_op"].count("attention") == 24  # 12 layers, each self- and cross-attention


def test_decoder_candidates_leave_out_models_that_read_images():
    candidates = ZOOS["zoo-decoders"].candidates()
    assert "fuyu" not in candidates and {"trocr", "gpt2", "llama", "granite_swa"} <= set(candidates)


def test_graphkit_generate_zoo_says_what_it_holds_and_refuses_recipe_options(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["generate", "zoo-vits", "--num", "2", "--out", str(tmp_path / "z")])
    assert result.exit_code == 0, result.output
    assert "2 models" in result.output and "0 failed, 0 the library cannot build; 100.0% of those it builds" in (
        " ".join(result.output.split())
    )
    refused = runner.invoke(app, ["generate", "zoo-decoders", "--seed", "3", "--out", str(tmp_path / "y")])
    assert refused.exit_code != 0 and "--seed applies to recipes, not to zoo-decoders" in refused.output
    assert not (tmp_path / "y").exists()

"""What the commands write and print: every --out checked before any work, no file
graphkit did not write overwritten, a model source never an output, `ls` whole when piped and as
CSV or JSON, a warning when `predict` leaves its hypernetwork's training space, a malformed
command line (a value of the wrong type, an unknown option or command) in one line, and a
`--help` that does not wait for torch. test_outputs.py holds the rule for outputs, command by
command and kind by kind."""

from __future__ import annotations

import csv
import inspect
import io
import json
import subprocess
import sys
import typing

import pytest
import torch
import typer
from helpers import MODEL_FILES, ROOT, one_line_error
from rich.console import Console
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from graphkit import ArchGraph
from graphkit.cli import app
from graphkit.cli import datasets as datasets_cli
from graphkit.fileio import graphkit_kind
from graphkit.finetune import LR_SCALE_KEY
from graphkit.params import read_params

runner = CliRunner()
VIT = ROOT / "examples" / "vit_tiny_cifar.py"
TINY = ROOT / "tests" / "recipes" / "tiny-vits.json"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_trace_never_writes_over_the_model_source(tmp_path):
    model = tmp_path / "m" / "lin.py"
    model.parent.mkdir()
    model.write_text(VIT.read_text())
    line = one_line_error(run("trace", model, "--out", model))
    assert line == f"error: --out {model}: is a Python file name; graphkit never writes over model sources"
    assert model.read_text() == VIT.read_text()


@pytest.mark.parametrize(
    "target, message",
    [
        ("folder", "is a folder; give a file name"),
        (
            "notes.txt",
            "exists and was not written by graphkit; refusing to overwrite it (remove it, or choose another name)",
        ),
        (
            "graph.json",
            "exists and was not written by graphkit; refusing to overwrite it (remove it, or choose another name)",
        ),
    ],
)
def test_trace_checks_its_output_before_the_model_runs(tmp_path, target, message):
    """build_raises.py fails when it runs: the error is about --out, so the check came first."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "graph.json").write_text('{"my": "settings"}')
    out = tmp_path / target
    assert (
        one_line_error(run("trace", MODEL_FILES / "build_raises.py", "--out", out)) == f"error: --out {out}: {message}"
    )
    assert (tmp_path / "notes.txt").read_text() == "mine" and (
        tmp_path / "graph.json"
    ).read_text() == '{"my": "settings"}'


@pytest.mark.parametrize("name, fmt, kind", [("graph.json", "json", "graph"), ("summary.txt", "text", "summary")])
def test_trace_replaces_what_it_wrote(tmp_path, name, fmt, kind):
    out = tmp_path / name
    for _ in range(2):
        assert run("trace", VIT, "--out", out, "--format", fmt).exit_code == 0
    assert graphkit_kind(out) == kind
    if fmt == "json":
        ArchGraph.from_json(out.read_text()).validate()
    else:
        assert out.read_text().splitlines()[-1].startswith("fingerprint ")


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_draw_replaces_its_own_pictures_and_no_one_elses(tmp_path, suffix, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # grandalf, whatever this machine has
    ours, theirs = tmp_path / f"ours{suffix}", tmp_path / f"theirs{suffix}"
    for _ in range(2):
        assert run("draw", VIT, "--out", ours).exit_code == 0, "a second drawing replaces the first"
    assert graphkit_kind(ours) == "drawing"
    picture = ours.read_bytes().replace(b"graphkit", b"someone")  # the same picture, another author
    theirs.write_bytes(picture)
    assert one_line_error(run("draw", VIT, "--out", theirs)).endswith(
        "exists and was not written by graphkit; refusing to overwrite it (remove it, or choose another name)"
    )
    assert theirs.read_bytes() == picture


def test_parameter_outputs_never_replace_a_checkpoint_graphkit_did_not_write(tmp_path):
    downloaded = tmp_path / "pretrained.safetensors"
    save_file({"w": torch.ones(2)}, str(downloaded), metadata={"format": "pt"})
    before = downloaded.read_bytes()
    for args in (["predict", VIT], ["convert", VIT, "-a", "gqa", "-k", "1"]):
        line = one_line_error(run(*args, "--out", downloaded))
        assert (
            line == f"error: --out {downloaded}: exists and was not written by graphkit; refusing to overwrite it "
            "(remove it, or choose another name)"
        )
    assert downloaded.read_bytes() == before
    ours = tmp_path / "predicted.safetensors"
    for _ in range(2):
        assert run("predict", VIT, "--out", ours).exit_code == 0
    assert graphkit_kind(ours) == "predicted-weights"


def test_generate_refuses_a_recipe_with_a_ratio_for_mlp_before_making_a_folder(tmp_path):
    recipe = tmp_path / "ratio.json"
    recipe.write_text(json.dumps({**json.loads(TINY.read_text()), "name": "ratio", "fixed": {"mlp": 0.5}}))
    out = tmp_path / "ratio"
    line = one_line_error(run("generate", recipe, "--out", out))
    assert line.startswith("error: recipe 'ratio': vit config: mlp must be an integer >= 1 (the MLP's hidden width")
    assert not out.exists()


@pytest.fixture(scope="module")
def long_ids(tmp_path_factory):
    """A dataset whose record ids are longer than a table fits in 80 columns."""
    recipe = tmp_path_factory.mktemp("recipe") / "r.json"
    recipe.write_text(
        json.dumps({**json.loads(TINY.read_text()), "name": "a-dataset-name-well-past-eighty-columns-wide"})
    )
    out = tmp_path_factory.mktemp("datasets") / "long"
    assert run("generate", recipe, "--out", out, "--num", "4").exit_code == 0
    return out


def test_ls_prints_whole_values_when_piped(long_ids):
    result = run("ls", long_ids, "--limit", "0")  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0
    ids = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("a-dataset")]
    assert sorted(ids) == [f"a-dataset-name-well-past-eighty-columns-wide-{i:05d}" for i in range(4)]
    assert "…" not in result.stdout


def test_ls_keeps_every_column_and_value_on_a_narrow_terminal(long_ids, monkeypatch):
    """At 60 columns Rich dropped the kv column and cut ids and parameter counts."""
    monkeypatch.setattr(datasets_cli, "console", Console(width=60, force_terminal=True, color_system=None))
    result = run("ls", long_ids)
    assert result.exit_code == 0
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["id", "family", "split", "layers", "hidden", "heads", "kv", "attn", "params", "nodes"]
    records = json.loads(run("ls", long_ids, "--format", "json").stdout)
    for line, record in zip(rows, records, strict=False):
        assert line.split()[0] == record["id"] and line.split()[6] == str(record["kv_heads"])
        assert line.split()[8] == f"{record['num_params']:,}"
    assert "…" not in result.stdout


def test_ls_writes_csv_and_json(long_ids):
    rows = list(csv.DictReader(io.StringIO(run("ls", long_ids, "--format", "csv").stdout)))
    records = json.loads(run("ls", long_ids, "-f", "json", "--split", "train").stdout)
    assert len(rows) == 4 and all(r["id"].startswith("a-dataset-name-well-past-eighty-columns-wide-") for r in rows)
    assert set(rows[0]) == {
        "id",
        "family",
        "split",
        "num_layers",
        "hidden",
        "heads",
        "kv_heads",
        "attention",
        "num_params",
        "num_nodes",
    }
    assert records and all(r["split"] == "train" and isinstance(r["num_params"], int) for r in records)
    assert run("ls", long_ids, "--format", "xml").exit_code == 2  # Typer names the accepted values


def test_help_does_not_import_torch():
    """`graphkit --help` took 3 s and 650 MB, importing torch it never used."""
    code = (
        "import sys; from graphkit.cli import app; import graphkit; graphkit.GraphkitError; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    assert subprocess.run([sys.executable, "-m", "graphkit", "--help"], capture_output=True, text=True).returncode == 0


@pytest.mark.slow
def test_predict_warns_in_one_line_how_far_a_model_lies_outside_the_training_space():
    inside = run("predict", MODEL_FILES.parent / "model_files" / "digits_vit.py")
    assert inside.exit_code == 0 and "warning" not in inside.stderr
    outside = run("predict", ROOT / "examples" / "vit_b16.py")
    assert outside.exit_code == 0
    assert (
        "predicting it as its 256-wide twin (4 heads), grown to its width, its patch embedding and position table "
        "resized from the twin's patch 2 at 8 px (4 x 4 tokens) to its 14 x 14 tokens, its output layer scaled by "
        "4/14" in outside.stdout
    )
    assert "calibrating" not in outside.stdout
    calibrated = run("predict", ROOT / "examples" / "vit_b16.py", "--calibrate")
    assert calibrated.exit_code == 0 and "calibrating its residual stream" in calibrated.stdout
    (line,) = [line for line in outside.stderr.splitlines() if line.startswith("warning:")]
    assert line == (
        "warning: vit_b16.py lies outside the space this hypernetwork was trained on: width 768 is 1.5x the "
        "largest trained (512), depth 12 layers is 1.3x the largest trained (9 layers), resolution 224 px is "
        "28x the largest trained (8 px), patch size 16 px is 4.0x the largest trained (4 px), token grid 14 tokens "
        "a side is 3.5x the largest trained (4 tokens a side), where predictions may start worse than the "
        "model's own init; the scores above were measured on the held-out architectures of its training data, "
        "not on this model"
    )


@pytest.mark.slow
def test_predict_grows_a_wide_model_unless_told_not_to(tmp_path):
    model_file = MODEL_FILES.parent / "model_files" / "wide_digits_vit.py"
    grown = run("predict", model_file, "--out", tmp_path / "grown.safetensors")
    assert grown.exit_code == 0, grown.output
    assert "predicting it as its 512-wide twin (8 heads)" in grown.stdout
    direct = run("predict", model_file, "--no-grow", "--out", tmp_path / "direct.safetensors")
    assert direct.exit_code == 0 and "twin" not in direct.stdout
    a, b = load_file(tmp_path / "grown.safetensors"), load_file(tmp_path / "direct.safetensors")
    assert a.keys() == b.keys() and not torch.equal(a["head.weight"], b["head.weight"])
    # grown: every coordinate of the stream is a copy of one of the twin's 512
    weight = a["patch_embed.proj.weight"]
    torch.testing.assert_close(weight[512:], weight[:256])


def test_predict_takes_a_hand_written_vit_outside_the_trained_grid_through_its_own_copy_at_a_trained_one(tmp_path):
    """A ViT of torch layers at 32 px with patch 4 has no config to build a twin from: its own
    modules, copied at patch 2 on 8 px, are one, traced from its example_inputs() resized."""
    out = tmp_path / "torch_vit.safetensors"
    result = run("predict", MODEL_FILES.parent / "model_files" / "torch_vit.py", "--out", out)
    assert result.exit_code == 0, result.output
    assert (
        "predicting it as its twin with patch 2 at 8 px (4 x 4 tokens), its patch embedding and position table "
        "resized to its 8 x 8 tokens, its output layer scaled by 4/8" in " ".join(result.stdout.split())
    )
    assert json.loads(read_params(out, tensors=False)[1][LR_SCALE_KEY]) == {"patch.weight": 0.25}
    direct = run("predict", MODEL_FILES.parent / "model_files" / "torch_vit.py", "--no-grow")
    assert direct.exit_code == 0 and "twin" not in direct.stdout


def test_predict_takes_a_layer_scale_vit_as_its_plain_twin_and_says_so(tmp_path):
    """DeiT-III at the trained shapes goes to the ViT checkpoint, which never saw layer scale, and
    is predicted as its plain twin, its gains written as 1; told not to predict through a twin, it
    is refused in one line that names the op and the twin."""
    source = "timm:deit3_small_patch16_224?img_size=8&patch_size=2&depth=3&embed_dim=256&num_heads=4&num_classes=10"
    out = tmp_path / "deit3.safetensors"
    result = run("predict", source, "--out", out)
    assert result.exit_code == 0, result.output
    twin = "its twin with its prefix tokens' positions in the position table (added to the tokens) and without layer "
    assert (
        f"bundled hypernetwork logah-tiny-vits: trained on image models and on every op kind {source} has as {twin}"
        in (" ".join(result.stdout.split()))
    )
    assert f"predicting it as {twin}" in " ".join(result.stdout.split())
    gains = {name: t for name, t in load_file(out).items() if name.endswith(".gamma")}
    assert len(gains) == 6 and all(torch.equal(t, torch.ones(256)) for t in gains.values())
    line = one_line_error(run("predict", source, "--no-grow"))
    assert line.startswith(
        "error: node 'blocks.0.ls1.scale' has op 'scale', which this hypernetwork was not trained on"
    )
    assert line.endswith(f"predicted through a twin (grow) it is: {twin}scale (its gains set to 1)")


@pytest.mark.slow
def test_predict_grows_a_transformers_decoder_of_no_graphkit_family_through_its_own_class(tmp_path):
    """A 12 x 384 Qwen2 (no graphkit family reads it) predicted by the LLaMA checkpoint, whose
    9-layer models are at most 256 wide: predict builds its twin from Qwen2's own config class and
    records lr x 1/2 for every weight that reads the grown width, in one line."""
    model_file = tmp_path / "qwen2.py"
    model_file.write_text(
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        "config = AutoConfig.for_model('qwen2', vocab_size=32000, hidden_size=384, num_hidden_layers=12,\n"
        "    num_attention_heads=6, num_key_value_heads=2, intermediate_size=1024)\n"
        "model = AutoModelForCausalLM.from_config(config)\n"
    )
    out = tmp_path / "predicted.safetensors"
    result = run("predict", model_file, "--ghn", "logah-tiny-llamas", "--no-keep-init", "--out", out)
    assert result.exit_code == 0, result.output
    assert "predicting it as its 192-wide twin (3 heads), grown to its width" in result.stdout
    assert "fine-tune 85 weights (model.layers.0.self_attn.q_proj.weight, " in result.stdout
    scales = json.loads(read_params(out, tensors=False)[1][LR_SCALE_KEY])
    assert len(scales) == 85 and set(scales.values()) == {0.5}


def _numeric_options():
    """(command, option) for every int or float option of every command, read from the commands'
    signatures, so that an option added later is checked too."""
    for info in app.registered_commands:
        hints = typing.get_type_hints(info.callback)
        for name, parameter in inspect.signature(info.callback).parameters.items():
            types = {hints[name], *typing.get_args(hints[name])}
            if types & {int, float} and isinstance(parameter.default, typer.models.OptionInfo):
                yield info.name or info.callback.__name__, parameter.default.param_decls[0]


NUMERIC_OPTIONS = list(_numeric_options())


def test_every_command_has_numeric_options_to_check():
    assert {("convert", "--kv-rank"), ("convert", "--kv-heads"), ("train-ghn", "--steps")} <= set(NUMERIC_OPTIONS)
    assert ("convert", "--rope-dims") in NUMERIC_OPTIONS and ("eval-ghn", "--lr") in NUMERIC_OPTIONS


@pytest.mark.parametrize("command, option", NUMERIC_OPTIONS)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_option(command, option):
    """Click's usage box (usage, hint, a framed message) was typer's answer to `--kv-rank x`."""
    result = run(command, option, "x")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: Invalid value for '{option}'") and "should be a valid" in line, line


@pytest.mark.parametrize(
    "args, message",
    [
        (["ls", "DIR", "--format", "xml"], "error: Invalid value for '--format' / '-f': Value error, 'xml' is not one"),
        (["trce"], "error: No such command 'trce'. Did you mean 'trace'?"),
        (["--nope", "ops"], "error: No such option: --nope"),
        (["trace", "m.py", "--outt", "g.json"], "error: No such option: --outt"),
        (["ls"], "error: Missing argument 'path'"),
    ],
)
def test_every_malformed_command_line_is_one_line(args, message):
    result = run(*args)
    assert result.exit_code == 2 and result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_help_still_answers_without_an_error():
    assert run("convert", "--help").exit_code == 0
    bare = run()  # no command: the help, as before
    assert "Usage" in bare.output and "error:" not in bare.output


@pytest.mark.parametrize(
    "name, fmt, accepted",
    [
        ("graph.png", None, "'.png'; accepted: .json, .txt, .md"),
        ("graph", None, "'(none)'; accepted: .json, .txt, .md"),
        ("graph.json", "text", "'.json'; accepted: .txt, .md"),
        ("summary.md", "json", "'.md'; accepted: .json"),
    ],
)
def test_trace_out_takes_only_the_extensions_of_its_format(tmp_path, name, fmt, accepted):
    out = tmp_path / name
    line = one_line_error(run("trace", MODEL_FILES / "build_raises.py", "--out", out, *(["-f", fmt] if fmt else [])))
    assert line == f"error: --out {out}: unsupported extension {accepted}"  # before the model ran
    assert not out.exists()


def test_trace_out_writes_the_format_its_extension_names(tmp_path):
    for name, kind in (("s.md", "summary"), ("s.txt", "summary"), ("g.json", "graph")):
        assert run("trace", VIT, "--out", tmp_path / name).exit_code == 0
        assert graphkit_kind(tmp_path / name) == kind

"""`graphkit trace` and every bad MODEL.py the issue names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from helpers import MODEL_FILES, ROOT
from typer.testing import CliRunner

from graphkit import ArchGraph
from graphkit.attention import convert
from graphkit.cli import app
from graphkit.compiler import load_params, read_params
from graphkit.modelfile import load_model_file

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_trace_writes_json_and_prints_summary(tmp_path):
    out = tmp_path / "graphs" / "llama.json"
    result = run("trace", ROOT / "examples" / "llama_block.py", "--out", out)
    assert result.exit_code == 0, result.output
    assert "TinyLlama (custom): 949,376 parameters" in result.stdout
    assert "4 x GQA heads=8 kv_heads=2" in result.stdout
    graph = ArchGraph.from_json(out.read_text())
    graph.validate()
    assert graph.meta["num_params"] == 949_376
    assert [p.name for p in out.parent.iterdir()] == ["llama.json"]  # no temporary left behind


def test_trace_text_format_and_json_to_stdout(tmp_path):
    out = tmp_path / "g.txt"
    assert run("trace", ROOT / "examples" / "llama_block.py", "-o", out, "-f", "text").exit_code == 0
    mark, summary = out.read_text().split("\n", 1)  # the mark that proves the file graphkit's, then the summary
    assert mark.startswith("# graphkit ") and mark.endswith(" summary") and summary.startswith("TinyLlama (custom)")
    result = run("trace", ROOT / "examples" / "llama_block.py", "--format", "json")
    assert ArchGraph.from_json(result.stdout).meta["model_class"].endswith("TinyLlama")


@pytest.mark.parametrize(
    "file,message",
    [
        ("missing.py", "missing.py: no such file"),
        ("syntax_error.py", "syntax_error.py:3: syntax error: '(' was never closed"),
        ("no_model.py", "defines neither `model` (an nn.Module) nor a `build_model()` function"),
        ("not_a_module.py", "the model must be a torch.nn.Module, got str"),
        (
            "build_raises.py",
            "build_raises.py:2: build_model() raised ValueError: hidden size must be divisible by heads",
        ),
        ("file_raises.py", "file_raises.py:4: running the file raised RuntimeError: config file not found"),
        (
            "forward_raises.py",
            "Net.forward raised RuntimeError in module 'fc' (Linear) at "
            "forward_raises.py:11: a and b must have same reduction dim",
        ),
        (
            "data_dependent.py",
            "cannot export Gate: data-dependent control flow in Gate.forward at data_dependent.py:12",
        ),
        (
            "unused_param.py",
            "parameter 'unused.weight' is not used by forward with these inputs (module 'unused' (Linear) "
            "never runs): remove it if it is spare, or pass example inputs that take the branch that uses it",
        ),
        ("no_inputs.py", "cannot guess example inputs for Sequential"),
    ],
)
def test_bad_model_files_give_one_line_errors(file, message, tmp_path):
    out = tmp_path / "graph.json"
    result = run("trace", MODEL_FILES / file, "--out", out)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
    assert not out.exists()  # nothing half-written


def test_debug_shows_the_traceback():
    result = run("--debug", "trace", MODEL_FILES / "build_raises.py")
    assert result.exit_code != 0
    assert result.exception is not None and "hidden size" in str(result.exception)


def test_help_is_useful():
    result = run("trace", "--help")
    assert result.exit_code == 0
    for word in ("MODEL.py", "--out", "--format", "--fold", "meta"):
        assert word in result.stdout


def test_the_command_list_gives_each_summary_as_one_paragraph():
    """`graphkit --help` lists each command with its docstring's first paragraph on lines of the
    terminal's width, not broken where the source's lines end."""
    group = typer.main.get_command(app)
    context = group.context_class(group)
    summaries = {name: group.get_command(context, name).short_help for name in group.list_commands(context)}
    assert summaries["eval-ghn"].startswith("Compare predicted parameters with each model's own (random) init")
    assert all(summary and "\n" not in summary and "  " not in summary for summary in summaries.values()), summaries
    listing = run("--help")
    assert listing.exit_code == 0 and "initialisation, orthogonal initialisation" in listing.stdout


def test_console_script_is_installed():
    exe = shutil.which("graphkit", path=str(Path(sys.executable).parent))
    assert exe is not None
    result = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "trace" in result.stdout


def test_vocabulary_doc_is_in_sync():
    result = run("ops", "--markdown")
    assert result.exit_code == 0
    assert (ROOT / "docs" / "vocabulary.md").read_text() == result.stdout, (
        "regenerate: graphkit ops --markdown > docs/vocabulary.md"
    )
    listing = run("ops")
    assert listing.exit_code == 0 and "rotary_embedding" in listing.stdout and "pos_enc" in listing.stdout


TINY = ROOT / "tests" / "recipes" / "tiny-vits.json"


@pytest.mark.slow
def test_dataset_commands(tmp_path, monkeypatch):
    out = tmp_path / "tiny"
    result = run("generate", TINY, "--out", out, "--num", "12", "--seed", "2")
    assert result.exit_code == 0, result.output
    assert "wrote 12 records" in result.stdout and str(out) in result.stdout
    listing = run("ls", out, "--split", "train", "--max-params", "400000", "--limit", "0")
    assert listing.exit_code == 0 and "matching records" in listing.stdout
    first = next(line.split()[0] for line in listing.stdout.splitlines() if line.startswith("tiny-vits-"))
    shown = run("show", out, first)
    assert shown.exit_code == 0 and '"family": "vit"' in shown.stdout and "attention:" in shown.stdout
    monkeypatch.chdir(tmp_path)
    stats = run("stats", out)
    assert stats.exit_code == 0 and "12 records" in stats.stdout
    png = tmp_path / "tiny-params.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["generate", "vits-2k"],
            "unknown recipe 'vits-2k'; known recipes: gpts-1k, llamas-1k, "
            "vits-1k, vits-digits, vits-digits-grids24 (or a .json / .yaml recipe file)",
        ),
        (["ls", "no-such-folder"], "no-such-folder: no such dataset folder"),
        (["stats", "."], ".: not a graphkit dataset (no data/*.parquet files)"),
    ],
)
def test_dataset_command_errors(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {message}"


@pytest.mark.slow
def test_show_unknown_id(tmp_path):
    out = tmp_path / "tiny"
    assert run("generate", TINY, "--out", out, "--num", "3").exit_code == 0
    result = run("show", out, "tiny-vits-99999")
    assert result.exit_code == 1 and "no record 'tiny-vits-99999'" in result.stderr


def test_convert_command(tmp_path):

    out = tmp_path / "dgqa.safetensors"
    result = run(
        "convert",
        ROOT / "examples" / "vit_tiny_cifar.py",
        "--attention",
        "dgqa",
        "--kv-heads",
        "2",
        "--window",
        "10",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    assert "4 x DGQA heads=6 kv_heads=2" in result.stdout
    tensors, metadata = read_params(out)
    assert metadata["graphkit_attention"] == "dgqa" and "blocks.0.attn.core.counts" in tensors
    fresh = convert(load_model_file(ROOT / "examples" / "vit_tiny_cifar.py").model, "dgqa", 2, window=10)
    assert load_params(fresh, out).coverage == 1.0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--attention", "mqa", "--out", "x.safetensors"], "'mqa' is not one of"),
        (
            ["--attention", "gqa", "--kv-heads", "4", "--out", "x.safetensors"],
            "kv_heads 4 does not divide the 6 heads of module 'blocks.0.attn'",
        ),
    ],
)
def test_convert_errors(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("convert", ROOT / "examples" / "vit_tiny_cifar.py", *args)
    assert result.exit_code != 0 and message in result.output
    assert not (tmp_path / "x.safetensors").exists()


def test_convert_refuses_nan_weights_before_writing(tmp_path):
    model_file = tmp_path / "nan_vit.py"
    source = (ROOT / "examples" / "vit_tiny_cifar.py").read_text()
    model_file.write_text(source + "with torch.no_grad():\n    model.blocks[1].attn.qkv.weight[3, 5] = float('nan')\n")
    out = tmp_path / "gqa.safetensors"
    result = run("convert", model_file, "--attention", "gqa", "--kv-heads", "2", "--out", out)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {model_file}: its parameter 'blocks.1.attn.qkv.weight' holds NaN or Inf; convert needs finite weights"
    )
    assert list(tmp_path.iterdir()) == [model_file]


def test_convert_needs_weights():
    result = run("convert", ROOT / "examples" / "gpt2.py", "--attention", "gqa", "--out", "x.safetensors")
    assert result.exit_code == 1 and "is on the meta device; convert needs its weights" in result.stderr


def test_error_text_is_printed_verbatim(tmp_path):
    """A message holding [brackets] (a path, a recipe range) is not eaten as rich markup."""
    missing = tmp_path / "run[bold]" / "model.py"
    result = run("trace", str(missing))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {missing}: no such file"

"""Nothing left behind by a stopped command (issue #46, item 3): each command that writes a file
or a folder is stopped by SIGTERM or Ctrl-C in the middle of its write, after the library that
writes for it (safetensors, save_pretrained, matplotlib, pyarrow) has put its bytes down, and
the folder it wrote into must hold exactly what it held before: no staging folder, no
library's own temporary file, the previous output byte for byte.

The signal is real (``os.kill`` of this process, handled by the command's own handler); only
the moment is chosen, by wrapping the library's writer so that it signals once it has written.
"""

from __future__ import annotations

import os
import pkgutil
import signal
import time
from pathlib import Path

import pytest
from helpers import ROOT
from test_hf_format import checkpoint, model_file
from typer.testing import CliRunner

from graphkit.cli import app
from graphkit.fileio import graphkit_kind

VIT = ROOT / "examples" / "vit_tiny_cifar.py"
TINY = ROOT / "tests" / "recipes" / "tiny-vits.json"
runner = CliRunner()


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt for the test, as in a terminal (a shell without job control
    starts background commands with SIGINT ignored), and the handler is put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def stopped_after(monkeypatch, owner: str, name: str, signum: int, stray: bool = False) -> None:
    """Make ``name`` of ``owner`` (a module or class, by its dotted name; a library's writer, whose
    first argument is self or the tensors, then its target) write as usual, then, with ``stray``,
    leave a temporary file of its own beside its target as safetensors does while it saves, and
    then send ``signum`` to this process."""
    owner = pkgutil.resolve_name(owner)
    real = getattr(owner, name)

    def writes_then_stops(*args, **kwargs):
        real(*args, **kwargs)
        if stray:
            target = Path(args[1] if len(args) > 1 else kwargs["filename"])
            (target.parent / ".tmpX1y2Z3").write_bytes(b"a library's temporary file")
        os.kill(os.getpid(), signum)
        time.sleep(10)  # the handler raises in here
        raise AssertionError(f"{signal.Signals(signum).name} did not stop the command")

    monkeypatch.setattr(owner, name, writes_then_stops)


def everything(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` (hidden ones too), with a file's bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def stopped(args: list, signum: int, code: int | None = 128 + signal.SIGTERM) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code != 0 if signum == signal.SIGINT else result.exit_code == code, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_convert_and_predict_stopped_mid_save_keep_the_previous_weights(signum, tmp_path, monkeypatch, ctrl_c_raises):
    convert = ["convert", VIT, "-a", "gqa", "-k", "2", "--out", tmp_path / "gqa.safetensors"]
    predict = ["predict", VIT, "--out", tmp_path / "predicted.safetensors"]
    for args in (convert, predict):
        assert runner.invoke(app, [str(a) for a in args]).exit_code == 0
    before = everything(tmp_path)
    stopped_after(monkeypatch, "safetensors.torch", "save_file", signum, stray=True)
    for args in (convert, predict):
        stopped(args, signum)
        assert everything(tmp_path) == before
    assert graphkit_kind(tmp_path / "gqa.safetensors") == "converted-weights"


@pytest.mark.slow
def test_convert_to_a_model_folder_stopped_mid_save_leaves_nothing(tmp_path, monkeypatch):
    checkpoint(tmp_path, "llama", kv_heads=4)
    source = model_file(tmp_path, tmp_path / "source")
    before = everything(tmp_path)
    stopped_after(monkeypatch, "transformers:PreTrainedModel", "save_pretrained", signal.SIGTERM)
    stopped(["convert", source, "-a", "gqa", "-k", "2", "--format", "hf", "--out", tmp_path / "out"], signal.SIGTERM)
    assert everything(tmp_path) == before


@pytest.mark.parametrize(
    "args, owner, name",
    [
        (["trace", VIT, "--out", "graph.json"], "pathlib:Path", "write_text"),
        (["trace", VIT, "--format", "text", "--out", "graph.txt"], "pathlib:Path", "write_text"),
        (["draw", VIT, "--out", "graph.svg"], "pathlib:Path", "write_text"),
        (["draw", VIT, "--out", "graph.png"], "matplotlib.figure:Figure", "savefig"),
        (["generate", TINY, "--num", "4", "--out", "dataset"], "pyarrow.parquet", "write_table"),
    ],
    ids=["trace json", "trace text", "draw svg", "draw png", "generate"],
)
def test_a_command_stopped_by_sigterm_mid_write_leaves_nothing(args, owner, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stopped_after(monkeypatch, owner, name, signal.SIGTERM)
    stopped(args, signal.SIGTERM)
    left = everything(tmp_path)
    if args[0] == "generate":  # a dataset folder is made first and kept for --resume: only no debris
        assert not [p for p in left if Path(p).name.startswith(".") and p.endswith(".tmp")]
    else:
        assert left == {}

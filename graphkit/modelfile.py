"""Load a user's MODEL.py: a Python file that defines ``model`` (an nn.Module) or a
zero-argument ``build_model()``, and optionally ``example_inputs()``.

Every way this can go wrong becomes a one-line :class:`~graphkit.ModelFileError` that names
the file and, where known, the line.
"""

from __future__ import annotations

import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from graphkit.errors import ModelFileError


@dataclass
class ModelFile:
    """A loaded model: what a MODEL.py provides, or what a model source of
    :func:`graphkit.sources.load_model_source` builds. ``path`` is the file or folder it was read
    from (None for a ``timm:`` or ``hf:`` spec), ``source`` the argument as the user gave it, and
    ``example_inputs`` None where the tracer is to guess them."""

    path: Path | None
    model: nn.Module
    example_inputs: Any = None
    source: str = ""

    @property
    def name(self) -> str:
        """A short name for messages: the file or folder's name, else the spec."""
        return self.path.name if self.path is not None else self.source


def load_model_file(path: str | Path) -> ModelFile:
    """Run ``path`` and return its model (and example inputs, if it defines ``example_inputs()``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        source = path.read_text()
        code = compile(source, str(path), "exec")
    except SyntaxError as e:
        raise ModelFileError(f"{path}:{e.lineno}: syntax error: {e.msg}") from e
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot read: {e}") from e
    module = types.ModuleType(f"graphkit_model_{path.stem}")
    module.__file__ = str(path.resolve())
    sys.path.insert(0, str(path.resolve().parent))
    try:
        _call(lambda: exec(code, module.__dict__), path, "running the file")
    finally:
        sys.path.remove(str(path.resolve().parent))
    namespace = module.__dict__
    if isinstance(namespace.get("model"), nn.Module):  # a defined model wins over any build_model in scope
        model = namespace["model"]
    elif callable(namespace.get("build_model")):
        model = _call(namespace["build_model"], path, "build_model()")
    elif "model" in namespace:
        model = namespace["model"]
    else:
        raise ModelFileError(f"{path}: defines neither `model` (an nn.Module) nor a `build_model()` function")
    if not isinstance(model, nn.Module):
        raise ModelFileError(f"{path}: the model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = None
    if callable(namespace.get("example_inputs")):
        inputs = _call(namespace["example_inputs"], path, "example_inputs()")
    return ModelFile(path=path, model=model, example_inputs=inputs, source=str(path))


def _call(fn: Callable[[], Any], path: Path, what: str) -> Any:
    """``fn()``, with any exception, and a ``sys.exit()`` (which would end graphkit silently with
    the file's exit code), turned into a ModelFileError naming the file's line; Ctrl-C still
    interrupts."""
    try:
        return fn()
    except (Exception, SystemExit) as e:
        line = next(
            (
                f.lineno
                for f in reversed(traceback.extract_tb(e.__traceback__))
                if Path(f.filename) == path.resolve() or f.filename == str(path)
            ),
            None,
        )
        where = f"{path}:{line}" if line else str(path)
        if isinstance(e, SystemExit):
            raise ModelFileError(f"{where}: {what} called sys.exit({'' if e.code is None else repr(e.code)})") from e
        message = " ".join(str(e).split()) or "(no message)"
        raise ModelFileError(f"{where}: {what} raised {type(e).__name__}: {message}") from e

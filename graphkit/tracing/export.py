"""Running ``torch.export`` quietly, and turning its failures into one readable line."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from graphkit.compat import fx_flag
from graphkit.errors import NeedsValuesError, TraceError


def export_program(model: nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` (non-strict), quiet on success; TraceError with one line on failure."""
    # On failure torch logs the failing op and prints the partial graph to stderr by itself; the
    # exception already carries both, so the terminal gets only the one line the caller prints.
    # On success whatever the forward wrote to stderr is passed on.
    # Per-node source stack traces cost ~15% of an export and graphkit never reads them.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    # The flag is private: where this torch lacks it, fx_flag skips it and export is just slower.
    captured = io.StringIO()
    try:
        # without gradients, a forward's own ``torch.no_grad()`` blocks (DeepSeek-style indexers,
        # HRM's recurrence) are inlined instead of exported as wrap_with_set_grad_enabled calls
        with (
            fx_flag("do_not_emit_stack_traces", True),
            warnings.catch_warnings(),
            contextlib.redirect_stderr(captured),
            torch.no_grad(),
        ):
            warnings.simplefilter("ignore")
            program = torch.export.export(model, args, kwargs, strict=False)
    except Exception as e:  # torch.export raises many types; all become one readable line
        error = NeedsValuesError if _mixes_meta(e) else TraceError
        raise error(describe_failure(e, model)) from e
    finally:
        logging.disable(previous)
    sys.stderr.write(captured.getvalue())
    return program


def _mixes_meta(error: BaseException | None) -> bool:
    """Whether an export failed because the forward made a tensor on another device than the
    model's meta weights (XLNet builds its relative positions on the CPU): on the CPU it would run."""
    while error is not None:
        if "DeviceMismatch" in type(error).__name__ and "meta" in str(error):
            return True
        error = error.__cause__ if error.__cause__ is not error else None
    return False


def describe_failure(error: BaseException, model: nn.Module) -> str:
    """One line for an exception ``model``'s forward raised (under torch.export or run eagerly):
    what failed, in which module of ``model``, at which line of the user's code."""
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    paths = {id(m): p for p, m in model.named_modules()}
    where, line = None, None
    library = (str(Path(torch.__file__).parent.parent), str(Path(__file__).parent.parent))  # and graphkit
    for exc in (error, root):
        tb = exc.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and id(owner) in paths:
                where = paths[id(owner)]
            filename = tb.tb_frame.f_code.co_filename
            if not filename.startswith(library) and not filename.startswith("<"):
                line = f"{Path(filename).name}:{tb.tb_lineno}"
            tb = tb.tb_next
    text = " ".join(str(root).strip().split("\n")[0].split())[:300] or type(root).__name__
    name = type(model).__name__
    at = ""
    if where:  # '' is the model itself
        at = f" in module '{where}' ({type(model.get_submodule(where)).__name__})"
    elif where is not None:
        at = f" in {name}.forward"
    if line:
        at += f" at {line}"
    kind = type(root).__name__
    if "data-dependent" in str(root) or "DataDependent" in kind:
        return f"cannot export {name}: data-dependent control flow{at}: {text}"
    return f"{name}.forward raised {kind}{at}: {text}"

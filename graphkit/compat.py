"""Every private torch or transformers API graphkit touches, guarded in one place.

Private flags and helpers move between releases (``torch.fx.config.do_not_emit_stack_traces``
does not exist on torch 2.11, for one). Each guard here degrades instead of crashing: a missing
speed-up flag is skipped, a missing helper falls back to the public, slower path. Tests remove
each of them and check that tracing and model building still work.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any


def _fx_config() -> Any:
    """``torch.fx.config``, or None where this torch has no such module."""
    try:
        return importlib.import_module("torch.fx.config")
    except ImportError:
        return None


@contextlib.contextmanager
def fx_flag(name: str, value: Any) -> Iterator[bool]:
    """Set ``torch.fx.config.<name>`` to ``value`` for the block and restore it afterwards.
    Yields whether the flag exists; when this torch lacks it nothing is set."""
    config = _fx_config()
    if config is None or not hasattr(config, name):
        yield False
        return
    previous = getattr(config, name)
    setattr(config, name, value)
    try:
        yield True
    finally:
        setattr(config, name, previous)


def aten_name(target: object) -> str:
    """Short ATen name of an FX call target: ``aten.view.default`` -> ``view``.

    Reads the op's schema where the OpOverload exposes it (``_schema``, private), else parses
    the public ``str()`` form ``aten.view.default``; plain Python callables give their name."""
    schema = getattr(target, "_schema", None)
    name = getattr(schema, "name", None)
    if isinstance(name, str):
        return name.split("::")[-1]
    qualified = getattr(target, "_qualified_op_name", None)  # an OpOverloadPacket
    if isinstance(qualified, str):
        return qualified.split("::")[-1]
    text = str(target)
    if text.startswith(("aten.", "prims.")) and text.count(".") >= 1:
        return text.split(".")[1]
    return getattr(target, "__name__", text)


def op_schema(target: object) -> Any:
    """The ATen schema of an FX call target (``OpOverload._schema``, private): argument names,
    defaults and alias annotations (which arguments an op views or writes). None where the
    target has none (a Python callable) or this torch no longer exposes it: the tracer then
    reads no views or writes through views, and keeps the FX edges it has."""
    schema = getattr(target, "_schema", None)
    return schema if hasattr(schema, "arguments") and hasattr(schema, "returns") else None


def call_arguments(node: Any) -> dict[str, Any]:
    """An FX call's arguments by their schema names, defaults filled in (``attn_mask``,
    ``is_causal`` of an SDPA call however it was spelled); empty where the target has no schema."""
    schema = op_schema(node.target)
    if schema is None:
        return {}
    named = {}
    for i, argument in enumerate(schema.arguments):
        if i < len(node.args) and not argument.kwarg_only:
            named[argument.name] = node.args[i]
        elif argument.name in node.kwargs:
            named[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
    return named


def flatten_inputs(inputs: tuple[tuple, dict] | None, program: Any) -> list[Any] | None:
    """The leaves of ``(args, kwargs)`` in the order of the exported program's user inputs
    (``torch.fx._pytree.tree_flatten_spec`` over its ``call_spec.in_spec``, both private), or
    None where either is missing or the inputs do not fit it: the tracer then reads no input's
    values."""
    if inputs is None:
        return None
    try:
        from torch.fx._pytree import tree_flatten_spec  # noqa: PLC0415 (private, guarded; compat loads without torch)

        return list(tree_flatten_spec(inputs, program.call_spec.in_spec))
    except Exception:  # an API that moved, or inputs another structure than the program's
        return None


def skip_weight_init() -> contextlib.AbstractContextManager:
    """transformers' ``no_init_weights`` (``transformers.initialization`` since v5,
    ``transformers.modeling_utils`` before): models are built without running their weight
    initialisation. Where neither exists, a no-op: weights are initialised (slower, same model)."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            return importlib.import_module(module).no_init_weights()
        except (ImportError, AttributeError):
            continue
    return contextlib.nullcontext()


def transformers_buffer_init(model: Any) -> Callable[[Any], None] | None:
    """How transformers fills the buffers of one module of ``model`` (a ``PreTrainedModel``) that
    ``from_pretrained`` moved off the meta device (rotary ``inv_freq`` from the config's
    ``rope_init_fn``, among others): the model's ``_init_weights(module)`` (private), with
    ``torch.nn.init`` guarded (``transformers.initialization.guard_torch_init_functions``) and the
    module's parameters flagged ``_is_hf_initialized`` as loaded weights are, so that only its
    buffers are written. None where ``model`` is no PreTrainedModel or this transformers lacks
    either: its buffers then count as ones no library recomputes."""
    modeling = sys.modules.get("transformers.modeling_utils")  # loaded wherever a PreTrainedModel exists
    if modeling is None or not isinstance(model, modeling.PreTrainedModel):
        return None
    init_weights = getattr(model, "_init_weights", None)
    try:
        guard = importlib.import_module("transformers.initialization").guard_torch_init_functions
    except (ImportError, AttributeError):
        return None
    if not callable(init_weights):
        return None

    def fill_buffers(module: Any) -> None:
        flagged = [p for p in module.parameters() if not getattr(p, "_is_hf_initialized", False)]
        for param in flagged:
            param._is_hf_initialized = True
        try:
            with guard():
                init_weights(module)
        finally:
            for param in flagged:
                del param._is_hf_initialized

    return fill_buffers


def pyg_data() -> Any:
    """``torch_geometric.data``, imported without the ``torch.jit.script`` deprecation warning that
    PyG's import triggers on recent torch (it scripts helpers at import time): otherwise the
    first line a user sees from ``to_pyg()`` is a warning about code that is not theirs. torch
    2.11 warns with a DeprecationWarning, later releases with a FutureWarning: both are hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        return importlib.import_module("torch_geometric.data")


def is_usage_error(error: BaseException) -> bool:
    """Whether ``error`` is a malformed command line as typer's parser reports it (a value of the
    wrong type or out of the choices, an unknown option or command, a missing argument): click's
    ``UsageError``, which typer vendors as the private ``typer._click`` since 0.2x. The class is
    found from the public ``typer.BadParameter``, its subclass, so no private module is named.
    ``NoArgsIsHelpError``, a usage error by class that only signals "print the help", is not one
    (typer itself tells it by name)."""
    import typer  # noqa: PLC0415 (compat loads without the CLI's libraries)

    usage = next((c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"), typer.BadParameter)
    return isinstance(error, usage) and type(error).__name__ != "NoArgsIsHelpError"


__all__ = [
    "fx_flag",
    "aten_name",
    "op_schema",
    "call_arguments",
    "flatten_inputs",
    "skip_weight_init",
    "transformers_buffer_init",
    "pyg_data",
    "is_usage_error",
]

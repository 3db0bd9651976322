"""Model -> ArchGraph: the entry point of the tracer.

Why torch.export: it runs the real ``forward`` (so whatever timm, transformers or a user wrote is
what gets traced), works on fake tensors (a model on the ``meta`` device traces without
allocating a weight), records the module path of every op (``nn_module_stack``) and which graph
inputs are parameters (``graph_signature``). The GHN-2/3 way of walking autograd ``grad_fn``s
needs real weights and a forward pass, and loses ops that have no backward node (SDPA).

:mod:`graphkit.export_graph` turns the exported ATen program into architecture nodes and
:mod:`graphkit.folding` exports only two blocks of a repeated stack; docs/tracer.md explains the
rules.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.compat import fx_flag
from graphkit.errors import TraceError
from graphkit.export_graph import graph_from_export
from graphkit.folding import repeated_blocks, signature, truncated, unfold
from graphkit.graph import ArchGraph, graph_meta

ExampleInputs = Any  # a tensor, a tuple of positional args, a dict of kwargs, or (args, kwargs)


def trace(model: nn.Module, example_inputs: ExampleInputs = None, *, fold_repeats: bool = True,
          cache: dict | None = None) -> ArchGraph:
    """Trace ``model`` into an :class:`ArchGraph`.

    ``model`` may live on any device, ``meta`` included (no weights needed). ``example_inputs``
    is built from the model when omitted (images of its image size, or a short sequence of
    token ids with ``use_cache=False``). Raises :class:`TraceError` with a one-line reason when
    the model cannot be exported, and GraphError if the result fails ``validate()``.

    ``cache`` (a dict the caller keeps) reuses exports between models whose exported part has
    the same structure: module types, parameter shapes, scalar attributes and input shapes, so
    with folding, models that differ only in depth export once. It assumes the forward depends on
    nothing else (true for graphkit's families; a dataset generator uses it).
    """
    if not isinstance(model, nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(model).__name__}")
    args, kwargs = _normalise_inputs(model, example_inputs)
    was_training = model.training
    model.eval()
    try:
        graph = None
        folds = repeated_blocks(model) if fold_repeats else []
        if folds:
            with truncated(model, folds):
                graph = _traced(model, args, kwargs, cache, folds)
            for path, length in folds:
                graph = graph and unfold(graph, path, length)
        if graph is None:
            graph = _traced(model, args, kwargs, cache, [])
    finally:
        model.train(was_training)
    params = dict(model.named_parameters())
    graph.meta = graph_meta(
        family=_family(model),
        model_class=f"{type(model).__module__}.{type(model).__qualname__}",
        num_params=sum(p.numel() for p in params.values()),
        input_shapes=[list(t.shape) for t in _tensors((args, kwargs))],
    )
    graph.validate({k: tuple(p.shape) for k, p in params.items()})
    return graph


def _traced(model: nn.Module, args: tuple, kwargs: dict, cache: dict | None, folds: list) -> ArchGraph:
    """Export and build, or take the graph an identical structure gave before."""
    key = None
    if cache is not None:
        shapes = tuple((tuple(t.shape), t.dtype) for t in _tensors((args, kwargs)))
        key = (type(model), signature(model), shapes, tuple(p for p, _ in folds))
        if key in cache:
            return cache[key]
    graph = graph_from_export(model, _export(model, args, kwargs))
    if key is not None:
        cache[key] = graph
    return graph


# ---------------------------------------------------------------------------------------------
# example inputs

def example_inputs_for(model: nn.Module) -> tuple[tuple, dict]:
    """Inputs to trace ``model`` with: ``(args, kwargs)`` on the model's device.

    Image models (timm ``patch_embed.img_size``, HF ``config.image_size``, timm
    ``pretrained_cfg['input_size']``) get a batch of two images; models with a
    ``config.vocab_size`` get two sequences of token ids (``use_cache=False`` when accepted);
    hand-written language models whose first module is an ``nn.Embedding`` (nanoGPT) get token
    ids below its ``num_embeddings``, as long as every position table and rotary cache allows.
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    config = getattr(model, "config", None)
    image = _image_size(model)
    if image is not None:
        return (torch.zeros(2, *image, device=device),), {}
    if config is not None and getattr(config, "vocab_size", None):
        limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None) or 8
        kwargs: dict[str, Any] = {"input_ids": torch.zeros(2, max(2, min(8, int(limit))), dtype=torch.long, device=device)}
        if "use_cache" in inspect.signature(model.forward).parameters:
            kwargs["use_cache"] = False
        return (), kwargs
    length = _token_length(model)
    if length is not None:
        return (torch.zeros(2, length, dtype=torch.long, device=device),), {}
    raise TraceError(
        f"cannot guess example inputs for {type(model).__name__}: it is neither an image model "
        "(no img_size / image_size) nor a language model (no config.vocab_size, and its first module "
        "is not an nn.Embedding); pass example_inputs (or define example_inputs() in MODEL.py)"
    )


#: buffer names of precomputed rotary tables, whose first dimension bounds the sequence length
_ROTARY_BUFFER = ("cos", "sin", "freq", "rope", "rotary")


def _token_length(model: nn.Module) -> int | None:
    """A sequence length for token-id inputs when ``model``'s first module holding parameters is
    an ``nn.Embedding`` (a hand-written LM such as nanoGPT), else None: at most 8, and no longer
    than any other embedding (a position table), any rotary buffer's first dimension or a
    ``config.block_size`` (nanoGPT asserts it)."""
    first = next((m for m in model.modules() if any(True for _ in m.parameters(recurse=False))), None)
    if not isinstance(first, nn.Embedding):
        return None
    limits = [8]
    limits += [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding) and m is not first]
    limits += [b.shape[0] for name, b in model.named_buffers()
               if b.dim() >= 1 and any(key in name.rsplit(".", 1)[-1].lower() for key in _ROTARY_BUFFER)]
    block = getattr(getattr(model, "config", None), "block_size", None)
    if isinstance(block, int):
        limits.append(block)
    return max(1, min(limits))


def _image_size(model: nn.Module) -> tuple[int, int, int] | None:
    patch = getattr(model, "patch_embed", None)
    if patch is not None and getattr(patch, "img_size", None) is not None:
        proj = getattr(patch, "proj", None)
        channels = getattr(proj, "in_channels", 3)
        return (int(channels), *(int(s) for s in patch.img_size))
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "image_size", None):
        size = config.image_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return (int(getattr(config, "num_channels", 3)), *size)
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, Mapping) and cfg.get("input_size"):
        return tuple(int(s) for s in cfg["input_size"])  # type: ignore[return-value]
    return None


def _normalise_inputs(model: nn.Module, example_inputs: ExampleInputs) -> tuple[tuple, dict]:
    if example_inputs is None:
        return example_inputs_for(model)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if (isinstance(example_inputs, tuple) and len(example_inputs) == 2
            and isinstance(example_inputs[0], (tuple, list)) and isinstance(example_inputs[1], Mapping)):
        return tuple(example_inputs[0]), dict(example_inputs[1])
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TraceError(
        f"example_inputs must be a tensor, a tuple of args, a dict of kwargs or (args, kwargs); got {type(example_inputs).__name__}"
    )


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)


# ---------------------------------------------------------------------------------------------
# export and its failures

def _export(model: nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    # On failure torch logs the failing op and prints the partial graph to stderr by itself; the
    # exception already carries both, so the terminal gets only the one line the caller prints.
    # On success whatever the forward wrote to stderr is passed on.
    # Per-node source stack traces cost ~15% of an export and graphkit never reads them.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    # The flag is private: where this torch lacks it, fx_flag skips it and export is just slower.
    captured = io.StringIO()
    try:
        with fx_flag("do_not_emit_stack_traces", True), warnings.catch_warnings(), contextlib.redirect_stderr(captured):
            warnings.simplefilter("ignore")
            program = torch.export.export(model, args, kwargs, strict=False)
    except Exception as e:  # torch.export raises many types; all become one readable line
        raise TraceError(_describe_failure(e, model)) from e
    finally:
        logging.disable(previous)
    sys.stderr.write(captured.getvalue())
    return program


def _describe_failure(error: BaseException, model: nn.Module) -> str:
    """One line: what failed, in which module of ``model``, at which line of the user's code."""
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    paths = {id(m): p for p, m in model.named_modules()}
    where, line = None, None
    library = (str(Path(torch.__file__).parent.parent), str(Path(__file__).parent))
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


def _family(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None):
        return str(config.model_type)
    module = type(model).__module__
    if module.startswith("timm."):
        base = module.rsplit(".", 1)[-1]
        return {"vision_transformer": "vit", "deit": "vit"}.get(base, base)
    return "custom"

"""Model -> ArchGraph: :func:`trace`, the tracer's entry point.

Why torch.export: it runs the real ``forward`` (so whatever timm, transformers or a user wrote is
what gets traced), works on fake tensors (a model on the ``meta`` device traces without
allocating a weight), records the module path of every op (``nn_module_stack``) and which graph
inputs are parameters (``graph_signature``). The GHN-2/3 way of walking autograd ``grad_fn``s
needs real weights and a forward pass, and loses ops that have no backward node (SDPA).
"""

from __future__ import annotations

from torch import nn

from graphkit.errors import TraceError
from graphkit.graph import ArchGraph, graph_meta
from graphkit.tracing.builder import graph_from_export
from graphkit.tracing.export import export_program
from graphkit.tracing.folding import repeated_blocks, signature, truncated, unfold
from graphkit.tracing.inputs import ExampleInputs, normalise_inputs, tensors_of


def trace(
    model: nn.Module, example_inputs: ExampleInputs = None, *, fold_repeats: bool = True, cache: dict | None = None
) -> ArchGraph:
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
    args, kwargs = normalise_inputs(model, example_inputs)
    was_training = model.training
    model.eval()
    try:
        graph = None
        folds = repeated_blocks(model) if fold_repeats else []
        if folds:
            try:
                with truncated(model, folds):
                    graph = _traced(model, args, kwargs, cache, folds)
            except TraceError:  # a forward that pairs the stack with another list (zip(blocks, norms)): no fold
                graph = None
            for path, length, start in folds:
                graph = graph and unfold(graph, path, length, start)
        if graph is None:
            graph = _traced(model, args, kwargs, cache, [])
    finally:
        model.train(was_training)
    params = dict(model.named_parameters())
    graph.meta = graph_meta(
        family=_family(model),
        model_class=f"{type(model).__module__}.{type(model).__qualname__}",
        num_params=sum(p.numel() for p in params.values()),
        input_shapes=[list(t.shape) for t in tensors_of((args, kwargs))],
    )
    graph.validate({k: tuple(p.shape) for k, p in params.items()})
    return graph


def _traced(model: nn.Module, args: tuple, kwargs: dict, cache: dict | None, folds: list) -> ArchGraph:
    """Export and build, or take the graph an identical structure gave before."""
    key = None
    if cache is not None:
        shapes = tuple((tuple(t.shape), t.dtype) for t in tensors_of((args, kwargs)))
        key = (type(model), signature(model), shapes, tuple((p, start) for p, _, start in folds))
        if key in cache:
            return cache[key]
    graph = graph_from_export(model, export_program(model, args, kwargs), (args, kwargs))
    if cache is not None and key is not None:
        cache[key] = graph
    return graph


def _family(model: nn.Module) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type:
        return str(model_type)
    module = type(model).__module__
    if module.startswith("timm."):
        base = module.rsplit(".", 1)[-1]
        return {"vision_transformer": "vit", "deit": "vit"}.get(base, base)
    return "custom"

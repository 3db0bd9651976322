"""Model -> ArchGraph: :func:`trace`, the tracer's entry point.

Why torch.export: it runs the real ``forward`` (so whatever timm, transformers or a user wrote is
what gets traced), works on fake tensors (a model on the ``meta`` device traces without
allocating a weight), records the module path of every op (``nn_module_stack``) and which graph
inputs are parameters (``graph_signature``). The GHN-2/3 way of walking autograd ``grad_fn``s
needs real weights and a forward pass, and loses ops that have no backward node (SDPA).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from graphkit.errors import TraceError
from graphkit.graph import ArchGraph, graph_meta, without_block_indices
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
    if not any(p.is_meta for p in params.values()):  # on meta its init is unknown: no record, not an empty one
        graph.meta["init"] = init_constants(model)
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


def init_constants(model: nn.Module) -> dict[str, float]:
    """The 1-D parameters that ``model`` holds as one constant, that constant by their name without
    block indices, where every block agrees: ``model.layers.input_layernorm.weight``: 0.0 in a
    Gemma (its RMSNorm scales by ``1 + w``), ``mlp.suv_gate``: 1.0 in a Dory.

    Why: a hypernetwork decodes a 1-D parameter around the value its kind starts at by convention
    (a normalisation's gain at 1, anything else at 0: :func:`graphkit.ghn.encoding.activate`). A
    model whose constructor says otherwise was silenced by that convention: Zaya's and Dory's
    gains at 1, Inkling's embedding norm and Mamba's gated norm, decoded near 0, made every output
    the same (docs/experiments.md, "One-dimensional parameters"). With
    :attr:`~graphkit.ghn.config.LoGAHConfig.init_anchors` they are decoded around these values instead.
    Read from the values the model holds: a freshly built model gives its constructor's; random
    parameters and trained ones give none. :func:`trace` records them as ``graph.meta["init"]``
    for a model with weights; a model on the meta device has no values to read, and its graph
    (a dataset's: generators build on meta) has no record until one is added from the model built
    with weights (:func:`graphkit.ghn.pool.with_init_constants`)."""
    values: dict[str, float | None] = {}
    for name, param in model.named_parameters():
        if param.dim() != 1 or param.is_meta or not param.numel() or not param.is_floating_point():
            continue
        low, high = (float(v) for v in torch.aminmax(param.detach()))
        value = low if low == high and math.isfinite(low) else None
        key = without_block_indices(name)
        values[key] = value if values.get(key, value) == value else None
    return {key: value for key, value in sorted(values.items()) if value is not None}

"""Model -> ArchGraph: :func:`trace`, the tracer's entry point.

Why torch.export: it runs the real ``forward`` (so whatever timm, transformers or a user wrote is
what gets traced), works on fake tensors (a model on the ``meta`` device traces without
allocating a weight), records the module path of every op (``nn_module_stack``) and which graph
inputs are parameters (``graph_signature``). The GHN-2/3 way of walking autograd ``grad_fn``s
needs real weights and a forward pass, and loses ops that have no backward node (SDPA).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from graphkit.errors import TraceError, UnusedParameterError
from graphkit.graph import ArchGraph, graph_meta, without_block_indices
from graphkit.tracing.builder import graph_from_export, is_spare
from graphkit.tracing.export import export_program
from graphkit.tracing.folding import repeated_blocks, signature, truncated, unfold
from graphkit.tracing.inputs import (
    ExampleInputs,
    branch_inputs,
    evaluated,
    example_inputs_for,
    logits_of,
    normalise_inputs,
    tensors_of,
    text_config,
)


def trace(
    model: nn.Module, example_inputs: ExampleInputs = None, *, fold_repeats: bool = True, cache: dict | None = None
) -> ArchGraph:
    """Trace ``model`` into an :class:`ArchGraph`.

    ``model`` may live on any device, ``meta`` included (no weights needed). ``example_inputs``
    is built from the model when omitted (images of its image size, or a short sequence of
    token ids with ``use_cache=False``). Raises :class:`TraceError` with a one-line reason when
    the model cannot be exported, and GraphError if the result fails ``validate()``. A
    parameter the forward never reads is refused (UnusedParameterError) unless it is spare
    (:func:`~graphkit.tracing.builder.is_spare`, a masked-image-modelling token, XLNet's mask embedding). Those, and the
    parameters the forward reads only into values it discards (CLIP's image classifier pools
    before its ``post_layernorm``), are recorded as ``graph.meta["spare"]``, name -> shape, and
    owned by no node.

    ``cache`` (a dict the caller keeps) reuses exports between models whose exported part has
    the same structure: module types, parameter shapes, scalar attributes and input shapes, so
    with folding, models that differ only in depth export once. It assumes the forward depends on
    nothing else (true for graphkit's families; a dataset generator uses it).

    Guessed inputs that leave a parameter unread are tried once more with inputs that take more
    of the forward (:func:`~graphkit.tracing.inputs.branch_inputs`: a longer sequence, encoder
    states), so that TrOCR's decoder and DeepSeek-V4 trace from the CLI as the zoo traces them;
    given inputs are traced as they are.
    """
    if not isinstance(model, nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if example_inputs is not None:
        return _trace_with(model, example_inputs, fold_repeats, cache)
    try:
        return _trace_with(model, None, fold_repeats, cache)
    except UnusedParameterError:
        inputs = branch_inputs(model)
        if inputs is None:
            raise
    return _trace_with(model, inputs, fold_repeats, cache)


def _trace_with(model: nn.Module, example_inputs: ExampleInputs, fold_repeats: bool, cache: dict | None) -> ArchGraph:
    """:func:`trace` with these inputs (None: guessed), once."""
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
    discarded = set(graph.meta.get("discarded", ()))
    # a new graph, not the builder's: an export cache may hand the same one to the next model
    graph = ArchGraph(
        nodes=graph.nodes,
        edges=graph.edges,
        meta=graph_meta(
            family=_family(model),
            model_class=f"{type(model).__module__}.{type(model).__qualname__}",
            num_params=sum(p.numel() for p in params.values()),
            input_shapes=[list(t.shape) for t in tensors_of((args, kwargs))],
        ),
    )
    owned = {name for node in graph.nodes for name in node.params}
    spare = {
        name: list(p.shape) for name, p in params.items() if name not in owned and (is_spare(name) or name in discarded)
    }
    if spare:  # cannot change the output: recorded, so that what predicts or compiles the graph knows
        graph.meta["spare"] = spare
    if not any(p.is_meta for p in params.values()):  # on meta its init is unknown: no record, not an empty one
        graph.meta.update(init_record(model, graph, example_inputs))
    graph.validate({k: tuple(p.shape) for k, p in params.items() if k not in spare})
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


def init_record(model: nn.Module, graph: ArchGraph, example_inputs: ExampleInputs = None) -> dict[str, Any]:
    """What ``model``'s constructor fixes that a hypernetwork decodes around, as ``graph.meta``
    records it: ``init``, its :func:`init_constants`, and ``logit_scale``, its
    :func:`logit_scale` where that is not 1. ``model`` holds weights (its init, for the constants)."""
    record: dict[str, Any] = {"init": init_constants(model)}
    scale = logit_scale(model, graph, example_inputs)
    if scale is not None and abs(scale - 1.0) > SCALE_TOLERANCE:
        record["logit_scale"] = scale
    return record


#: relative error under which a measured scale is a constant one, and 1 is no scale
SCALE_TOLERANCE = 1e-3


def logit_scale(model: nn.Module, graph: ArchGraph, example_inputs: ExampleInputs = None) -> float | None:
    """The constant by which ``model`` multiplies what its head's input layer computes on the way
    to its logits: Cohere's ``logit_scale`` (1/16, on the head's output), Inkling's
    1 / ``logits_mup_width_multiplier`` (1/24, on the head's input), 1 for most models. None where
    it is not one constant (a softcap at large logits, a head without one input layer of its own).

    Why: the tracer folds scaling by a constant (it is no node), so a graph cannot show it, and a
    hypernetwork that learned logits at scale 1 predicts Cohere's 16 times too small: near-uniform,
    5.1 nats where the unigram loss is 3.2 (docs/experiments.md, "Logit scales"). Measured on one
    forward pass of ``example_inputs`` (None: :func:`~graphkit.tracing.inputs.example_inputs_for`
    with distinct token ids: zeros may all be padding, which some models embed as zeros), by hooks
    on the head and its input layer, rather than read from configs that each name it differently."""
    source = graph.head_input()
    if source is None or not graph.nodes[source].params:
        return None
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):  # no values to measure on
        return None
    try:
        head = model.get_submodule(next(node.module for node in graph.nodes if node.op == "head"))
        layer = model.get_submodule(graph.nodes[source].module)
    except AttributeError:  # a node whose module path the model does not have (a hand-built graph)
        return None
    seen: dict[str, list[Any]] = {"layer": [], "head in": [], "head out": []}

    def read_layer(_module: nn.Module, _args: tuple, out: Any) -> None:
        seen["layer"].append(out)

    def read_head(_module: nn.Module, args: tuple, out: Any) -> None:
        seen["head in"].append(args[0] if args else None)
        seen["head out"].append(out)

    hooks = [layer.register_forward_hook(read_layer), head.register_forward_hook(read_head)]
    inputs = normalise_inputs(model, example_inputs) if example_inputs is not None else _distinct_tokens(model)
    try:
        output = evaluated(model, inputs)
    finally:
        for hook in hooks:
            hook.remove()
    logits = logits_of(output)
    if any(len(values) != 1 or not isinstance(values[0], torch.Tensor) for values in seen.values()):
        return None
    if not isinstance(logits, torch.Tensor):
        return None
    before = _constant_factor(seen["layer"][0], seen["head in"][0])
    after = _constant_factor(seen["head out"][0], logits)
    return None if before is None or after is None else before * after


def _distinct_tokens(model: nn.Module) -> tuple[tuple, dict]:
    """:func:`~graphkit.tracing.inputs.example_inputs_for` with its token ids (its only integer
    tensors) counting up through the first ids of the vocabulary instead of all 0."""
    args, kwargs = example_inputs_for(model)
    vocab = getattr(text_config(getattr(model, "config", None)), "vocab_size", None)
    tables = (m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding))
    size = min(int(vocab or next(tables, 2)), 97)

    def counted(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            return torch.arange(value.numel(), device=value.device).remainder(size).view_as(value).to(value.dtype)
        return value

    return tuple(counted(a) for a in args), {k: counted(v) for k, v in kwargs.items()}


def _constant_factor(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """c with y = c x (least squares, to :data:`SCALE_TOLERANCE` of y), or None."""
    if x.shape != y.shape:
        return None
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    energy = x.dot(x)
    if not (energy > 0 and torch.isfinite(energy)):
        return None
    c = (x.dot(y) / energy).item()
    return c if (y - c * x).norm() <= SCALE_TOLERANCE * y.norm() else None


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

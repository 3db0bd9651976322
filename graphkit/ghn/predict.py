"""Predict a model's parameters with a LoGAH and load them into it."""

from __future__ import annotations

import torch
from torch import nn

from graphkit.errors import GraphkitError
from graphkit.ghn.model import LoGAH
from graphkit.graph import ArchGraph
from graphkit.params import first_non_finite, load_params, memory_shortfall


class PredictError(GraphkitError):
    """The hypernetwork cannot predict this model, or produced unusable parameters."""


def predict(model: nn.Module, ghn: LoGAH | None = None, example_inputs=None, *,
            memory_limit: int | None = None, graph: ArchGraph | None = None) -> dict[str, torch.Tensor]:
    """Trace ``model``, predict every parameter with ``ghn`` (default: the bundled LoGAH-tiny
    of the model's family), check them (no NaN or Inf) and load them into ``model`` (a meta
    model gets real tensors). Returns the predicted parameters by state-dict name.

    Refused with a PredictError, before anything is allocated: a graph with an op the
    hypernetwork was not trained on, or predicted parameters larger than ``memory_limit`` bytes
    (default: the memory available on the hypernetwork's device). ``graph`` skips the trace when
    the caller already holds the model's graph."""
    from graphkit.ghn.checkpoint import bundled_checkpoint, check_graph, load_checkpoint
    from graphkit.trace import trace

    graph = graph if graph is not None else trace(model, example_inputs)
    if ghn is None:
        ghn = load_checkpoint(bundled_checkpoint(graph.meta.get("family")))
    check_graph(ghn, graph)
    device = next(ghn.parameters()).device
    needed = graph.num_params * 4
    limit = memory_shortfall(needed, device, memory_limit)
    if limit is not None:
        raise PredictError(f"{type(model).__name__}: its {graph.num_params:,} predicted parameters need {needed / 1e9:.2f} GB "
                           f"but {limit / 1e9:.2f} GB are available on {device}; free memory or predict on another device")
    with torch.no_grad():
        params = ghn.predict(graph)
    bad = first_non_finite(params)
    if bad is not None:
        raise PredictError(f"the hypernetwork predicted NaN or Inf for {bad!r}; the model was left unchanged")
    load_params(model, params)
    return params


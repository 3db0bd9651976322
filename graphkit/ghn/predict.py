"""Predict a model's parameters with a LoGAH and write them into it, in place.

A model that already holds weights gets the predictions written into its own tensors, one
parameter at a time: peak memory stays near the model's own size whether it was built on the
meta device or with weights (BENCHMARKS.md)."""

from __future__ import annotations

import torch
from torch import nn

from graphkit.errors import GraphkitError
from graphkit.ghn.encoding import targets
from graphkit.ghn.model import LoGAH
from graphkit.graph import ArchGraph
from graphkit.params import available_memory, check_params, first_non_finite, memory_shortfall, replace_parameter, tied_names


class PredictError(GraphkitError):
    """The hypernetwork cannot predict this model, or produced unusable parameters."""


def predict(model: nn.Module, ghn: LoGAH | None = None, example_inputs=None, *,
            memory_limit: int | None = None, graph: ArchGraph | None = None) -> dict[str, torch.Tensor]:
    """Trace ``model``, predict every parameter with ``ghn`` (default: the bundled LoGAH-tiny
    of the model's family) and write the predictions into ``model``: into its own tensors when
    it holds weights, parameter by parameter, with no second copy of the model; into new tensors
    on the hypernetwork's device when it is on the meta device (tied weights stay tied). Returns
    the model's parameters by state-dict name, now holding the predictions.

    Refused before anything is allocated or written, so the model is left unchanged: a graph
    with an op the hypernetwork was not trained on (CheckpointError) or whose parameters are not
    the model's (ParamsError); new tensors and scratch larger than ``memory_limit`` bytes
    (default: the memory available on the hypernetwork's device); predictions that could hold a
    NaN or Inf, which the low-rank decoder proves impossible before its first write (see
    :class:`~graphkit.ghn.model.LowRankDecoding`). ``graph`` skips the trace when the caller
    already holds the model's graph."""
    from graphkit.ghn.checkpoint import bundled_checkpoint, check_graph, load_checkpoint
    from graphkit.trace import trace

    graph = graph if graph is not None else trace(model, example_inputs)
    if ghn is None:
        ghn = load_checkpoint(bundled_checkpoint(graph.meta.get("family")))
    check_graph(ghn, graph)
    device = next(ghn.parameters()).device
    plan = targets(graph, ghn.config.max_slots)
    check_params(model, {t.name: torch.empty(t.shape, device="meta") for t in plan}, source=f"{type(model).__name__}: ")
    destinations = {t.name: model.get_parameter(t.name) for t in plan}
    new = {id(p): p for p in destinations.values() if p.is_meta}.values()
    needed = sum(p.numel() * p.element_size() for p in new) + ghn.decoder.scratch_bytes(plan, destinations)
    limit = memory_shortfall(needed, device, memory_limit)
    if limit is not None:
        raise PredictError(f"{type(model).__name__}: its {graph.num_params:,} predicted parameters need {needed / 1e9:.2f} GB "
                           f"but {limit / 1e9:.2f} GB are available on {device}; free memory or predict on another device")
    decoding = ghn.decoding(graph)
    bad = decoding.first_non_finite()
    if bad is not None:
        raise PredictError(f"the hypernetwork predicted NaN or Inf for {bad!r}; the model was left unchanged")
    written = decoding.write_into(destinations)
    if new:  # swap the new tensors in under every tied name
        canonical = {id(p): name for name, p in model.named_parameters()}
        names = tied_names(model)
        for name, param in destinations.items():
            if param.is_meta:
                replace_parameter(model, canonical[id(param)], written[name], names)
    return {name: model.get_parameter(name).detach() for name in destinations}


__all__ = ["predict", "PredictError", "available_memory", "first_non_finite"]  # the last two now live in graphkit.params

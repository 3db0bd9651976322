"""Predict a model's parameters with a LoGAH and load them into it."""

from __future__ import annotations

import torch
from torch import nn

from graphkit.errors import GraphkitError
from graphkit.ghn.model import LoGAH


class PredictError(GraphkitError):
    """The hypernetwork produced unusable parameters."""


def predict(model: nn.Module, ghn: LoGAH, example_inputs=None) -> dict[str, torch.Tensor]:
    """Trace ``model``, predict every parameter with ``ghn``, check them (no NaN or Inf) and load
    them into ``model`` (a meta model gets real tensors). Returns the predicted parameters by
    state-dict name."""
    from graphkit.compile import load_params
    from graphkit.trace import trace

    graph = trace(model, example_inputs)
    with torch.no_grad():
        params = ghn.predict(graph)
    bad = next((name for name, t in params.items() if not torch.isfinite(t).all()), None)
    if bad is not None:
        raise PredictError(f"the hypernetwork predicted NaN or Inf for {bad!r}; the model was left unchanged")
    load_params(model, params)
    return params

"""Configs, graphs and parameters back into runnable models.

    >>> model = compile(dataset["vits-1k-00042"], params="predicted.safetensors")
    >>> save_params(model, "vit.safetensors", config=dataset["vits-1k-00042"].config)

:func:`compile` builds the model a dataset record, a graph or a config describes, checks that
it traces to the same fingerprint, and loads parameters. Reading, checking and saving parameters
is :mod:`graphkit.params` (re-exported here): :func:`load_params` checks every name and shape
before changing anything, so a bad file never leaves a half-loaded model. Parameters travel as
safetensors; :func:`save_params` stores the model's config in the file's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.families import build_model, config_from_graph, resolve_config
from graphkit.graph import ArchGraph
from graphkit.params import CompileError, LoadReport, Params, ParamsError, load_params, read_params, save_params

def compile(source: Any, params: Params | str | Path | None = None, *, attention: str | None = None,
            kv_heads: int | None = None, device: str | torch.device = "cpu", strict: bool = True) -> nn.Module:
    """A runnable model from a dataset record, an ArchGraph or a family config, on ``device``
    (with the library's initialisation), converted to ``attention`` with ``kv_heads`` K/V heads
    when given (a graph of a converted model brings its own), with ``params`` loaded when given.

    A record or graph must trace back to its own fingerprint; a CompileError says so otherwise.
    """
    from graphkit.datasets.dataset import Record
    from graphkit.trace import trace

    if isinstance(source, Record):
        config, expected = source.config, source["fingerprint"]
    elif isinstance(source, ArchGraph):
        config, expected = config_from_graph(source), source.fingerprint()  # a variant comes with the graph
    elif isinstance(source, Mapping):
        config, expected = resolve_config(source), None
    else:
        raise CompileError(f"compile takes a dataset record, an ArchGraph or a config, got {type(source).__name__}")
    if expected is not None:
        got = trace(build_model(config)).fingerprint()
        if got != expected:
            raise CompileError(f"the model built from {config} traces to fingerprint {got}, not {expected}")
    if attention is not None:
        config = resolve_config({**config, "attention": attention,
                                 "kv_heads": kv_heads if kv_heads is not None else config["kv_heads"]})
    model = build_model(config, device=device)
    if params is not None:
        load_params(model, params, strict=strict)
    return model


__all__ = ["compile", "load_params", "save_params", "read_params", "LoadReport", "CompileError", "ParamsError", "build_model"]

"""Configs, graphs and parameters back into runnable models.

    >>> model = compile_model(dataset["vits-1k-00042"], params="predicted.safetensors")
    >>> save_params(model, "vit.safetensors", config=dataset["vits-1k-00042"].config)

:func:`compile_model` builds the model a dataset record, a graph or a config describes, checks that
it traces to the same fingerprint, and loads parameters. Reading, checking and saving parameters
is :mod:`graphkit.params` (re-exported here): :func:`load_params` checks every name, shape,
dtype and value before changing anything, so a bad file never leaves a half-loaded model.
Parameters travel as safetensors; :func:`save_params` stores the model's config in the file's
metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.attention.core import ATTENTION_VARIANTS
from graphkit.datasets.dataset import Record
from graphkit.families import build_model, config_from_graph, resolve_config
from graphkit.graph import ArchGraph
from graphkit.params import (
    CompileError,
    LoadReport,
    Params,
    ParamsError,
    load_params,
    memory_shortfall,
    read_params,
    save_params,
)
from graphkit.tracing import trace
from graphkit.validation import divisors, is_count


def converted_config(
    config: Mapping[str, Any],
    attention: str | None,
    kv_heads: int | None,
    *,
    names: tuple[str, str] = ("attention", "kv_heads"),
) -> dict[str, Any]:
    """``config`` with its attention converted to ``attention`` with ``kv_heads`` K/V heads
    (default: the config's own), after checking both where they enter: ``attention`` must be a
    variant, ``kv_heads`` a divisor of the heads, and ``kv_heads`` without ``attention`` is
    refused rather than ignored. Errors name the options as ``names`` spells them (the command
    line passes ``--attention``, ``--kv-heads``)."""

    attention_name, kv_name = names
    if attention is None:
        if kv_heads is not None:
            raise CompileError(
                f"{kv_name} {kv_heads} needs {attention_name} ({', '.join(ATTENTION_VARIANTS)}): "
                "K/V heads change only when the attention is converted"
            )
        return dict(config)
    if attention not in ATTENTION_VARIANTS:
        raise CompileError(f"{attention_name} {attention!r}: accepted: {', '.join(ATTENTION_VARIANTS)}")
    heads = config["heads"]
    kv = kv_heads if kv_heads is not None else config.get("kv_heads") or heads
    if not is_count(kv) or kv not in divisors(heads):
        raise CompileError(
            f"{kv_name} {kv}: must divide the {heads} heads; accepted: {', '.join(map(str, divisors(heads)))}"
        )
    return resolve_config({**config, "attention": attention, "kv_heads": kv})


def compile_model(
    source: Any,
    params: Params | str | Path | None = None,
    *,
    attention: str | None = None,
    kv_heads: int | None = None,
    kv_rank: int | None = None,
    rope_dims: int | None = None,
    device: str | torch.device = "cpu",
    strict: bool = True,
    memory_limit: int | None = None,
) -> nn.Module:
    """A runnable model from a dataset record, an ArchGraph or a family config, on ``device``
    (with the library's initialisation), converted to ``attention`` with ``kv_heads`` K/V heads
    when given (a graph of a converted model brings its own), with ``params`` loaded when given.
    ``attention="mla"`` converts to MLA with ``kv_rank`` and ``rope_dims``
    (:func:`graphkit.attention.mla.to_mla`), the structure a file ``graphkit convert -a mla``
    wrote needs: its parameters, loaded over the factored initialisation, bring the rest.

    A record or graph must trace back to its own fingerprint; a CompileError says so otherwise.
    The model is measured on the meta device first: one whose parameters and buffers need more
    than ``memory_limit`` bytes (default: the memory available on ``device``) is refused before
    anything is allocated.
    """

    if isinstance(source, Record):
        config, expected = source.config, source["fingerprint"]
    elif isinstance(source, ArchGraph):
        config, expected = config_from_graph(source), source.fingerprint()  # a variant comes with the graph
    elif isinstance(source, Mapping):
        config, expected = resolve_config(source), None
    else:
        raise CompileError(
            f"compile_model takes a dataset record, an ArchGraph or a config, got {type(source).__name__}"
        )
    mla = attention == "mla"
    if mla and (kv_heads is not None or kv_rank is None):
        raise CompileError("attention mla takes kv_rank (and rope_dims for RoPE models), not kv_heads")
    if not mla and (kv_rank is not None or rope_dims is not None):
        raise CompileError(f"kv_rank and rope_dims apply to attention mla, not {attention}")
    target = config if mla else converted_config(config, attention, kv_heads)
    if expected is not None:
        got = trace(build_model(config)).fingerprint()
        if got != expected:
            raise CompileError(f"the model built from {config} traces to fingerprint {got}, not {expected}")
    device = torch.device(device)
    meta = build_model(target)
    tensors = [*meta.parameters(), *meta.buffers()]
    needed = sum(t.numel() * t.element_size() for t in tensors)
    available = memory_shortfall(needed, device, memory_limit)
    if available is not None:
        raise CompileError(
            f"the {target['family']} model of {getattr(source, 'id', 'this config')}: its "
            f"{sum(t.numel() for t in tensors):,} parameters and buffers need {needed / 1e9:.2f} GB but "
            f"{available / 1e9:.2f} GB are available on {device}; free memory or compile on another device"
        )
    model = build_model(target, device=device)
    if mla:
        from graphkit.attention.mla import to_mla  # noqa: PLC0415 - the converted attentions import the families

        assert kv_rank is not None, "checked above: mla takes kv_rank"
        to_mla(model, kv_rank, rope_dims=rope_dims)
    if params is not None:
        load_params(model, params, strict=strict)
    return model


__all__ = [
    "compile_model",
    "load_params",
    "save_params",
    "read_params",
    "LoadReport",
    "CompileError",
    "ParamsError",
    "build_model",
    "converted_config",
]

"""Configs, graphs and parameters back into runnable models.

    >>> model = compile(dataset["vits-1k-00042"], params="predicted.safetensors")
    >>> save_params(model, "vit.safetensors", config=dataset["vits-1k-00042"].config)

:func:`compile` builds the model a dataset record, a graph or a config describes, checks that
it traces to the same fingerprint, and loads parameters. :func:`load_params` checks every name
and shape before changing anything, so a bad file never leaves a half-loaded model. Parameters
travel as safetensors; :func:`save_params` stores the model's config in the file's metadata.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.errors import GraphkitError
from graphkit.fileio import atomic_path
from graphkit.families import build_model, config_from_graph, resolve_config
from graphkit.graph import ArchGraph

Params = Mapping[str, torch.Tensor]


class CompileError(GraphkitError):
    """A model cannot be built from what was given, or its parameters do not fit it."""


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_params` loaded: tensors and elements, out of the model's."""

    loaded: int
    total: int
    loaded_elements: int
    total_elements: int
    missing: tuple[str, ...]

    @property
    def coverage(self) -> float:
        """Fraction of the model's parameter elements that were loaded."""
        return self.loaded_elements / max(self.total_elements, 1)

    def __str__(self) -> str:
        return (f"loaded {self.loaded} of {self.total} parameter tensors, {self.loaded_elements:,} of "
                f"{self.total_elements:,} elements ({self.coverage:.1%})")


def read_params(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; CompileError naming the file otherwise."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such parameter file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise CompileError(f"{path}: not a safetensors file ({' '.join(str(e).split())})") from e


def _persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers saved in the state dict (DGQA's allocation state, for one); non-persistent ones
    (rotary tables) are rebuilt by the model itself."""
    names = set(model.state_dict(keep_vars=True))
    return {name: b for name, b in model.named_buffers() if name in names}


def save_params(model: nn.Module | Params, path: str | Path, *, config: Mapping[str, Any] | None = None,
                metadata: Mapping[str, str] | None = None) -> Path:
    """Write a model's parameters (tied ones once, under the name ``named_parameters`` gives)
    and persistent buffers to a safetensors file, atomically. ``config`` goes into its metadata
    as ``graphkit_config``, ``metadata`` as given."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {**dict(model.named_parameters()), **_persistent_buffers(model)} if isinstance(model, nn.Module) else dict(model)
    if any(t.is_meta for t in tensors.values()):
        raise CompileError(f"{path}: the model is on the meta device and has no values to save")
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {**(metadata or {}), **({"graphkit_config": json.dumps(dict(config), sort_keys=True)} if config is not None else {})}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata or None)
    return path


def load_params(model: nn.Module, params: Params | str | Path, *, strict: bool = True) -> LoadReport:
    """Load ``params`` (a mapping or a safetensors file) into ``model``.

    Every name must be a parameter (tied aliases such as GPT-2's ``lm_head.weight`` included) or
    a persistent buffer of the model, with the same shape; with ``strict`` every parameter must be
    given (buffers are optional). All of it is checked before any value is written. Values are
    cast to each parameter's dtype; a model on the meta device gets real tensors.
    """
    source = ""
    if isinstance(params, (str, Path)):
        source = f"{params}: "
        params, _ = read_params(params)
    canonical = dict(model.named_parameters())
    name_of = {id(p): name for name, p in canonical.items()}
    alias = {name: name_of[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
    buffers = _persistent_buffers(model)
    resolved: dict[str, torch.Tensor] = {}
    buffer_values: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        if name in buffers:
            if tuple(tensor.shape) != tuple(buffers[name].shape):
                raise CompileError(f"{source}buffer {name!r} has shape {list(tensor.shape)} but the model expects {list(buffers[name].shape)}")
            buffer_values[name] = tensor
            continue
        target = alias.get(name)
        if target is None:
            near = difflib.get_close_matches(name, list(alias), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise CompileError(f"{source}parameter {name!r} is not a parameter of {type(model).__name__}{hint}")
        expected = tuple(canonical[target].shape)
        if tuple(tensor.shape) != expected:
            raise CompileError(f"{source}parameter {name!r} has shape {list(tensor.shape)} but the model expects {list(expected)}")
        resolved[target] = tensor
    missing = tuple(name for name in canonical if name not in resolved)
    if strict and missing:
        raise CompileError(f"{source}{len(missing)} of {len(canonical)} parameters are missing, the first is {missing[0]!r}")
    modules = dict(model.named_modules())
    names_of: dict[str, list[str]] = {}
    for alias_name, target in alias.items():
        names_of.setdefault(target, []).append(alias_name)
    with torch.no_grad():
        for name, tensor in resolved.items():
            param = canonical[name]
            if param.is_meta:  # nothing to copy into: swap in a real parameter under every tied name
                new = nn.Parameter(tensor.to(param.dtype), requires_grad=param.requires_grad)
                for alias_name in names_of[name]:
                    owner, _, attr = alias_name.rpartition(".")
                    setattr(modules[owner], attr, new)
            else:
                param.copy_(tensor.to(dtype=param.dtype, device=param.device))
        for name, tensor in buffer_values.items():
            owner, _, attr = name.rpartition(".")
            buffer = buffers[name]
            value = tensor.to(buffer.dtype) if buffer.is_meta else tensor.to(dtype=buffer.dtype, device=buffer.device)
            modules[owner].register_buffer(attr, value)
    return LoadReport(
        loaded=len(resolved), total=len(canonical),
        loaded_elements=sum(canonical[n].numel() for n in resolved),
        total_elements=sum(p.numel() for p in canonical.values()), missing=missing,
    )


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


__all__ = ["compile", "load_params", "save_params", "read_params", "LoadReport", "CompileError", "build_model"]

"""Parameter dicts in and out of models: the one place that reads, checks and writes them.

    >>> tensors, metadata = read_params("vit.safetensors")
    >>> report = load_params(model, tensors)        # every name, shape, dtype and value checked first
    >>> save_params(model, "vit.safetensors", config=config)

``compile`` (records back to models) and ``ghn.predict`` (hypernetwork predictions into models)
both go through here, so a tied weight, a wrong shape, an integer tensor, a NaN or a file too
large for memory is handled the same way everywhere: refused before anything is written, with
one line naming the file and the parameter. Files are safetensors (never pickles) and are
written atomically (:mod:`graphkit.fileio`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from graphkit.errors import CompileError, ParamsError
from graphkit.fileio import check_output_file, save_safetensors

Params = Mapping[str, torch.Tensor]


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
        return (
            f"loaded {self.loaded} of {self.total} parameter tensors, {self.loaded_elements:,} of "
            f"{self.total_elements:,} elements ({self.coverage:.1%})"
        )


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (MemAvailable on Linux CPUs); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_shortfall(needed: int, device: torch.device, limit: int | None = None) -> int | None:
    """The bytes available on ``device`` (or ``limit``) when ``needed`` bytes do not fit in them,
    else None: callers measure before they allocate and word the refusal themselves."""
    limit = limit if limit is not None else available_memory(device)
    return limit if limit is not None and needed > limit else None


def first_non_finite(params: Params) -> str | None:
    """The name of the first floating-point tensor holding a NaN or Inf, or None.

    One reduction pass per tensor: a NaN or Inf anywhere makes the sum NaN or Inf, so a finite
    sum proves the tensor finite. Only a non-finite sum (which an overflow could also cause) is
    confirmed element by element. On GPT-2-Large this is about 20x faster than
    ``isfinite(t).all()``, which writes and reads a boolean copy of 774M values."""
    for name, tensor in params.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        if not torch.isfinite(tensor.sum()) and not torch.isfinite(tensor).all():
            return name
    return None


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "floating-point"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype == torch.bool else "integer"


def read_params(path: str | Path, *, tensors: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file (only the metadata, and no tensors, without
    ``tensors``); a ParamsError naming the file otherwise (missing, a folder, unreadable, not
    safetensors, truncated)."""

    path = Path(path)
    if path.is_dir():
        raise ParamsError(f"{path}: is a folder; give a safetensors file")
    if not path.is_file():
        raise ParamsError(f"{path}: no such parameter file")
    try:
        with safe_open(str(path), framework="pt") as f:
            values = {name: f.get_tensor(name) for name in f.keys()} if tensors else {}
            return values, dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for bad headers and short files
        raise ParamsError(f"{path}: not a safetensors file, or truncated ({' '.join(str(e).split())})") from e


def check_params_output(path: str | Path, what: str = "--out", *, kind: str = "weights") -> Path:
    """Check, before any work, that a parameter file of ``kind`` (weights, or the
    predicted-, converted- or compiled-weights its command writes) can be written at ``path``:
    a file name, not a folder or a link, not under a file, and new or a file whose mark says
    graphkit wrote it as ``kind`` (a model file, a downloaded checkpoint, anything else graphkit
    did not write and another command's weights are never overwritten)."""
    return check_output_file(path, what, kind=kind)


def persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers saved in the state dict (DGQA's allocation state, for one); non-persistent ones
    (rotary tables) are rebuilt by the model itself."""
    names = set(model.state_dict(keep_vars=True))
    return {name: b for name, b in model.named_buffers() if name in names}


def save_params(
    model: nn.Module | Params,
    path: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
    kind: str = "weights",
) -> Path:
    """Write a model's parameters (tied ones once, under the name ``named_parameters`` gives)
    and persistent buffers to a safetensors file, atomically, marked as graphkit's ``kind``
    (:func:`graphkit.fileio.save_safetensors`). ``config`` goes into its metadata as
    ``graphkit_config``, ``metadata`` as given. ``path`` is checked as
    :func:`check_params_output` does: a folder or a file that is not graphkit's ``kind`` is
    refused."""

    path = check_params_output(path, "parameter file", kind=kind)
    tensors = (
        {**dict(model.named_parameters()), **persistent_buffers(model)} if isinstance(model, nn.Module) else dict(model)
    )
    if any(t.is_meta for t in tensors.values()):
        raise ParamsError(f"{path}: the model is on the meta device and has no values to save")
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {
        **(metadata or {}),
        **({"graphkit_config": json.dumps(dict(config), sort_keys=True)} if config is not None else {}),
    }
    return save_safetensors(tensors, path, kind, metadata)


def _check_value(source: str, what: str, name: str, tensor: torch.Tensor, expected: torch.Tensor) -> None:
    """Shape and dtype kind of one tensor against the model's (a float-to-float cast such as
    fp16 -> fp32 is fine; an integer or bool tensor into a float parameter is a mistake)."""
    if tuple(tensor.shape) != tuple(expected.shape):
        raise ParamsError(
            f"{source}{what} {name!r} has shape {list(tensor.shape)} but the model expects {list(expected.shape)}"
        )
    if _kind(tensor.dtype) != _kind(expected.dtype):
        raise ParamsError(
            f"{source}{what} {name!r} is {str(tensor.dtype).removeprefix('torch.')} but the model's is "
            f"{str(expected.dtype).removeprefix('torch.')}: {_kind(tensor.dtype)} values are not cast "
            f"to {_kind(expected.dtype)} (a float-to-float cast such as float16 -> float32 is)"
        )


def tied_names(model: nn.Module) -> dict[str, list[str]]:
    """Every name each parameter is reachable under, by its ``named_parameters`` name
    (GPT-2's ``transformer.wte.weight``: itself and ``lm_head.weight``)."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    names: dict[str, list[str]] = {}
    for alias, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(name_of[id(p)], []).append(alias)
    return names


def replace_parameter(model: nn.Module, name: str, value: torch.Tensor, names: Mapping[str, list[str]]) -> nn.Parameter:
    """Put ``value`` in as parameter ``name`` under every name it is tied to (``names`` from
    :func:`tied_names`), for a meta model that has no storage to copy into; an ``nn.Parameter``
    goes in as it is, so that one taken out can be put back."""
    old = model.get_parameter(name)
    new = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=old.requires_grad)
    for alias in names[name]:
        owner, _, attr = alias.rpartition(".")
        setattr(model.get_submodule(owner), attr, new)
    return new


def check_params(
    model: nn.Module, params: Params, *, strict: bool = True, source: str = ""
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``params`` sorted into the model's parameters (by their ``named_parameters`` name, a tied
    alias such as GPT-2's ``lm_head.weight`` resolved) and persistent buffers, after checking
    every name, shape and dtype kind (float to float, integer to integer) and, with ``strict``,
    that every parameter is given; a ParamsError (prefixed with ``source``) otherwise. Values
    are not looked at and nothing is written, so meta tensors can stand in for a plan."""
    canonical = dict(model.named_parameters())
    alias = {a: name for name, aliases in tied_names(model).items() for a in aliases}
    buffers = persistent_buffers(model)
    resolved: dict[str, torch.Tensor] = {}
    buffer_values: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        if name in buffers:
            _check_value(source, "buffer", name, tensor, buffers[name])
            buffer_values[name] = tensor
            continue
        target = alias.get(name)
        if target is None:
            near = difflib.get_close_matches(name, list(alias), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ParamsError(f"{source}parameter {name!r} is not a parameter of {type(model).__name__}{hint}")
        _check_value(source, "parameter", name, tensor, canonical[target])
        resolved[target] = tensor
    missing = [name for name in canonical if name not in resolved]
    if strict and missing:
        raise ParamsError(
            f"{source}{len(missing)} of {len(canonical)} parameters are missing, the first is {missing[0]!r}"
        )
    return resolved, buffer_values


def load_params(model: nn.Module, params: Params | str | Path, *, strict: bool = True) -> LoadReport:
    """Load ``params`` (a mapping or a safetensors file) into ``model``.

    Everything :func:`check_params` checks, and no NaN or Inf in a floating-point tensor, is
    checked before any value is written, so a bad file never leaves a half-loaded model (buffers
    are optional). Values are cast to each parameter's dtype; a model on the meta device gets
    real tensors.
    """
    source = ""
    if isinstance(params, (str, Path)):
        source = f"{params}: "
        params, _ = read_params(params)
    resolved, buffer_values = check_params(model, params, strict=strict, source=source)
    canonical = dict(model.named_parameters())
    names = tied_names(model)
    buffers = persistent_buffers(model)
    bad = first_non_finite({**resolved, **buffer_values})
    if bad is not None:
        what = "buffer" if bad in buffer_values else "parameter"
        raise ParamsError(f"{source}{what} {bad!r} holds NaN or Inf; nothing was loaded")
    with torch.no_grad():
        for name, tensor in resolved.items():
            param = canonical[name]
            if param.is_meta:  # nothing to copy into: swap in a real parameter under every tied name
                replace_parameter(model, name, tensor.to(param.dtype), names)
            else:
                param.copy_(tensor.to(dtype=param.dtype, device=param.device))
        for name, tensor in buffer_values.items():
            owner, _, attr = name.rpartition(".")
            buffer = buffers[name]
            value = tensor.to(buffer.dtype) if buffer.is_meta else tensor.to(dtype=buffer.dtype, device=buffer.device)
            model.get_submodule(owner).register_buffer(attr, value)
    return LoadReport(
        loaded=len(resolved),
        total=len(canonical),
        loaded_elements=sum(canonical[n].numel() for n in resolved),
        total_elements=sum(p.numel() for p in canonical.values()),
        missing=tuple(name for name in canonical if name not in resolved),
    )


def weights_digest(model: nn.Module) -> str:
    """A SHA-256 of ``model``'s state dict (names, dtypes, shapes and values; a tied tensor under
    each of its names): the same model with the same weights gives the same digest, any
    other model or weight a different one. ``finetune --resume`` checks with it that a run
    goes on from the model it started from, where a check of shapes alone took any model of the
    same architecture."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict(keep_vars=False).items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy())
    return digest.hexdigest()[:32]


__all__ = [
    "Params",
    "ParamsError",
    "CompileError",
    "LoadReport",
    "read_params",
    "save_params",
    "load_params",
    "check_params",
    "check_params_output",
    "persistent_buffers",
    "tied_names",
    "replace_parameter",
    "first_non_finite",
    "weights_digest",
    "available_memory",
    "memory_shortfall",
]

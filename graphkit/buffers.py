"""Buffers a model computes when it is built, recomputed for a model built on the meta device.

A model built on meta holds every tensor there, its buffers too: rotary frequencies
(``inv_freq``), relative-position indices, attention masks, norm statistics. Predicting or
loading parameters gives the parameters values; the buffers would stay on meta, and the model's
first forward fails with "Cannot copy out of meta tensor". A buffer is not predicted: it is what
the module's constructor computed from its arguments, so the library that defines the module
computes it again, the way that library does after loading weights onto a meta-built model:

- a module with ``init_non_persistent_buffers()`` (timm's convention, what its
  ``reinit_non_persistent_buffers`` calls): that method;
- torch's normalisation layers with running statistics: ``reset_running_stats()``;
- a module inside a transformers ``PreTrainedModel``: that model's own buffer initialisation
  (:func:`graphkit.compat.transformers_buffer_init`, what ``from_pretrained`` runs on the
  buffers it moved off meta).

A buffer counts as rebuilt only if its value does not depend on what it held before: each
module's rebuild runs twice, once over buffers of zeros and once over buffers of ones, and every
buffer must come out the same. A buffer no library recomputes, or recomputes only in part, is
refused in one line naming it, and the model is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import torch
from torch import nn

from graphkit.compat import transformers_buffer_init
from graphkit.errors import BufferRebuildError


def meta_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s buffers on the meta device, by their ``named_buffers`` name."""
    return {name: buffer for name, buffer in model.named_buffers() if buffer.is_meta}


def _qualified(module_name: str, attr: str) -> str:
    return f"{module_name}.{attr}" if module_name else attr


def _owners(model: nn.Module, names: Collection[str] | None) -> Iterator[tuple[str, nn.Module, list[str]]]:
    """(module name, module, its own meta buffers among ``names``, all when None) for every
    module owning one."""
    for name, module in model.named_modules():
        attrs = [
            attr
            for attr, buffer in module.named_buffers(recurse=False)
            if buffer.is_meta and (names is None or _qualified(name, attr) in names)
        ]
        if attrs:
            yield name, module, attrs


def _rebuilder(model: nn.Module, name: str, module: nn.Module) -> tuple[str, Callable[[], None]] | None:
    """How the library defining ``module`` (at ``name`` in ``model``) recomputes its buffers, with
    its name for messages; None when no library does."""
    if callable(init := getattr(module, "init_non_persistent_buffers", None)):
        return "its init_non_persistent_buffers()", init
    if callable(reset := getattr(module, "reset_running_stats", None)):
        return "its reset_running_stats()", reset
    parts = name.split(".") if name else []
    for depth in range(len(parts), -1, -1):  # the nearest enclosing transformers model
        owner = model.get_submodule(".".join(parts[:depth]))
        fill = transformers_buffer_init(owner)
        if fill is not None:
            return f"{type(owner).__name__}'s buffer initialisation", lambda: fill(module)
    return None


def _stand_in(tensor: torch.Tensor, device: torch.device, start: int) -> torch.Tensor:
    """``tensor``'s shape and dtype on ``device``, every element ``start``: one element expanded,
    so that a stand-in for a meta parameter of any size costs nothing."""
    return torch.full((), start, dtype=tensor.dtype, device=device).expand(tensor.shape)


def _filled(
    module: nn.Module, rebuild: Callable[[], None], device: torch.device, start: int
) -> dict[str, torch.Tensor]:
    """Every buffer of ``module`` after ``rebuild`` ran over fresh ones on ``device``: its meta
    buffers filled with ``start``, its real ones copied, and its meta parameters (which timm reads
    for the device to compute on) standing in as ``start`` on ``device``. The module's own
    tensors are put back afterwards."""
    buffers = dict(module.named_buffers(recurse=False))
    params = [
        (owner, attr, param)
        for path, param in module.named_parameters(remove_duplicate=False)
        if param.is_meta
        for owner, _, attr in [path.rpartition(".")]
    ]
    stand_ins: dict[int, nn.Parameter] = {}
    try:
        for attr, buffer in buffers.items():
            setattr(module, attr, torch.full_like(buffer, start, device=device) if buffer.is_meta else buffer.clone())
        for owner, attr, param in params:
            if id(param) not in stand_ins:  # tied parameters stay tied
                stand_ins[id(param)] = nn.Parameter(_stand_in(param, device, start), param.requires_grad)
            setattr(module.get_submodule(owner), attr, stand_ins[id(param)])
        with torch.no_grad():
            rebuild()
        return {attr: getattr(module, attr) for attr in buffers}
    finally:
        for attr, buffer in buffers.items():
            setattr(module, attr, buffer)
        for owner, attr, param in params:
            setattr(module.get_submodule(owner), attr, param)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values (NaN where the other has NaN included), shapes and dtypes, off meta."""
    if a.is_meta or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
    return torch.equal(a, b)


def rebuilt_buffers(
    model: nn.Module, device: str | torch.device, names: Collection[str] | None = None
) -> dict[str, torch.Tensor]:
    """Every meta buffer of ``model`` (only those among ``names`` when given) recomputed on
    ``device`` by the library that defines its module, as new tensors by ``named_buffers`` name;
    ``model`` is left as it was. Raises :class:`BufferRebuildError` naming the first buffer no
    library recomputes in full."""
    device = torch.device(device)
    rebuilt: dict[str, torch.Tensor] = {}
    for name, module, attrs in _owners(model, names):
        first = _qualified(name, attrs[0])
        found = _rebuilder(model, name, module)
        if found is None:
            raise BufferRebuildError(
                f"{type(model).__name__}: buffer {first!r} ({type(module).__name__}) is on the meta device and no "
                f"library recomputes it; build the model on a real device to give it its value"
            )
        how, rebuild = found
        try:
            zeros, ones = (_filled(module, rebuild, device, start) for start in (0, 1))
        except Exception as e:  # the library's own error, named with the buffer it was filling
            raise BufferRebuildError(
                f"{type(model).__name__}: buffer {first!r} ({type(module).__name__}) could not be recomputed "
                f"by {how}: {type(e).__name__}: {' '.join(str(e).split())}"
            ) from e
        for attr in attrs:
            qualified = _qualified(name, attr)
            if not _same(zeros[attr], ones[attr]):
                raise BufferRebuildError(
                    f"{type(model).__name__}: buffer {qualified!r} ({type(module).__name__}) is not recomputed in "
                    f"full by {how}; build the model on a real device to give it its value"
                )
            rebuilt[qualified] = zeros[attr]
    return rebuilt


def install_buffers(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Put each of ``values`` (from :func:`rebuilt_buffers`) in as ``model``'s buffer of that
    name, keeping whether it is saved in the state dict."""
    for name, value in values.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, value)


def materialize_buffers(model: nn.Module, device: str | torch.device) -> list[str]:
    """Give every meta buffer of ``model`` its value on ``device``, recomputed as
    :func:`rebuilt_buffers` says (refused, the model unchanged, when one cannot be); returns their
    names. A model built on meta whose parameters were then loaded runs after this."""
    values = rebuilt_buffers(model, device)
    install_buffers(model, values)
    return list(values)


__all__ = ["BufferRebuildError", "meta_buffers", "rebuilt_buffers", "install_buffers", "materialize_buffers"]

"""A training run's resumable state, beside a model's weights in its ``checkpoint/`` folder:
``optimizer.safetensors`` (the optimizer's tensors) and ``trainer_state.json`` (the step, the
run's config and the optimizer's groups). Hypernetwork training (:mod:`graphkit.ghn.training`)
and up-training (:mod:`graphkit.finetune`) both resume from them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from graphkit.errors import CheckpointError
from graphkit.fileio import marked_json, save_safetensors
from graphkit.validation import is_count


def save_optimizer_state(
    folder: Path, optimizer: torch.optim.Optimizer, state: Mapping[str, Any], kind: str = "hypernetwork"
) -> None:
    """Write what resuming needs beside a model's weights in ``folder``: ``optimizer.safetensors``
    (the optimizer's tensors, marked as part of graphkit's ``kind`` of output) and
    ``trainer_state.json`` (``state``, such as the step and the run's config, and the optimizer's
    groups); :func:`load_optimizer_state` reads them back."""
    tensors, groups = _flatten_optimizer(optimizer.state_dict())
    save_safetensors(tensors, folder / "optimizer.safetensors", kind)
    (folder / "trainer_state.json").write_text(marked_json(kind, {**state, "param_groups": groups}, indent=2) + "\n")


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """A training checkpoint's trainer_state.json (step, the run's config, the optimizer's
    groups), checked; CheckpointError naming the file if it is missing or damaged."""
    file = Path(path) / "trainer_state.json"
    state = read_json(file, "training checkpoint")
    step, config, groups = state.get("step"), state.get("config"), state.get("param_groups")
    if not is_count(step, 0) or not isinstance(config, dict) or not isinstance(groups, list):
        raise CheckpointError(
            f"{file}: damaged (expected step >= 0, config and param_groups); resume from another "
            "checkpoint or start a new run"
        )
    return state


def load_optimizer_state(path: str | Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``optimizer`` from a training checkpoint; returns the trainer state."""
    path = Path(path)
    state = read_trainer_state(path)
    tensors = load_tensors(path / "optimizer.safetensors")
    try:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, state.pop("param_groups")))
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{path / 'optimizer.safetensors'}: does not fit this optimizer ({first_line(e)})"
        ) from None
    return state


def read_json(file: Path, what: str = "checkpoint") -> dict[str, Any]:
    """A checkpoint's JSON file as a dict; CheckpointError naming the file (and ``what`` it should
    be) if it is unreadable."""
    try:
        value = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: not a graphkit {what} file ({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: not a graphkit {what} file (a JSON object is expected)")
    return value


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; CheckpointError naming the file if it is truncated or damaged."""
    try:
        return load_file(file)
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({first_line(e)})") from None


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {
        f"{index}.{key}": torch.as_tensor(value).contiguous().cpu()
        for index, slots in state_dict["state"].items()
        for key, value in slots.items()
    }
    return tensors, state_dict["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}

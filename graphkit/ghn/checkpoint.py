"""Hypernetwork checkpoints: a folder with ``model.safetensors`` (the weights) and ``config.json``
(the LoGAH config, the op vocabulary version, the ops and family it was trained on, how it was
trained). A training checkpoint adds ``optimizer.safetensors`` and ``trainer_state.json``.

A checkpoint folder is written beside its final place and renamed into it, so an interrupted save
leaves the previous checkpoint intact; in a folder that holds more (a training run's output, with
its metrics and ``checkpoint/``) each file is replaced atomically, config.json last.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from graphkit.errors import GraphkitError
from graphkit.families import FamilyTable
from graphkit.ghn.model import LoGAH, LoGAHConfig
from graphkit.graph import ArchGraph
from graphkit.ops import OPS_VERSION

#: the checkpoints that ship with graphkit, by the family they predict (``Family.bundled_ghn``),
#: a live view of the family registry
BUNDLED = FamilyTable("bundled_ghn")
FILES = {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"}


class CheckpointError(GraphkitError):
    """A hypernetwork checkpoint is missing, unreadable or does not fit what it is asked to do."""


def save_checkpoint(path: str | Path, ghn: LoGAH, info: Mapping[str, Any], *,
                    optimizer: torch.optim.Optimizer | None = None, state: Mapping[str, Any] | None = None) -> Path:
    """Write ``ghn`` (and, for resuming, the optimizer and trainer state) to the folder ``path``,
    atomically; ``info`` (family, trained ops, data, ...) goes into config.json."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in ghn.state_dict().items()}
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    config = {"logah": ghn.config_dict(), "ops_version": OPS_VERSION, **info}
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if optimizer is not None:
        tensors, groups = _flatten_optimizer(optimizer.state_dict())
        save_file(tensors, tmp / "optimizer.safetensors")
        (tmp / "trainer_state.json").write_text(json.dumps({**(state or {}), "param_groups": groups}, indent=2) + "\n")
    if path.exists() and set(os.listdir(path)) - FILES:  # a training run's folder: replace our files only
        for name in sorted(os.listdir(tmp), key=lambda n: n == "config.json"):  # config.json last
            os.replace(tmp / name, path / name)
        tmp.rmdir()
        return path
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: str | Path, *, variant: str | None = None, device: str | torch.device = "cpu") -> LoGAH:
    """The LoGAH stored in the folder ``path`` (or a bundled name such as ``logah-tiny-vits``),
    in eval mode, with its config.json as ``ghn.info``. CheckpointError if the folder is not a
    checkpoint, its vocabulary version differs from this graphkit's, or ``variant`` is given
    and the checkpoint holds another one."""
    path = _locate(path)
    try:
        info = json.loads((path / "config.json").read_text())
        config = LoGAHConfig(**info["logah"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a graphkit hypernetwork checkpoint (config.json: {e})") from None
    if info.get("ops_version") != OPS_VERSION:
        raise CheckpointError(f"{path}: trained with op vocabulary v{info.get('ops_version')}, but this graphkit uses "
                              f"v{OPS_VERSION}; retrain it with `graphkit train-ghn`")
    if variant is not None:
        from graphkit.ghn.model import VARIANTS

        expected = VARIANTS.get(variant)
        if expected is None:
            raise CheckpointError(f"unknown LoGAH variant {variant!r}; known: {', '.join(VARIANTS)}")
        if (expected.hidden, expected.layers, expected.heads, expected.rank) != (config.hidden, config.layers, config.heads, config.rank):
            raise CheckpointError(f"{path}: holds LoGAH {info.get('variant', 'custom')} (d {config.hidden}, {config.layers} layers, "
                                  f"r {config.rank}), not {variant}")
    ghn = LoGAH(config)
    try:
        ghn.load_state_dict(load_file(path / "model.safetensors"))
    except (OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{path / 'model.safetensors'}: does not match its config.json ({first})") from None
    ghn.info = info
    return ghn.to(device).eval()


def bundled_checkpoint(family: str | None) -> Path:
    """The folder of the checkpoint that ships for ``family`` (vit or gpt2)."""
    if family not in BUNDLED:
        raise CheckpointError(f"no bundled hypernetwork for {family or 'this'} models (bundled: {', '.join(BUNDLED)}); "
                              "train one with `graphkit train-ghn` and pass --ghn")
    return _locate(BUNDLED[family])


def check_graph(ghn: LoGAH, graph: ArchGraph) -> None:
    """Refuse a graph with an op the hypernetwork never saw in training (its prediction for that
    node would be untrained noise); a hypernetwork without training info accepts every graph."""
    trained = getattr(ghn, "info", {}).get("trained_ops")
    if trained is None:
        return
    unseen = next((node for node in graph.nodes if node.op not in trained), None)
    if unseen is not None:
        raise CheckpointError(f"node {unseen.name!r} has op {unseen.op!r}, which this hypernetwork was not trained on "
                              f"(trained on: {', '.join(sorted(trained))})")


def record_evaluation(path: str | Path, summary: Mapping[str, Any], *, dataset: str, split: str, data: str) -> dict[str, Any]:
    """Store a held-out evaluation (``evaluate.summarize``'s summary) in the checkpoint's
    config.json, atomically, so that the checkpoint carries its measured effect; returns the
    record. ``describe`` reads it back."""
    path = _locate(path)
    final = str(summary["horizons"][-1])
    record = {"dataset": dataset, "split": split, "data": data, "archs": summary["archs"], "horizons": summary["horizons"],
              "steps": int(final), "wins": summary["wins"],
              "predicted_beats_random": summary["predicted_beats_random"],
              "predicted_beats_orthogonal": summary["predicted_beats_orthogonal"],
              "predicted_alone": {"loss": summary["predicted"]["loss_0"], "accuracy": summary["predicted"]["accuracy_0"]},
              "final": {init: {"loss": summary[init]["loss"], "accuracy": summary[init]["accuracy"]}
                        for init in ("predicted", "random", "orthogonal")}}
    config = json.loads((path / "config.json").read_text())
    config["evaluation"] = record
    tmp = path / ".config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path / "config.json")
    return record


def describe(ghn: LoGAH) -> str:
    """One line on what a checkpoint was trained on and its recorded held-out effect, e.g.
    "LoGAH-tiny trained on vits-digits with digits (400 steps); held out: 8 architectures, the
    predicted parameters alone 0.62 accuracy; after 300 fine-tuning steps they beat random on 88%
    and orthogonal on 50%"."""
    info = getattr(ghn, "info", {})
    trained = (f"LoGAH-{info.get('variant', 'custom')} trained on {Path(str(info.get('dataset', '?'))).name} "
               f"with {info.get('data', '?')} ({info.get('steps', '?')} steps)")
    record = info.get("evaluation")
    if record is None:
        return f"{trained}; no held-out evaluation recorded (graphkit eval-ghn --record measures one)"
    alone = record["predicted_alone"]
    return (f"{trained}; held out: {record['archs']} {Path(record['dataset']).name} architectures, the predicted parameters "
            f"alone {alone['accuracy']:.2f} accuracy (loss {alone['loss']:.2f}); after {record['steps']} fine-tuning steps "
            f"they beat random on {100 * record['predicted_beats_random']:.0f}% and orthogonal on "
            f"{100 * record['predicted_beats_orthogonal']:.0f}%")


def load_optimizer_state(path: str | Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``optimizer`` from a training checkpoint; returns the trainer state."""
    path = Path(path)
    state = json.loads((path / "trainer_state.json").read_text())
    optimizer.load_state_dict(_unflatten_optimizer(load_file(path / "optimizer.safetensors"), state.pop("param_groups")))
    return state


def _locate(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.exists() and str(path) in BUNDLED.values():
        folder = Path(str(resources.files("graphkit.ghn") / "pretrained" / str(path)))
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"{path}: no hypernetwork checkpoint there (expected config.json and model.safetensors; "
                              f"bundled: {', '.join(BUNDLED.values())})")
    return folder


def _flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {f"{index}.{key}": torch.as_tensor(value).contiguous().cpu()
               for index, slots in state_dict["state"].items() for key, value in slots.items()}
    return tensors, state_dict["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}

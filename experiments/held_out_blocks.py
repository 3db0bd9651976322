"""Where a prediction loses the class on the vision zoo's held-out families (issue #45, item 3).

``zoo_pools.py --tempered`` shows that the predictions for held-out families end at chance
whatever their logits' scale: the classifier's input varies across images without carrying the
digit. This probe asks where that happens. For the first architecture of each held-out family it
runs 16 training batches and 4 held-out batches of 32 digits through the model and, after the
embedding and after each block or stage (the children of its ``blocks``, ``stages``, ``layers``
and ``cls_attn_blocks``), fits a ridge-regression linear probe on the training images' pooled
features and scores it on the held-out ones: the accuracy a linear classifier could reach there.
It does so for the model's own init and for each checkpoint's prediction (``--keep-init``: also
the prediction added onto the own init, ``W0 + P``, as ``eval-ghn``'s ``keep_init`` row).

    .venv/bin/python experiments/held_out_blocks.py logah-tiny-zoo-vision runs/zoo-vits-mini-whole-4000 --keep-init
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import zoo_pools  # noqa: E402

from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.pool import ArchPool, graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402

#: the containers whose children are probed, in the order a model runs them
STACKS = ("blocks", "stages", "layers", "cls_attn_blocks")
TRAIN_BATCHES = 16
RIDGE = 1.0  # times the mean feature variance


def probe_points(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's first child (its embedding) and every child of its :data:`STACKS`, by name."""
    first_name, first = next(iter(model.named_children()))
    points = [(first_name, first)]
    for stack in STACKS:
        container = getattr(model, stack, None)
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            points.extend((f"{stack}.{name}", child) for name, child in container.named_children())
    return points


def pooled(output: object) -> torch.Tensor:
    """A module's output as one feature vector per image: the last tensor of a tuple (TNT's blocks
    give pixel and patch embeddings), averaged over tokens (B, N, C) or positions (channels
    first, or last where the two spatial sides are equal and the channels differ: Swin's layers)."""
    x = output[-1] if isinstance(output, (tuple, list)) else output
    if not isinstance(x, torch.Tensor):  # a block that passes on a structure (XCiT's (x, (H, W)))
        x = output[0]
    if x.dim() == 3:
        return x.mean(1)
    if x.dim() == 4:
        channels_last = x.shape[1] == x.shape[2] and x.shape[3] != x.shape[1]
        return x.mean((1, 2)) if channels_last else x.mean((2, 3))
    return x.flatten(1)


def features(model: torch.nn.Module, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per probe point, the pooled features of every image in ``batches``; a point whose output
    is not one row per image (TNT's pixel embedding, a row per patch) is left out."""
    captured: dict[str, list[torch.Tensor]] = {}
    points = probe_points(model)
    handles = [
        module.register_forward_hook(lambda _m, _a, out, name=name: captured.setdefault(name, []).append(pooled(out)))
        for name, module in points
    ]
    try:
        with torch.no_grad():
            for images in batches:
                model.eval()(images)
    finally:
        for handle in handles:
            handle.remove()
    images = sum(len(batch) for batch in batches)
    out = {name: torch.cat(captured[name]).float() for name, _ in points if name in captured}
    return {name: value for name, value in out.items() if len(value) == images}


def linear_probe(
    train: torch.Tensor, labels: torch.Tensor, test: torch.Tensor, test_labels: torch.Tensor, classes: int
) -> float:
    """Held-out accuracy of a ridge regression onto one-hot labels, fitted on standardised features."""
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    x, t = (train - mean) / std, (test - mean) / std
    targets = torch.nn.functional.one_hot(labels, classes).float()
    gram = x.T @ x + RIDGE * len(x) * torch.eye(x.shape[1])
    weights = torch.linalg.solve(gram, x.T @ targets)
    return ((t @ weights).argmax(1) == test_labels).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="checkpoints (folders or bundled names) to probe")
    parser.add_argument("--keep-init", action="store_true", help="also each prediction added onto the own init")
    args = parser.parse_args()
    zoo = zoo_pools.KINDS["vision"][0]
    source = load_source("digits")
    ghns = {str(c): load_checkpoint(c) for c in args.checkpoints}
    for family, record in zoo_pools.first_of_each(ArchPool(zoo, "eval").records).items():
        generator = torch.Generator().manual_seed(1)
        train = [source.batch(record.config, 32, generator) for _ in range(TRAIN_BATCHES)]
        labels = torch.cat([y for _, y in train])
        starts: dict[str, tuple[dict[str, torch.Tensor] | None, str]] = {"own": (None, "predicted")}
        for name, ghn in ghns.items():
            predicted = predicted_params(ghn, graph_for(record, ghn.config))
            starts[name] = (predicted, "predicted")
            if args.keep_init:
                starts[f"{name} W0 + P"] = (predicted, "keep_init")
        print(f"{family} ({record.id}): linear-probe accuracy after each probe point", flush=True)
        for name, (params, init) in starts.items():
            model, held_out = zoo_pools.scored_model(record, source, 32, params, init)
            test_labels = torch.cat([y for _, y in held_out])
            fitted = features(model, [x for x, _ in train])
            tested = features(model, [x for x, _ in held_out])
            row = [
                f"{point} {linear_probe(fitted[point], labels, tested[point], test_labels, source.num_classes):.2f}"
                for point in fitted
            ]
            print(f"  {name}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()

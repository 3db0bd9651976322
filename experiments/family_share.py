"""What the architectures of one family share inside a hypernetwork (issue #45, item 1): the
measure ``family_archs.py``'s results asked for next.

``family_archs.py`` found that a pool of N architectures of ``vision_transformer`` after 1,500 steps
sits about where one architecture sits after 1,500 / N steps: each architecture trains as if alone,
on its share of the steps. Two mechanisms give that, and they call for different levers:

- the hypernetwork hardly tells the architectures apart, so one role gets one weight, which every
  architecture pulls its own way (gradients that cancel);
- it tells them apart, and each architecture trains a part of the hypernetwork the others do not
  use (gradients that do not meet: memorised, nothing carries to an unseen architecture).

Per checkpoint (a fresh LoGAH of the runs' config, then each run), on the architectures of one
dataset (by default the subset of 8 that ``family_archs.py --counts 8`` wrote):

- **gradient agreement**: per architecture, the hypernetwork's gradient of the training loss
  (cross-entropy, as ``train-ghn`` computes it: ``training.run_models``) summed over two
  independent halves of ``--batches`` data batches. The cosine between one architecture's two
  halves is the ceiling that batch noise leaves; the cosine between one architecture's first half
  and another's second half is what they share. Given for the whole hypernetwork and per part
  (encoder; decoder MLP; the decoder's r -> K maps; its embeddings and gain head). A cross cosine
  near the ceiling: the architectures train the hypernetwork alike; near 0: apart; below 0: against
  each other.
- **prediction similarity**: the cosine between two architectures' predicted weights of the same
  state-dict name, over the slice both shapes hold (2-D and larger weights), and, as its scale,
  the same for one architecture's weights of one name in its two blocks (``blocks.0.X`` against
  ``blocks.1.X``). Across architectures near 1: one weight per role, whatever the architecture.

    .venv/bin/python experiments/family_archs.py --counts 8                 # trains the runs first
    .venv/bin/python experiments/family_share.py runs/zoo-vits-mini-vision_transformer-1-1500 \\
        runs/zoo-vits-mini-vision_transformer-8-1500
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from shared_weights import corners_for, shared_init  # noqa: E402
from zoo_pools import KINDS  # noqa: E402

from graphkit.ghn import load_checkpoint, training  # noqa: E402
from graphkit.ghn.model import LoGAH  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402

#: the hypernetwork's parts, by the first match of a prefix of the parameter's name
PARTS = {
    "encoder": ("encoder.",),
    "decoder MLP": ("decoder.mlp.",),
    "decoder maps": ("decoder.low_rank.", "decoder.role_maps"),
    "decoder embeddings, gain": ("decoder.",),
}


def part_of(name: str) -> str:
    """The entry of :data:`PARTS` that the hypernetwork parameter ``name`` belongs to."""
    return next(part for part, prefixes in PARTS.items() if name.startswith(prefixes))


def gradients(
    params_of: Callable[[int], dict[str, torch.Tensor]],
    trained: Sequence[tuple[str, torch.Tensor]],
    pool: ArchPool,
    source,
    config: training.TrainConfig,
    batches: int,
) -> list[list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]]:
    """Per architecture of ``pool``, two halves of ``batches`` data batches (the halves draw
    different batches; every architecture draws the same ones), and per half two gradients of the
    training cross-entropy of the model with the parameters ``params_of(index)`` (which the
    ``trained`` tensors, by name, make): with respect to the ``trained`` tensors, by :data:`PARTS`
    (empty without them), and with respect to the model's parameters, by state-dict name."""
    out = []
    for index in range(len(pool)):
        generator = torch.Generator().manual_seed(0)
        halves = []
        for _ in range(2):
            for _, p in trained:
                p.grad = None
            weights: dict[str, torch.Tensor] = {}
            for _ in range(batches // 2):
                params = params_of(index)
                for value in params.values():
                    if value.requires_grad:
                        value.retain_grad()
                ce, _, _ = training.run_models(pool, [index], [params], source, config, generator)
                ce.backward()
                for name, value in params.items():
                    grad = torch.zeros_like(value) if value.grad is None else value.grad
                    weights[name] = grad + weights[name] if name in weights else grad
            parts: dict[str, list[torch.Tensor]] = {}
            for name, p in trained:
                parts.setdefault(part_of(name), []).append(
                    (torch.zeros_like(p) if p.grad is None else p.grad).flatten()
                )
            halves.append(({part: torch.cat(vectors) for part, vectors in parts.items()}, weights))
        out.append(halves)
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().float(), b.flatten().float(), dim=0).item()


def agreement(grads: list[list[tuple[dict, dict]]]) -> dict[str, dict[str, float]]:
    """Per hypernetwork part and for the whole hypernetwork: the mean cosine between one
    architecture's two halves (the ceiling) and between different architectures' halves (shared).
    Then the same for the models' weights (2-D and larger, over the corner both shapes hold): the
    mean over names, each name weighted by its share of the gradient's energy."""
    n, figures = len(grads), {}
    for part in [*grads[0][0][0], "whole"] if grads[0][0][0] else []:

        def vector(i: int, half: int) -> torch.Tensor:
            g = grads[i][half][0]
            return torch.cat(list(g.values())) if part == "whole" else g[part]

        ceiling = [cosine(vector(i, 0), vector(i, 1)) for i in range(n)]
        cross = [cosine(vector(i, 0), vector(j, 1)) for i, j in itertools.permutations(range(n), 2)]
        figures[part] = {"ceiling": round(statistics.mean(ceiling), 3), "shared": round(statistics.mean(cross), 3)}
    by_energy: dict[str, list[tuple[float, float]]] = {"ceiling": [], "shared": []}  # (cosine, energy share)
    for i in range(n):
        first = grads[i][0][1]
        energy = sum(g.square().sum().item() for g in first.values())
        for name, g in first.items():
            if g.dim() < 2:
                continue
            share = g.square().sum().item() / energy
            by_energy["ceiling"].append((overlap_cosine(g, grads[i][1][1][name]), share))
            by_energy["shared"] += [
                (overlap_cosine(g, grads[j][1][1][name]), share)
                for j in range(n)
                if j != i and name in grads[j][1][1] and grads[j][1][1][name].dim() == g.dim()
            ]
    figures["model weights"] = {
        what: round(sum(c * w for c, w in pairs) / sum(w for _, w in pairs), 3) for what, pairs in by_energy.items()
    }
    return figures


def overlap_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine between ``a`` and ``b`` over the slice both shapes hold (their leading corner)."""
    corner = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    return cosine(a[corner], b[corner])


def similarity(ghn: LoGAH, pool: ArchPool) -> dict[str, float]:
    """The mean cosine between two architectures' predicted weights of one name (2-D and larger),
    and between one architecture's ``blocks.0.X`` and ``blocks.1.X``."""
    with torch.no_grad():
        predicted = [ghn([pool.encoded(i, ghn.config)])[0] for i in range(len(pool))]
    across = [
        overlap_cosine(a[name], b[name])
        for a, b in itertools.combinations(predicted, 2)
        for name in a.keys() & b.keys()
        if a[name].dim() >= 2 and a[name].dim() == b[name].dim()
    ]
    blocks = [
        overlap_cosine(p[name], p[name.replace("blocks.0.", "blocks.1.", 1)])
        for p in predicted
        for name in p
        if name.startswith("blocks.0.") and p[name].dim() >= 2 and name.replace("blocks.0.", "blocks.1.", 1) in p
    ]
    return {
        "across architectures, one name": round(statistics.mean(across), 3),
        "one architecture, block 0 against block 1": round(statistics.mean(blocks), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="train-ghn run folders (their checkpoints)")
    parser.add_argument(
        "--dataset",
        type=Path,
        default=ROOT / "out" / "zoo-vits-mini-vision_transformer-8",
        help="the architectures measured (its train split)",
    )
    parser.add_argument("--batches", type=int, default=8, help="data batches per architecture, split in two halves")
    args = parser.parse_args()
    if args.batches < 2 or args.batches % 2:
        parser.error("--batches: an even number, at least 2")
    _, recipe = KINDS["vision"]
    pool = ArchPool(args.dataset, "train")
    source = load_source(recipe["data"])
    config = training.TrainConfig(**recipe, dataset=str(args.dataset), out=str(ROOT / "runs" / "unused"))
    first = load_checkpoint(args.runs[0])
    torch.manual_seed(0)
    ghns = [("fresh LoGAH (the first run's config)", LoGAH(first.config))]
    ghns += [(run.name, load_checkpoint(run)) for run in args.runs]
    rows = [
        "| start | hypernetwork: whole | " + " | ".join(PARTS) + " | model weights | predicted: across archs / blocks |"
    ]
    rows.append("|---" * (4 + len(PARTS)) + "|")

    def row(label: str, figures: dict, similar: dict | None) -> str:
        cells = [
            f"{figures[part]['ceiling']:.2f} / {figures[part]['shared']:.2f}" if part in figures else "-"
            for part in ["whole", *PARTS, "model weights"]
        ]
        tail = "-" if similar is None else " / ".join(f"{v:.2f}" for v in similar.values())
        return f"| {label} | " + " | ".join(cells) + f" | {tail} |"

    for label, ghn in ghns:
        params_of = lambda index, ghn=ghn: ghn([pool.encoded(index, ghn.config)])[0]  # noqa: E731
        grads = gradients(params_of, list(ghn.named_parameters()), pool, source, config, args.batches)
        cosines, similar = agreement(grads), similarity(ghn, pool)
        print(json.dumps({"start": label, "gradient cosine": cosines, "predicted weights' cosine": similar}, indent=1))
        rows.append(row(label, cosines, similar))
    # the direct control's start: one tensor per name, each architecture its corner (shared_weights.py)
    torch.manual_seed(0)
    shared = {name: value.requires_grad_(True) for name, value in shared_init(pool, list(range(len(pool)))).items()}
    own = [pool.initialised(index) for index in range(len(pool))]
    grads = gradients(lambda index: corners_for(shared, own[index]), [], pool, source, config, args.batches)
    label, cosines = "shared weights (shared_weights.py)", agreement(grads)
    print(json.dumps({"start": label, "gradient cosine": cosines}, indent=1))
    rows.append(row(label, cosines, None))
    print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()

"""What balancing a prediction's logits does at step 0 (issue #45, item 3): a hypernetwork's
prediction alone against the same with its output layer's bias shifted so that, over unlabelled
images, every class has the same mean predicted probability
(:func:`graphkit.ghn.calibrate.balance_logits`), per architecture, beside each model's own init.

On the architectures a hypernetwork covers little, its prediction gives every image nearly the
same features and its head one confident guess for all (docs/experiments.md, "Two seeds and the
logits' temperature"); balancing takes that guess out and keeps what tells the images apart. This
script scores, on ``family_archs.py``'s probed architectures (the shuffle's first 4, trained by
its runs; the family's last 8, never trained; the first of each held-out family of the zoo), the
prediction as it is; balanced on 128 or 8 training images (labels unused) or on 128 images of
Gaussian noise (whether the task's images are needed); and, the simpler shift first tried, with
its mean logit over the 128 images made the same for every class: loss / accuracy on held-out
digits, and on how many each beats the own init's loss. ``eval-ghn --balance-logits`` takes the
balanced start on to 100 and 300 steps.

    .venv/bin/python experiments/balanced_logits.py runs/zoo-vits-mini-vision_transformer-32-... --parts unseen held
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from family_archs import PROBED_TRAINED, shuffled_ids  # noqa: E402
from zoo_pools import KINDS, first_of_each, scored_model  # noqa: E402

from graphkit.errors import GraphkitError  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.calibrate import balance_logits, balanced_head  # noqa: E402
from graphkit.ghn.pool import ArchPool, graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402

BATCH = 32
#: the starts scored: the inputs each is shifted on, and how (None: the prediction as it is)
STARTS = {
    "prediction": None,
    "balanced on 128 images": ("images", 128, "balance"),
    "on 8": ("images", 8, "balance"),
    "on 128 of noise": ("noise", 128, "balance"),
    "mean logit centred on 128 images": ("images", 128, "centre"),
}


@torch.no_grad()
def centre_mean_logit(model: torch.nn.Module, graph, inputs: torch.Tensor) -> None:
    """The shift first tried: the output layer's bias less the mean logit over ``inputs`` (less
    its mean over the classes), so that every class has the same mean logit."""
    logits = model.eval()(inputs).mean(0)
    model.get_submodule(balanced_head(model, graph)).bias.sub_(logits - logits.mean())


def held_out_score(model: torch.nn.Module, held: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Loss and accuracy of ``model`` (in eval mode) over the held-out batches ``held``."""
    with torch.no_grad():
        logits = torch.cat([model.eval()(x) for x, _ in held])
    labels = torch.cat([y for _, y in held])
    return F.cross_entropy(logits, labels).item(), (logits.argmax(1) == labels).float().mean().item()


def shifting_inputs(source, record, kind: str, count: int) -> torch.Tensor:
    """``count`` training images of ``record``'s task (seed 1; the scored batches are seed 0's
    held-out split), or Gaussian noise of their shape."""
    generator = torch.Generator().manual_seed(1)
    batches = -(-count // BATCH)
    images = torch.cat([source.batch(record.config, min(count, BATCH), generator)[0] for _ in range(batches)])
    return images[:count] if kind == "images" else torch.randn(images.shape, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a hypernetwork checkpoint (a family_archs.py run, or a bundled one)")
    parser.add_argument("--family", default="vision_transformer")
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed (family_archs.py's)")
    parser.add_argument("--unseen", type=int, default=8, help="the family's last architectures, never trained")
    parser.add_argument("--parts", nargs="+", choices=["trained", "unseen", "held"], default=["trained", "unseen"])
    args = parser.parse_args()
    try:
        ghn = load_checkpoint(args.run)
    except GraphkitError as error:
        parser.error(f"run: {error}")
    zoo, recipe = KINDS["vision"]
    source = load_source(recipe["data"])
    records = {record.id: record for record in ArchPool(zoo, "train").records}
    ids = shuffled_ids(zoo, args.family, args.seed)
    held = first_of_each(ArchPool(zoo, "eval").records)
    records |= {record.id: record for record in held.values()}
    parts = {
        "trained": ids[:PROBED_TRAINED],
        "unseen": ids[len(ids) - args.unseen :],
        "held": [record.id for record in held.values()],
    }
    print(f"| {args.run.name} | " + " | ".join(f"{part} | wins" for part in args.parts) + " |")
    print("|---|" + "---|---|" * len(args.parts))
    rows: dict[str, list[str]] = {"own init": [], **{start: [] for start in STARTS}}
    for part in args.parts:
        scores: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        for arch in parts[part]:
            record = records[arch]
            graph = graph_for(record, ghn.config)
            model, held_out = scored_model(record, source, BATCH, None)
            scores["own init"].append(held_out_score(model, held_out))
            predicted, _ = scored_model(record, source, BATCH, predicted_params(ghn, graph))
            for start, inputs in STARTS.items():
                model = copy.deepcopy(predicted)
                if inputs is not None:
                    kind, count, how = inputs
                    shift = balance_logits if how == "balance" else centre_mean_logit
                    shift(model, graph, shifting_inputs(source, record, kind, count))
                scores[start].append(held_out_score(model, held_out))
            print(part, arch, {name: [round(v, 3) for v in s[-1]] for name, s in scores.items()}, flush=True)
        own = [loss for loss, _ in scores["own init"]]
        for name, by_arch in scores.items():
            mean = " / ".join(f"{statistics.mean(v[i] for v in by_arch):.2f}" for i in range(2))
            wins = "-" if name == "own init" else f"{sum(v[0] < o for v, o in zip(by_arch, own))} / {len(own)}"
            rows[name] += [mean, wins]
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

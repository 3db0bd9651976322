"""Where a 224-pixel ViT's head start goes (issue #45, item 4): fine-tuning with the patch
embedding's learning rate scaled by the area ratio of the resize that predicted it.

`graphkit predict` gives `vit_small_patch16_224` the kernel the bundled ViT checkpoint predicts at
patch 2, resized to 16 x 16 as FlexiViT does (`graphkit.ghn.grow`): each of its 256 weights per
channel is about 1/64 of a trained one. AdamW moves every weight by about lr a step whatever its
size, so at lr 3e-4 the resized kernel is rewritten within a few steps, and the prediction's head
start with it (`benchmarks/vit_resolution.py --only vit_small --big-steps 100`: 0.27 accuracy at
step 0, chance after 100 steps). Here the patch embedding trains at lr x (2 / 16)^2, everything
else at lr, for the own init and for the prediction alike, on the benchmark's batches.

    .venv/bin/python experiments/patch_lr.py                      # both inits, 100 steps (about 30 min on 2 cores)
    .venv/bin/python experiments/patch_lr.py --inits predicted --scale 1   # plain AdamW, the benchmark's arm

Copies: the training step of :func:`graphkit.training.loop.up_train` (AdamW, weight decay 0.01,
one batch a step), with the patch embedding in a parameter group of its own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from vit_resolution import BATCH_SIZE, BATCHES, CHECKPOINT, LR, built  # noqa: E402

from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source, output_loss  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

MODEL = "vit_small_patch16_224"
#: the trained patch over the model's: the resize spreads each trained weight over (16 / 2)^2 pixels
AREA_RATIO = (2 / 16) ** 2


def fine_tune(init: str, steps: int, scale: float, every: int) -> None:
    """Print held-out (loss, accuracy) of ``init`` every ``every`` steps of AdamW whose patch
    embedding trains at ``LR * scale``."""
    source = load_source("digits")
    model = built(MODEL, {})
    graph = trace(model)
    held_out, batches = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, steps)
    model = built(MODEL, {})
    if init == "predicted":
        predict(model, bundled_hypernetwork(CHECKPOINT), graph=graph)
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n.startswith("patch_embed.")], "lr": LR * scale},
        {"params": [p for n, p in named if not n.startswith("patch_embed.")], "lr": LR},
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    print(init, 0, "%.2f / %.2f" % score(model, held_out, "image"), flush=True)
    for step, (x, y) in enumerate(batches, start=1):
        model.train()
        loss, _ = output_loss("image", model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % every == 0 or step == steps:
            print(init, step, "%.2f / %.2f" % score(model, held_out, "image"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inits", default="own,predicted", help="own, predicted or both")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--scale", type=float, default=AREA_RATIO, help="the patch embedding's lr over the rest's")
    parser.add_argument("--every", type=int, default=50, help="steps between scores")
    args = parser.parse_args()
    for init in args.inits.split(","):
        fine_tune(init, args.steps, args.scale, args.every)


if __name__ == "__main__":
    main()

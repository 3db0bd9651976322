"""Where a 224-pixel ViT's head start goes (issue #45, item 4): fine-tuning with the resized
patch embedding's learning rate scaled by the area ratio of the resize that predicted it.

`graphkit predict` gives `vit_small_patch16_224` the kernel the bundled ViT checkpoint predicts at
patch 2, resized to 16 x 16 as FlexiViT does (`graphkit.ghn.grow`): each of its 256 weights per
channel is about 1/64 of a trained one. AdamW moves every weight by about lr a step whatever its
size, so at lr 3e-4 the resized kernel is rewritten within a few steps, and the prediction's head
start with it (`benchmarks/vit_resolution.py --only vit_small --big-steps 100`: 0.27 accuracy at
step 0, chance after 100 steps). Here the resized kernel trains at lr x (2 / 16)^2, the factor
`predict --out` records and `finetune --params` applies (`graphkit.ghn.grow.lr_scale`),
everything else at lr, on the benchmark's batches; `--one-lr` trains everything at lr.

    .venv/bin/python experiments/patch_lr.py                             # both inits, 100 steps (30 min, 2 cores)
    .venv/bin/python experiments/patch_lr.py --inits predicted --one-lr  # plain AdamW, the benchmark's arm
    .venv/bin/python experiments/patch_lr.py --model vit_base_patch16_224 --inits own --one-lr
    .venv/bin/python experiments/patch_lr.py --inits own --one-lr --lr 1e-3 --every 25  # an lr the own init learns at?
    .venv/bin/python experiments/patch_lr.py --model vit_tiny_patch16_224 --steps 400  # where the own init learns

The training batches are drawn as the steps need them (`common.batches_in_order`: the benchmark's
batches, without holding 400 of them at 224 px, 7.7 GB).

The own init trains under the same factors unless `--one-lr` says otherwise: the control that
tells what the optimiser does from what the prediction does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from vit_resolution import BATCH_SIZE, BATCHES, CHECKPOINT, LR, built  # noqa: E402

from graphkit.ghn.grow import lr_scale, twin_of  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402


def fine_tune(name: str, init: str, steps: int, one_lr: bool, every: int, lr: float) -> None:
    """Print held-out (loss, accuracy) of timm's ``name`` from ``init`` every ``every`` steps of
    AdamW at ``lr``, its resized kernel at the factor ``predict`` records unless ``one_lr``."""
    source = load_source("digits")
    model = built(name, {})
    graph = trace(model)
    held_out, batch_at = common.batches_in_order(source, model, BATCH_SIZE, BATCHES)
    ghn = bundled_hypernetwork(CHECKPOINT)
    twin = twin_of(ghn, graph)
    factors = {} if one_lr else lr_scale(graph, twin)
    model = built(name, {})
    if init == "predicted":
        predict(model, ghn, graph=graph, grow=twin or False)
    at = sorted({*range(0, steps + 1, every), steps})
    _, scores = up_train(model, "image", batch_at, steps, lr, held_out=held_out, at=at, lr_scale=factors)
    for step in at:
        arm = "one lr" if one_lr else f"lr factors {factors}"
        print(name, init, f"lr {lr:g},", arm, step, "%.2f / %.2f" % scores[step])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_small_patch16_224", help="a timm ViT, built with 10 classes")
    parser.add_argument("--inits", default="own,predicted", help="own, predicted or both")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--one-lr", action="store_true", help="train every parameter at lr (plain AdamW)")
    parser.add_argument("--every", type=int, default=50, help="steps between scores")
    parser.add_argument("--lr", type=float, default=LR, help=f"AdamW's learning rate (default: the benchmark's {LR:g})")
    args = parser.parse_args()
    for init in args.inits.split(","):
        fine_tune(args.model, init, args.steps, args.one_lr, args.every, args.lr)


if __name__ == "__main__":
    main()

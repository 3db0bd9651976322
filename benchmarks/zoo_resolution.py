"""The zoo's vision models at their published resolution (issue #45 item 4: "vision predictions beat
each model's own init at step 0 and after 100 steps at 8, 16, 32 and 224 px ... and the zoo's ViTs at
their published resolution").

`logah-tiny-zoo-vision` trained on zoo-vits-mini: timm's vision transformers shrunk to 32-128 px.
What a user brings is the model as timm builds it by default: 224 px, full width and depth. Here
each model below is built so (seed 0, ``pretrained=False``, 10 classes), predicted by the
checkpoint `predict` picks for it (`graphkit.ghn.checkpoint.bundled_for`; printed beside it), and
scored on scikit-learn's digits, held-out split, resized bilinearly to the model's resolution (as
`eval-ghn --data digits` gives them), from three starts:

- own init: the model as timm builds it;
- predicted: the prediction alone (`predict --no-keep-init`);
- W0 + s P: the prediction times ``--shrink`` added onto the own init (`predict --shrink`).

Every start's BatchNorm statistics are estimated on the first 4 training batches first, as
`eval-ghn` does (`graphkit.training.loop.estimate_batch_norm`). After step 0, each start is
fine-tuned ``--steps`` AdamW steps (lr 3e-4, batch 32, the same batches for every start).
The families are zoo-vision's training families, then four it holds out (at 224 px `predict`
refuses `efficientvit_b0`, the fifth: it runs its attention under `torch.autocast`, an op no
checkpoint trained on; ConViT, of a family no checkpoint trained on, goes to the one trained
across timm's families, since 2026-12-06: before, to the ViT checkpoint, whose ops cover it):

    .venv/bin/python benchmarks/zoo_resolution.py --steps 0 --write   # step 0 only (8 minutes on 2 cores)
    .venv/bin/python benchmarks/zoo_resolution.py --steps 100 --write \\
        --models levit_128s,efficientformerv2_s0,xcit_nano_12_p16_224  # three of them fine-tuned (CPU)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.ghn.checkpoint import bundled_for  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import estimate_batch_norm, up_train  # noqa: E402

#: timm model name -> whether zoo-vits-mini trains on its family (False: one of its held-out families)
MODELS = {
    "levit_128s": True,
    "efficientformerv2_s0": True,
    "pvt_v2_b0": True,
    "tiny_vit_5m_224": True,
    "swin_tiny_patch4_window7_224": True,
    "convit_tiny": False,
    "mobilevit_xxs": False,
    "xcit_nano_12_p16_224": False,
    "lowformer_b0": False,
}
BATCHES, BATCH_SIZE, LR, NORM_BATCHES = 4, 32, 3e-4, 4


def built(name: str) -> torch.nn.Module:
    """timm's ``name`` as it builds it by default, from seed 0, with 10 classes."""
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10)


def row(name: str, trained: bool, source, steps: int, shrink: float) -> str:
    """One model's table row: its checkpoint, then each start's loss / accuracy at 0 and ``steps``."""
    model = built(name)
    graph = trace(model)
    checkpoint = bundled_for(graph).name
    ghn = bundled_hypernetwork(checkpoint)
    held_out, train = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, max(steps, NORM_BATCHES))
    scores = {}
    for start in ("own init", "predicted", "shrunk"):
        model = built(name)
        if start != "own init":
            predict(model, ghn, graph=graph, keep_init=start == "shrunk", shrink=shrink if start == "shrunk" else None)
        estimate_batch_norm(model, [x for x, _ in train[:NORM_BATCHES]])
        _, scores[start] = up_train(model, "image", train.__getitem__, steps, LR, held_out=held_out, at=(0, steps))
    at = (0, steps) if steps else (0,)
    cells = [
        f"{scores[start][h][0]:.2f} / {scores[start][h][1]:.2f}"
        for h in at
        for start in ("own init", "predicted", "shrunk")
    ]
    family = "" if trained else " (held out)"
    return f"| `{name}`{family} | {checkpoint} | " + " | ".join(cells) + " |"


def table(steps: int, shrink: float, models: list[str]) -> str:
    """Each of ``models``' rows under a header naming the starts and horizons."""
    warnings.filterwarnings("ignore")
    source = load_source("digits")
    starts = ("own init", "predicted", f"W0 + {shrink:g} P")
    horizons = (0, steps) if steps else (0,)
    header = "| model | checkpoint | " + " | ".join(f"{s} @{h}" for h in horizons for s in starts) + " |"
    rows = [header, "|---|---|" + "---|" * len(starts) * len(horizons)]
    tic = time.perf_counter()
    for name in models:
        rows.append(row(name, MODELS[name], source, steps, shrink))
        print(rows[-1], flush=True)
    minutes = (time.perf_counter() - tic) / 60
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores ({minutes:.1f} min), torch "
        f"{torch.__version__}. timm's models as built by default (224 px), 10 classes; held-out digits, "
        f"loss / accuracy (chance: 2.30 / 0.10); fine-tuned {steps} AdamW steps, lr 3e-4, batch 32. Command: "
        f"`.venv/bin/python benchmarks/zoo_resolution.py --steps {steps} --shrink {shrink:g} "
        + (f"--models {','.join(models)} " if models != list(MODELS) else "")
        + "--write`.\n\n"
        + "\n".join(rows)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="AdamW fine-tuning steps after step 0 (0: none)")
    parser.add_argument("--shrink", type=float, default=0.5, help="the kept start's factor, W0 + S P (0 < S <= 1)")
    parser.add_argument("--models", help=f"a comma-separated few of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md (a section per --steps)")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else list(MODELS)
    if args.steps < 0 or not 0 < args.shrink <= 1 or not set(models) <= set(MODELS):
        raise SystemExit(
            f"--steps must be 0 or more, --shrink in (0, 1] and --models among {', '.join(MODELS)}; "
            f"got {args.steps}, {args.shrink} and {args.models}"
        )
    text = table(args.steps, args.shrink, models)
    print(text)
    if args.write:
        common.write_section(text, f"zoo_resolution_{args.steps}")


if __name__ == "__main__":
    main()

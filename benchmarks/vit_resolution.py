"""The resolutions and patch sizes users bring (issue #45 item 4): timm ViTs predicted by the
bundled ViT hypernetwork (8-pixel digits, patch 2 and 4: 4 x 4 and 2 x 2 tokens) against their
own init, at step 0 and after fine-tuning.

    .venv/bin/python benchmarks/vit_resolution.py          # print the table
    .venv/bin/python benchmarks/vit_resolution.py --write  # and update BENCHMARKS.md
    .venv/bin/python benchmarks/vit_resolution.py --hand-written --write  # the hand-written ViTs' section

Each model is timm's VisionTransformer built on the CPU from seed 0, with 10 classes, or one of
the variants timm registers (CLIP's pre-norm), or transformers' ViT or DeiT classifier, or a ViT
written by hand of torch's layers (`tests/model_files/torch_vit.py`, traced from its
`example_inputs()`; beside it, the timm ViT of its shape as the control). Its data
is scikit-learn's digits, held-out split, resized bilinearly to the model's resolution (as
`eval-ghn --data digits` gives them). Columns, held-out loss:

- own init: the model as timm builds it;
- decoded directly: the prediction at the model's own shapes (`predict --no-grow`);
- predicted: what `predict` writes by default; a patch size outside the trained ones is
  predicted at a trained one with the model's token grid and resized as FlexiViT does
  (`graphkit.ghn.grow`), a wider model grown from its twin;
- and after `--steps` AdamW steps (lr 3e-4, batch 32, the same batches for each), own init
  against predicted. The prediction fine-tunes a resized kernel at lr times the kernels' area
  ratio, as `finetune --params` does with `predict --out`'s file (`graphkit.ghn.grow.lr_scale`);
  where it has one, the own init is also fine-tuned under that optimiser ("own init, lr
  factors"), so that the prediction is not credited with what the optimiser does. Models at
  224 px are scored at step 0 only unless `--big-steps` says otherwise (a ViT-B step at 224 px
  takes seconds on a CPU): `--only vit_small --big-steps 100` fine-tunes ViT-S/16 alone,
  printed, not written.

`--temperatures` prints, instead, the control behind the output layer's factor on a finer token
grid (`graphkit.ghn.grow.logit_scale`): each such model's step-0 loss / accuracy with the
predicted output layer times 1 (unscaled), 1/2, 1/4, 1/10 and the grids' ratio `predict` uses.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.errors import UntrainedOpError  # noqa: E402
from graphkit.ghn.calibrate import output_layer  # noqa: E402
from graphkit.ghn.grow import logit_scale, lr_scale, twin_of  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.ghn.space import extent  # noqa: E402
from graphkit.modelfile import load_model_file  # noqa: E402
from graphkit.sources import load_model_source  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score, up_train  # noqa: E402

CHECKPOINT = "logah-tiny-vits"
#: ViT-S's width and heads at depth 6 (inside the trained width envelope only after growing)
SMALL = {"embed_dim": 384, "num_heads": 6, "depth": 6}
#: the widest trained at depth 6, the shape of the hand-written rows (tests/model_files/torch_vit.py)
HAND = {"embed_dim": 256, "num_heads": 4, "depth": 6}
#: label -> (timm model name, its keyword arguments): the issue's rows, then patch 16 at the trained grid
MODELS = {
    "ViT-S depth 6, 8 px, patch 2": ("vit_small_patch16_224", dict(SMALL, img_size=8, patch_size=2)),
    "ViT-S depth 6, 16 px, patch 4": ("vit_small_patch16_224", dict(SMALL, img_size=16, patch_size=4)),
    "ViT-S depth 6, 32 px, patch 8": ("vit_small_patch16_224", dict(SMALL, img_size=32, patch_size=8)),
    "ViT-S depth 6, 64 px, patch 16": ("vit_small_patch16_224", dict(SMALL, img_size=64, patch_size=16)),
    "ViT-S depth 6, 8 px, patch 4": ("vit_small_patch16_224", dict(SMALL, img_size=8, patch_size=4)),
    "ViT-S depth 6, 32 px, patch 4": ("vit_small_patch16_224", dict(SMALL, img_size=32, patch_size=4)),
    "ViT-S depth 6, 32 px, patch 2": ("vit_small_patch16_224", dict(SMALL, img_size=32, patch_size=2)),
    "`vit_small_patch16_224`, 224 px": ("vit_small_patch16_224", {}),
    "`vit_base_patch16_224`, 224 px": ("vit_base_patch16_224", {}),
    # timm's variants and transformers' ViTs as their libraries build them, at 224 px: grown through a
    # twin since 2026-12-01 (graphkit.families.vit.OPTIONS, graphkit.families.equivalents,
    # graphkit.ghn.grow.library_twin); before, decoded directly. Plain ViT-B/32 is CLIP's control
    "`vit_base_patch32_224`, 224 px": ("vit_base_patch32_224", {}),
    "`vit_base_patch32_clip_224` (pre-norm), 224 px": ("vit_base_patch32_clip_224", {}),
    "transformers' `ViTForImageClassification`, 224 px": ("hf:vit", {"num_labels": 10}),
    "transformers' `DeiTForImageClassification`, 224 px": ("hf:deit", {"num_labels": 10}),
    # layer scale, which the checkpoint never trained on: predicted as the plain twin with its gains at 1
    # since 2026-12-01 (graphkit.families.equivalents.plain_form); before, by logah-tiny-zoo-vision
    "ViT-S depth 6, 8 px, patch 2, layer scale": (
        "vit_small_patch16_224",
        dict(SMALL, img_size=8, patch_size=2, init_values=1e-5),
    ),
    "`deit3_small_patch16_224` (layer scale), 224 px": ("deit3_small_patch16_224", {}),
}
#: ``--hand-written``'s rows, a section of their own: ViTs written by hand of torch's layers, which no
#: config describes, predicted as a copy of themselves at a trained width, patch size and grid since
#: 2026-12-03 (graphkit.ghn.grow.copied_twin; before, decoded directly); the timm ViT of their shape first,
#: the control
HAND_WRITTEN = {
    "ViT depth 6, 256 wide, 32 px, patch 4": ("vit_small_patch16_224", dict(HAND, img_size=32, patch_size=4)),
    "the same by hand (torch layers), 32 px, patch 4": ("torch", {"IMAGE": 32, "PATCH": 4}),
    "the same by hand, 16 px, patch 4": ("torch", {"IMAGE": 16, "PATCH": 4}),
    "the same by hand, 224 px, patch 16": ("torch", {"IMAGE": 224, "PATCH": 16}),
    # wider than trained at its depth: grown from a copy of itself narrowed to 256 (6 heads of 64 -> 4)
    "ViT-S (12 x 384) by hand, 224 px, patch 16": (
        "torch",
        {"IMAGE": 224, "PATCH": 16, "WIDTH": 384, "DEPTH": 12, "HEADS": 6},
    ),
}
BATCHES, BATCH_SIZE, LR = 4, 32, 3e-4


def built(name: str, kwargs: dict) -> tuple[torch.nn.Module, torch.Tensor | None]:
    """The model from seed 0 and the inputs to trace it with (None: guessed): timm's ``name``
    with 10 classes, transformers' model type after ``hf:``, or, for ``torch``, the hand-written
    ViT of tests/model_files/torch_vit.py with the constants in ``kwargs`` (its ``IMAGE`` and
    ``PATCH``; ``WIDTH``, ``DEPTH`` and ``HEADS`` default to the :data:`HAND` shape)."""
    import timm

    torch.manual_seed(0)
    if name.startswith("hf:"):
        return load_model_source(name + "?" + "&".join(f"{k}={v}" for k, v in kwargs.items())).model, None
    if name == "torch":
        constants = {"WIDTH": HAND["embed_dim"], "DEPTH": HAND["depth"], "HEADS": HAND["num_heads"], **kwargs}
        names = ("IMAGE", "PATCH", "WIDTH", "DEPTH", "HEADS")
        text = (common.ROOT / "tests" / "model_files" / "torch_vit.py").read_text()
        text = text.replace(
            ", ".join(names) + " = 32, 4, 64, 2, 2",
            ", ".join(names) + " = " + ", ".join(str(constants[k]) for k in names),
        )
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "torch_vit.py"
            path.write_text(text)
            loaded = load_model_file(path)
        return loaded.model, loaded.example_inputs
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs), None


def row(label: str, name: str, kwargs: dict, source, steps: int) -> str:
    model, inputs = built(name, kwargs)
    graph = trace(model, inputs)
    size = extent(graph)
    held_out, train = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, steps, inputs)
    ghn = bundled_hypernetwork(CHECKPOINT)
    twin = twin_of(ghn, graph, model, inputs)
    factors = lr_scale(graph, twin)
    scores = {}
    arms = ("own init", "decoded directly", "predicted") + (("own init, lr factors",) if factors and steps else ())
    for init in arms:
        model, _ = built(name, kwargs)
        if init == "decoded directly":
            try:
                predict(model, ghn, graph=graph, grow=False, example_inputs=inputs)
            except UntrainedOpError:  # an op the checkpoint never trained on (layer scale): only its twin is predicted
                continue
            scores[init] = {0: score(model, held_out, "image")}
            continue
        if init == "predicted":
            predict(model, ghn, graph=graph, grow=twin or False, example_inputs=inputs)
        scale = factors if init in ("predicted", "own init, lr factors") else {}
        _, scores[init] = up_train(
            model, "image", train.__getitem__, steps, LR, held_out=held_out, at=(0, steps), lr_scale=scale
        )
    cells = [
        f"{scores[init][0][0]:.2f} / {scores[init][0][1]:.2f}" if init in scores else "refused" for init in arms[:3]
    ]
    if steps:
        cells += [
            f"{scores[init][steps][0]:.2f} / {scores[init][steps][1]:.2f}" if init in scores else "-"
            for init in ("own init", "own init, lr factors", "predicted")
        ]
    else:
        cells += ["not run"] * 3
    grid = size["grid"]
    return f"| {label} | {grid} x {grid} | " + " | ".join(cells) + " |"


FACTORS = (1.0, 0.5, 0.25, 0.1)


def temperatures(source, only: str) -> str:
    """Step-0 loss / accuracy of each model on a finer grid than the trained one, its predicted
    output layer divided back to unscaled and then times each of ``FACTORS`` and the grids' ratio."""
    ghn = bundled_hypernetwork(CHECKPOINT)
    rows = [
        "| model | tokens | " + " | ".join(f"head x {f:g}" for f in FACTORS) + " | head x the grids' ratio |",
        "|---|---|" + "---|" * (len(FACTORS) + 1),
    ]
    for label, (name, kwargs) in MODELS.items():
        model, inputs = built(name, kwargs)
        graph = trace(model, inputs)
        twin = twin_of(ghn, graph, model, inputs)
        ratio = 1.0 if twin is None else logit_scale(graph, twin)
        if ratio == 1 or (only and only not in label):
            continue
        held_out, _ = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, 0, inputs)
        predict(model, ghn, graph=graph, grow=twin, example_inputs=inputs)
        head = model.get_submodule(output_layer(graph))
        unscaled = {name: p.detach() / ratio for name, p in head.named_parameters()}
        cells = []
        for f in (*FACTORS, ratio):
            with torch.no_grad():
                for name, p in head.named_parameters():
                    p.copy_(unscaled[name] * f)
            loss, accuracy = score(model, held_out, "image")
            cells.append(f"{loss:.2f} / {accuracy:.2f}")
        grid = extent(graph)["grid"]
        rows.append(f"| {label} | {grid} x {grid} | " + " | ".join(cells[:-1]) + f" | {cells[-1]} (x {ratio:.2f}) |")
        print(rows[-1], flush=True)
    return "\n".join(rows) + "\n"


def table(args) -> str:
    if (args.only or args.temperatures) and args.write:
        raise SystemExit("--only and --temperatures print some rows; --write needs them all")
    source = load_source("digits")
    if args.temperatures:
        return temperatures(source, args.only)
    rows = [
        f"| model | tokens | own init @0 | decoded directly @0 | predicted @0 | own init @{args.steps} "
        f"| own init, lr factors @{args.steps} | predicted @{args.steps} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, (name, kwargs) in (HAND_WRITTEN if args.hand_written else MODELS).items():
        if args.only and args.only not in label:
            continue
        steps = args.big_steps if "224" in label else args.steps
        rows.append(row(label, name, kwargs, source, steps))
        print(rows[-1], flush=True)
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}, "
        f"checkpoint {CHECKPOINT} (trained at 8 px, patch 2 and 4: 4 x 4 and 2 x 2 tokens). Held-out digits, "
        f"loss / accuracy (chance: 2.30 / 0.10); fine-tuned {args.steps} AdamW steps "
        f"(224 px: {args.big_steps or 'not run'}), "
        "a resized kernel at lr times the kernels' area ratio for the prediction (and for 'own init, lr factors'). "
        f"Command: `.venv/bin/python benchmarks/vit_resolution.py{' --hand-written' if args.hand_written else ''} "
        "--write`.\n\n" + "\n".join(rows) + "\n"
    )


def options(parser) -> None:
    parser.add_argument("--steps", type=int, default=100, help="fine-tuning steps below 224 px")
    parser.add_argument("--big-steps", type=int, default=0, help="fine-tuning steps at 224 px (default: none)")
    parser.add_argument(
        "--hand-written", action="store_true", help="the ViTs written by hand, in a section of their own"
    )
    parser.add_argument("--only", default="", help="only the rows whose label holds this text (not with --write)")
    parser.add_argument(
        "--temperatures", action="store_true", help="print the output layer's factors at step 0 (not with --write)"
    )


if __name__ == "__main__":
    common.main(
        __doc__, "vit_resolution_hand_written" if "--hand-written" in sys.argv else "vit_resolution", table, options
    )

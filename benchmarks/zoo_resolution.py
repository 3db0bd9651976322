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

``--carry STEPS`` asks why: is it the resolution, or the full width and depth? Each model whose
parameters a resolution changes at most in attention-bias tables is built at its mini variant's
resolution (:func:`graphkit.datasets.zoo.mini_outcome`; full width and depth), predicted there, and
scored there and, with the same weights, at 224 px (``carried``: an ``(heads, n * n)`` bias table
resized bicubically to the 224-px model's grid, every other parameter as it is). The control that
must carry if any weights fit at that resolution do: the same model trained directly there for
STEPS AdamW steps (lr 1e-3), scored there and carried the same way; and, where no parameter
depends on the resolution, the same trained across the zoo's 32, 64 and 128 px in turn, scored at
224 px. BatchNorm statistics are estimated at each resolution before it is scored:

    .venv/bin/python benchmarks/zoo_resolution.py --carry 200 --write   # about 30 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.datasets.zoo import mini_outcome  # noqa: E402
from graphkit.ghn.checkpoint import bundled_for  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import estimate_batch_norm, score, up_train  # noqa: E402

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


#: the models whose parameters a resolution changes at most in (heads, n * n) attention-bias
#: tables, which --carry resizes (Swin's windows and ConViT's position table change otherwise)
CARRIED = (
    "efficientformerv2_s0",
    "tiny_vit_5m_224",
    "pvt_v2_b0",
    "levit_128s",
    "mobilevit_xxs",
    "xcit_nano_12_p16_224",
    "lowformer_b0",
)
DEFAULT_SIDE, CONTROL_LR = 224, 1e-3
#: the resolutions of the second control, the range the vision zoo trained at
ACROSS = (32, 64, 128)


def built(name: str, side: int | None = None) -> torch.nn.Module:
    """timm's ``name`` as it builds it by default, from seed 0, with 10 classes; at ``side``
    pixels where its class takes an ``img_size`` (None: its default; a class that takes none
    reads any resolution with the same parameters)."""
    import timm

    with torch.device("meta"):  # its class, for free
        cls = type(timm.create_model(name, pretrained=False))
    takes = (c for c in cls.__mro__ if issubclass(c, torch.nn.Module) and c is not torch.nn.Module)
    sized = side is not None and any("img_size" in inspect.signature(c).parameters for c in takes)  # LeViT's, a base's
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **({"img_size": side} if sized else {}))


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


def carried(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> torch.nn.Module:
    """``model`` holding ``weights``, another resolution's: each tensor as it is where the shapes
    agree, an (heads, n * n) attention-bias table resized bicubically to ``model``'s grid."""
    target = model.state_dict()
    for name, value in weights.items():
        shape = target[name].shape
        if value.shape != shape:
            if value.dim() != 2 or value.shape[0] != shape[0]:
                raise SystemExit(f"{name}: {tuple(value.shape)} at one resolution, {tuple(shape)} at the other")
            side, new = round(value.shape[1] ** 0.5), round(shape[1] ** 0.5)
            value = F.interpolate(value.reshape(1, -1, side, side), size=(new, new), mode="bicubic").reshape(shape)
        target[name] = value
    model.load_state_dict(target)
    return model


def scored(model: torch.nn.Module, source, side: int) -> tuple[float, float]:
    """``model``'s held-out loss and accuracy at ``side`` pixels, its BatchNorm statistics
    estimated there first (the script's held-out batches, drawn from seed 0 at that size)."""
    inputs = torch.zeros(1, 3, side, side)
    held_out, train = common.fixed_batches(source, model, BATCH_SIZE, BATCHES, NORM_BATCHES, inputs)
    estimate_batch_norm(model, [x for x, _ in train])
    return score(model, held_out, "image")


def carry_row(name: str, source, steps: int) -> str:
    """One model's --carry row: its mini variant's resolution, the own init at 224 px, the
    prediction made at 224 px, at the mini's resolution (scored there, then carried to 224 px),
    the directly trained control the same way, and, for a model whose parameters no resolution
    changes, one trained across :data:`ACROSS` (a step at each in turn) scored at 224 px."""
    side = json.loads(mini_outcome("timm", name)["row"]["config"])["image_size"]
    inputs = torch.zeros(1, 3, side, side)
    cells = [scored(built(name), source, DEFAULT_SIDE)]  # the own init
    model = built(name)
    predict(model, bundled_hypernetwork(bundled_for(trace(model)).name), keep_init=False)
    cells.append(scored(model, source, DEFAULT_SIDE))
    small = built(name, side)
    graph = trace(small, inputs)
    predict(small, bundled_hypernetwork(bundled_for(graph).name), graph=graph, keep_init=False, example_inputs=inputs)
    cells += [scored(small, source, side), scored(carried(small.state_dict(), built(name)), source, DEFAULT_SIDE)]
    small = built(name, side)  # the control
    _, train = common.fixed_batches(source, small, BATCH_SIZE, 0, steps, inputs)
    up_train(small, "image", train.__getitem__, steps, CONTROL_LR)
    cells += [scored(small, source, side), scored(carried(small.state_dict(), built(name)), source, DEFAULT_SIDE)]
    shapes = {k: v.shape for k, v in built(name).state_dict().items()}
    if all(shapes[k] == v.shape for k, v in small.state_dict().items()):  # the same parameters at any size
        model = built(name)
        drawn = [common.fixed_batches(source, model, BATCH_SIZE, 0, steps, torch.zeros(1, 3, s, s))[1] for s in ACROSS]
        up_train(model, "image", lambda i: drawn[i % len(ACROSS)][i], steps, CONTROL_LR)
        cells.append(scored(model, source, DEFAULT_SIDE))
    family = "" if MODELS[name] else " (held out)"
    shown = [f"{loss:.2f} / {acc:.2f}" for loss, acc in cells] + ["-"] * (7 - len(cells))
    return f"| `{name}`{family} | {side} px | " + " | ".join(shown) + " |"


def carry_table(steps: int, models: list[str]) -> str:
    """--carry's table: each of ``models`` (those of :data:`CARRIED`) at its mini's resolution and at 224 px."""
    warnings.filterwarnings("ignore")
    source = load_source("digits")
    rows = [
        "| model | the mini's side | own init @224 | predicted @224 | predicted at the mini's side | it @224 "
        f"| trained {steps} steps at the mini's side | it @224 | trained {steps} steps across "
        f"{', '.join(map(str, ACROSS))} px, @224 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    tic = time.perf_counter()
    for name in models:
        rows.append(carry_row(name, source, steps))
        print(rows[-1], flush=True)
    minutes = (time.perf_counter() - tic) / 60
    return (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores ({minutes:.1f} min), torch "
        f"{torch.__version__}. timm's models at full width and depth, 10 classes, built at their mini zoo "
        "variant's resolution and at 224 px; held-out digits, loss / accuracy (chance: 2.30 / 0.10), "
        "BatchNorm statistics estimated at each resolution; the prediction alone; the control trained "
        f"{steps} AdamW steps at lr {CONTROL_LR:g}, batch {BATCH_SIZE}. Command: "
        f"`.venv/bin/python benchmarks/zoo_resolution.py --carry {steps} "
        + (f"--models {','.join(models)} " if models != list(CARRIED) else "")
        + "--write`.\n\n"
        + "\n".join(rows)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="AdamW fine-tuning steps after step 0 (0: none)")
    parser.add_argument("--shrink", type=float, default=0.5, help="the kept start's factor, W0 + S P (0 < S <= 1)")
    parser.add_argument("--models", help=f"a comma-separated few of {', '.join(MODELS)} (default: all)")
    parser.add_argument(
        "--carry", type=int, metavar="STEPS", help="predict at the mini's resolution, carry to 224 px (control: STEPS)"
    )
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md (a section per --steps)")
    args = parser.parse_args()
    allowed = CARRIED if args.carry is not None else tuple(MODELS)
    models = args.models.split(",") if args.models else list(allowed)
    if (
        args.steps < 0
        or not 0 < args.shrink <= 1
        or not set(models) <= set(allowed)
        or (args.carry is not None and args.carry < 1)
    ):
        raise SystemExit(
            f"--steps must be 0 or more, --carry 1 or more, --shrink in (0, 1] and --models among "
            f"{', '.join(allowed)}; got {args.steps}, {args.carry}, {args.shrink} and {args.models}"
        )
    if args.carry is not None:
        text, key = carry_table(args.carry, models), "zoo_resolution_carry"
    else:
        text, key = table(args.steps, args.shrink, models), f"zoo_resolution_{args.steps}"
    print(text)
    if args.write:
        common.write_section(text, key)


if __name__ == "__main__":
    main()

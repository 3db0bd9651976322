"""Beyond the training space: the bundled hypernetworks on models wider and deeper than any they
trained on, as a user's ViT-B or GPT-2-Medium is.

Three tables, each a BENCHMARKS.md section per family (``--table`` picks):

- **extrapolation** (item 2): for hand-written out-of-space shapes (wider, deeper, both; "how far
  out" is the ratio to the widest width and the deepest depth trained) the held-out loss and
  accuracy at steps 0 and 100 (``--steps``) of AdamW fine-tuning from ``predict``'s parameters
  (wide models grown from their narrow twin, graphkit.ghn.grow), from the same prediction with
  its stream calibrated to the init's (``--calibrate``, graphkit.ghn.calibrate), and from the
  family's random initialisation (the reference), on the same batches.
- **paper** (item 3): ViT-S- and ViT-B-shaped models at digits resolution from ``predict``'s
  parameters, random and orthogonal initialisation at 0, 100 and 300 steps; a GPT-2-Medium-shaped
  model on the bundled text, the prediction alone (``predict --no-keep-init``), the prediction
  added onto GPT-2's own init (``--keep-init``, GPT-2's default: graphkit.ghn.keep_init) and
  random at 0 and 100 steps (``--steps`` runs longer, on a GPU with ``--device cuda``).
- **propagation** (item 1): at ViT-S/B/L's, GPT-2-Medium/Large/XL's and LLaMA shapes up to
  TinyLlama-1.1B's, on random inputs the calibration did not see, the residual stream's RMS at the
  last block, the share of it that varies from token to token and the logits' standard deviation:
  ``predict``'s model, the same prediction calibrated (``--calibrate``), and the family's init.
  For language models also the share on held-out text, and the control: the share of an in-space
  model trained directly, at 0, 50, 300 and 600 steps.

    .venv/bin/python benchmarks/ghn_extrapolation.py                      # print every table
    .venv/bin/python benchmarks/ghn_extrapolation.py --write              # also update BENCHMARKS.md
    .venv/bin/python benchmarks/ghn_extrapolation.py --family vit --table paper --write
    .venv/bin/python benchmarks/ghn_extrapolation.py --family vit --table paper --only ViT-S --write  # ViT-S alone
    .venv/bin/python benchmarks/ghn_extrapolation.py --family gpt2 --table paper --steps 300 --device cuda
    .venv/bin/python benchmarks/ghn_extrapolation.py --family vit --table paper --ghn runs/candidate  # not bundled

On 2 CPU cores: extrapolation about 35 min for ViTs and 25 for GPT-2s, paper 47 (ViT-S 17, ViT-B 29) and 40,
propagation a few minutes each (GPT-2 and LLaMA with their 10-minute control).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import copy
import warnings

import common  # noqa: E402
import torch

from graphkit.families import build_model, get_family, resolve_config
from graphkit.ghn import load_checkpoint, predict
from graphkit.ghn.calibrate import calibrate
from graphkit.ghn.checkpoint import bundled_checkpoint
from graphkit.ghn.evaluate import fine_tune, initialise
from graphkit.ghn.keep_init import keep_init_as_is
from graphkit.ghn.model import LoGAH
from graphkit.ghn.pool import as_read
from graphkit.ghn.predict import predicted_params
from graphkit.graph import ArchGraph
from graphkit.tracing import trace
from graphkit.training.data import default_source, load_source, output_loss

VIT = {"family": "vit", "image_size": 8, "patch_size": 2, "num_classes": 10}
GPT = {"family": "gpt2"}
LLAMA = {"family": "llama"}
#: (what it is, config): out-of-space shapes for fine-tuning; head size 64 unless the width is smaller
SHAPES = {
    "vit": [
        ("wider", dict(VIT, num_layers=3, hidden=768, heads=12)),
        ("wider", dict(VIT, num_layers=3, hidden=1024, heads=16)),
        ("deeper", dict(VIT, num_layers=18, hidden=256, heads=4)),
        ("both, ViT-S", dict(VIT, num_layers=12, hidden=384, heads=6)),
        ("both, ViT-B", dict(VIT, num_layers=12, hidden=768, heads=12)),
    ],
    "gpt2": [
        ("wider", dict(GPT, num_layers=3, hidden=512, heads=8)),
        ("deeper", dict(GPT, num_layers=18, hidden=128, heads=2)),
        ("both", dict(GPT, num_layers=12, hidden=384, heads=6)),
    ],
}
#: shapes people use, for the propagation table (images at 32 px, patch 4)
USER_SHAPES = {
    "vit": [
        ("ViT-S", dict(VIT, image_size=32, patch_size=4, num_layers=12, hidden=384, heads=6)),
        ("ViT-B", dict(VIT, image_size=32, patch_size=4, num_layers=12, hidden=768, heads=12)),
        ("ViT-L", dict(VIT, image_size=32, patch_size=4, num_layers=24, hidden=1024, heads=16)),
    ],
    "gpt2": [
        ("GPT-2-Medium", dict(GPT, num_layers=24, hidden=1024, heads=16)),
        ("GPT-2-Large", dict(GPT, num_layers=36, hidden=1280, heads=20)),
        ("GPT-2-XL", dict(GPT, num_layers=48, hidden=1600, heads=25)),
    ],
    "llama": [
        (
            "LLaMA, 16 heads on 4 key/value heads",
            dict(LLAMA, num_layers=16, hidden=1024, heads=16, kv_heads=4, mlp=2816),
        ),
        ("TinyLlama-1.1B", dict(LLAMA, num_layers=22, hidden=2048, heads=32, kv_heads=4, mlp=5632)),
    ],
}
#: a language model inside each checkpoint's training space, trained directly for the token-varying control
IN_SPACE = {
    "gpt2": dict(GPT, num_layers=6, hidden=128, heads=2),
    "llama": dict(LLAMA, num_layers=6, hidden=256, heads=4, kv_heads=2),
}
#: the direct training's horizons at which the control measures the share
TRAINED = (0, 50, 300, 600)
BATCH = {"vit": 32, "gpt2": 8, "llama": 8}
#: the tables, each a BENCHMARKS.md section per family: out-of-space fine-tuning, the paper's shapes, propagation
TABLES = ("extrapolation", "paper", "propagation")
#: the paper's experiment at small scale (``--table paper``, LoGAH's extrapolation study): its shapes, inits, horizons
PAPER = {
    "vit": (
        [
            ("ViT-S", dict(VIT, num_layers=12, hidden=384, heads=6)),
            ("ViT-B", dict(VIT, num_layers=12, hidden=768, heads=12)),
        ],
        ("predict", "random", "orthogonal"),
        (0, 100, 300),
    ),
    "gpt2": (
        [("GPT-2-Medium", dict(GPT, num_layers=24, hidden=1024, heads=16))],
        ("predict", "keep_init", "random"),
        (0, 100),
    ),
}


def traced(config: dict, ghn: LoGAH) -> ArchGraph:
    """The graph of the model of ``config`` as ``ghn`` reads it: traced on the meta device, with the
    init constants a checkpoint that decodes around them needs (read off the model built with weights)."""
    return as_read(trace(build_model(config, "meta")), config, ghn.config)


def how_far(config: dict, space: dict) -> str:
    """The shape's width and depth as multiples of the widest and deepest trained."""
    return f"{config['hidden'] / space['width'][1]:.1f}x wide, {config['num_layers'] / space['depth'][1]:.1f}x deep"


def fine_tuning(
    family: str,
    shapes: list[tuple[str, dict]],
    inits: tuple[str, ...],
    at: tuple[int, ...],
    device: str,
    checkpoint: Path,
) -> str:
    """A fine-tuning table of one family: for each shape, the held-out loss / accuracy after each
    step count in ``at`` from each initialisation in ``inits`` ("predict": ``predict``'s
    parameters; "calibrated": the same, calibrated; "keep_init": the same added onto the family's
    init; "random" and "orthogonal" as in eval-ghn). "predict" is the prediction alone, which is
    ``predict --no-keep-init`` for a family that keeps its init by default (GPT-2). ``checkpoint``:
    the family's bundled one, or a candidate for shipping."""

    ghn = load_checkpoint(checkpoint).to(device)
    source = load_source(default_source(family), seq_len=64)
    space = ghn.info["space"]
    heads = {
        "predict": "`predict --no-keep-init`" if get_family(family).keep_init else "`predict`",
        "calibrated": "`--calibrate`",
        "keep_init": "`--keep-init`",
        "random": "random",
        "orthogonal": "orthogonal",
    }
    rows = [
        f"**{family}** ({checkpoint.name}; trained widths {space['width'][0]}-{space['width'][1]}, "
        f"depths {space['depth'][0]}-{space['depth'][1]}), held-out "
        f"loss / accuracy at steps {', '.join(map(str, at))}:",
        "",
        "| shape | how far out | "
        + " | ".join(f"{heads[init]} @{h}" if h == at[0] else f"@{h}" for init in inits for h in at)
        + " |",
        "|---" * (2 + len(inits) * len(at)) + "|",
    ]
    wins, kept_wins = dict.fromkeys(at, 0), dict.fromkeys(at, 0)
    for what, config in shapes:
        config = resolve_config(config)
        graph = traced(config, ghn)
        generator = torch.Generator().manual_seed(0)
        held_out = [
            [t.to(device) for t in source.batch(config, BATCH[family], generator, split="eval")] for _ in range(4)
        ]
        batches = [[t.to(device) for t in source.batch(config, BATCH[family], generator)] for _ in range(max(at))]
        cells, loss = [], {}
        predicted = predicted_params(ghn, graph)
        for init in inits:
            torch.manual_seed(0)
            model = build_model(config, "cpu")
            initialise(
                model, "predicted" if init in ("predict", "calibrated") else init, predicted
            )  # keep_init: W0 + P
            if init == "calibrated":
                calibrate(model, graph)
            _, scores = fine_tune(model.to(device), batches, source.task, 3e-4, held_out, list(at))
            loss[init] = {h: scores[h][0] for h in at}
            cells += [f"{scores[h][0]:.2f} / {scores[h][1]:.2f}" for h in at]
            del model
        for h in at:
            wins[h] += loss["predict"][h] < loss["random"][h]
            kept_wins[h] += "keep_init" in loss and loss["keep_init"][h] < loss["random"][h]
        name = f"{config['num_layers']} x {config['hidden']}, {config['heads']} heads ({what})"
        rows.append(f"| {name} | {how_far(config, space)} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    rows += [
        "",
        "`predict`'s parameters beat random on "
        + ", ".join(f"{wins[h]}/{len(shapes)} shapes at step {h}" for h in at)
        + "."
        + (
            " With the init kept (`--keep-init`): "
            + ", ".join(f"{kept_wins[h]}/{len(shapes)} at step {h}" for h in at)
            + "."
            if "keep_init" in inits
            else ""
        ),
        "",
    ]
    return "\n".join(rows)


def stream_statistics(model, family: str, inputs) -> tuple[float, float, float]:
    """The last block's residual-stream RMS, the share of it that varies across tokens, and the
    logits' standard deviation, on ``inputs``."""

    last = model.get_submodule(get_family(family).blocks)[-1]
    seen = []
    hook = last.register_forward_hook(lambda module, args, out: seen.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    hook.remove()
    stream, logits = seen[0].float(), (out.logits if hasattr(out, "logits") else out).float()
    varying = (stream - stream.mean(dim=1, keepdim=True)).pow(2).mean() / stream.pow(2).mean()
    return stream.pow(2).mean().sqrt().item(), varying.item(), logits.std().item()


def propagation(family: str, checkpoint: Path) -> str:
    """The propagation table of one family: ``predict``'s model, the same prediction calibrated
    (``--calibrate``), and the family's init, measured on a batch the calibration did not see (random
    images, or random token ids over the whole vocabulary). For a language model also the
    token-varying share on held-out text, where the hypernetwork's own tokens (bytes) are, and the
    same share of a model trained directly (:func:`trained_shares`), the control that says what
    share trained models have."""

    ghn = load_checkpoint(checkpoint)
    text = family != "vit"
    source = load_source(default_source(family), seq_len=64) if text else None
    rows = [
        "| shape | stream RMS: `predict` / `--calibrate` / init | token-varying share | logit std |"
        + (" token-varying share on held-out text: `predict` / init |" if text else ""),
        "|---" * (5 if text else 4) + "|",
    ]
    shapes = USER_SHAPES[family] + ([("in the training space", IN_SPACE[family])] if text else [])
    for name, config in shapes:
        config = resolve_config(config)
        generator = torch.Generator().manual_seed(1)  # the calibration batch is seed 0's
        inputs = (
            torch.randn(4, 3, config["image_size"], config["image_size"], generator=generator)
            if not text
            else {"input_ids": torch.randint(0, config["vocab_size"], (4, 64), generator=generator)}
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the init calibrate() reads, built once for both
            init_model = build_model(config, "cpu").eval()
        init = stream_statistics(init_model, family, inputs)
        graph = traced(config, ghn)
        model = copy.deepcopy(
            init_model
        )  # a built model, as a user's is (its computed buffers, e.g. rotary, are there)
        predict(model, ghn, graph=graph, keep_init=keep_init_as_is(graph, ghn.info))  # the prediction as a model
        raw = stream_statistics(model.eval(), family, inputs)
        cells = [f"{r:.2f} ({r / i:.1f}x) / {{}} / {i:.2f}" for r, i in zip(raw, init)]
        if text:
            held_out = {"input_ids": source.batch(config, 4, generator, split="eval")[0]}
            shares = [stream_statistics(m, family, held_out)[1] for m in (model, init_model)]
        calibrate(model, graph, reference=init_model)
        got = stream_statistics(model.eval(), family, inputs)
        cells = [cell.format(f"{p:.2f} ({p / i:.1f}x)") for cell, p, i in zip(cells, got, init)]
        if text:
            cells.append(f"{shares[0]:.2f} ({shares[0] / shares[1]:.1f}x) / {shares[1]:.2f}")
        rows.append(f"| {name} ({config['num_layers']} x {config['hidden']}) | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
        del model, init_model
    if text:
        rows += ["", trained_shares(family, source)]
    return "\n".join(rows) + "\n"


def trained_shares(family: str, source) -> str:
    """The control for the token-varying target: the in-space model's share on held-out text
    while it is trained directly from its init (AdamW lr 3e-4, the framework's own batches),
    at the steps in :data:`TRAINED`."""

    config = resolve_config(IN_SPACE[family])
    generator = torch.Generator().manual_seed(1)
    held_out = {"input_ids": source.batch(config, 4, generator, split="eval")[0]}
    torch.manual_seed(0)
    model = build_model(config, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(0)
    shares = {}
    for step in range(max(TRAINED) + 1):
        if step in TRAINED:
            shares[step] = stream_statistics(model.eval(), family, held_out)[1]
        if step == max(TRAINED):
            break
        x, y = source.batch(config, BATCH[family], generator)
        loss, _ = output_loss(source.task, model.train()(input_ids=x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (
        f"Trained directly, the same in-space {config['num_layers']} "
        f"x {config['hidden']} model's token-varying share on "
        "held-out text is " + ", ".join(f"{shares[h]:.2f} at step {h}" for h in TRAINED) + ".\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md (a section a table and family)")
    parser.add_argument("--family", choices=sorted(USER_SHAPES), action="append", help="only this family (repeatable)")
    parser.add_argument(
        "--table",
        choices=TABLES,
        action="append",
        help="only this table (repeatable; default: every table the family has)",
    )
    parser.add_argument(
        "--steps", type=int, help="the last fine-tuning horizon (default: 100; paper: 300 for ViTs, 100 for GPT-2s)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the fine-tuning tables)")
    parser.add_argument(
        "--only",
        default="",
        help="only the fine-tuning tables' shapes whose label holds one of these texts (comma-separated; "
        "`--table paper --only ViT-S` leaves out ViT-B, 29 of the table's 47 minutes on 2 CPU cores)",
    )
    parser.add_argument(
        "--ghn",
        type=Path,
        help="a checkpoint folder in place of the family's bundled one (a candidate's regressions: printed only)",
    )
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.ghn is not None:
        if args.write:
            parser.error("--ghn is printed only: BENCHMARKS.md records the bundled checkpoints")
        if not (args.ghn / "config.json").is_file():
            parser.error(f"--ghn {args.ghn}: no config.json there (not a checkpoint folder)")

    warnings.filterwarnings("ignore")
    where = f"a GPU ({torch.cuda.get_device_name()})" if args.device != "cpu" else f"{common.cores()} CPU cores"
    for family in args.family or USER_SHAPES:
        checkpoint = args.ghn or bundled_checkpoint(family)
        for name in args.table or TABLES:
            if name != "propagation" and family not in SHAPES:
                continue  # the fine-tuning tables are the ViTs and GPT-2s
            command = f"benchmarks/ghn_extrapolation.py --family {family} --table {name} --write"
            text = f"Measured {time.strftime('%Y-%m-%d')} on {where}; "
            if name == "propagation":
                text += f"forward passes only. Command: `.venv/bin/python {command}`.\n\n" + propagation(
                    family, checkpoint
                )
            else:
                shapes, inits, at = (
                    PAPER[family]
                    if name == "paper"
                    else (SHAPES[family], ("predict", "calibrated", "random"), (0, 100))
                )
                if args.steps is not None:
                    at = tuple(sorted({0, *(h for h in at if h < args.steps), args.steps}))
                if args.only:
                    shapes = [(what, c) for what, c in shapes if any(p in what for p in args.only.split(","))]
                    if not shapes:
                        parser.error(f"--only {args.only!r}: no {name} shape of {family} has such a label")
                    command += f" --only {args.only!r}"
                text += (
                    "AdamW lr 3e-4, the same batches for every initialisation. "
                    f"Command: `.venv/bin/python {command}`.\n\n"
                    + fine_tuning(family, shapes, inits, at, args.device, checkpoint)
                )
            print(text, flush=True)
            if args.write:  # one section a table and family, so that rerunning one leaves the others
                common.write_section(text, f"ghn_{name}_{family}")


if __name__ == "__main__":
    main()

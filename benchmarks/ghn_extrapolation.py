"""Beyond the training space: the bundled hypernetworks on models wider and deeper than any they
trained on, as a user's ViT-B or GPT-2-Medium is (issue #25).

Two tables:

- **Fine-tuning** (items 2 and 3): for hand-written out-of-space shapes (wider, deeper, both;
  "how far out" is the ratio to the widest width and the deepest depth trained) the held-out
  loss and accuracy at steps 0 and ``--steps`` of AdamW fine-tuning from ``predict``'s
  parameters (wide models grown from their narrow twin, graphkit.ghn.grow), from the same
  prediction with its stream calibrated to the init's (``--calibrate``, graphkit.ghn.calibrate),
  and from the family's random initialisation (the reference), on the same batches.
- **Propagation** (item 1): at ViT-S/B/L's and GPT-2-Medium/Large/XL's shapes, on random inputs
  the calibration did not see, the residual stream's RMS at the last block, the share of it that
  varies from token to token and the logits' standard deviation: ``predict``'s model, the same
  prediction calibrated (``--calibrate``), and the family's init.

    .venv/bin/python benchmarks/ghn_extrapolation.py                 # print both tables
    .venv/bin/python benchmarks/ghn_extrapolation.py --write         # also update BENCHMARKS.md (a section a family)
    .venv/bin/python benchmarks/ghn_extrapolation.py --steps 300 --family vit

Runs on the CPU in about 75 minutes on 2 cores at the default 100 steps; ``--device cuda`` on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

VIT = {"family": "vit", "image_size": 8, "patch_size": 2, "num_classes": 10}
GPT = {"family": "gpt2"}
#: (what it is, config): out-of-space shapes for fine-tuning; head size 64 unless the width is smaller
SHAPES = {
    "vit": [("wider", dict(VIT, num_layers=3, hidden=768, heads=12)),
            ("wider", dict(VIT, num_layers=3, hidden=1024, heads=16)),
            ("deeper", dict(VIT, num_layers=18, hidden=256, heads=4)),
            ("both, ViT-S", dict(VIT, num_layers=12, hidden=384, heads=6)),
            ("both, ViT-B", dict(VIT, num_layers=12, hidden=768, heads=12))],
    "gpt2": [("wider", dict(GPT, num_layers=3, hidden=512, heads=8)),
             ("deeper", dict(GPT, num_layers=18, hidden=128, heads=2)),
             ("both", dict(GPT, num_layers=12, hidden=384, heads=6))],
}
#: shapes people use, for the propagation table (images at 32 px, patch 4)
USER_SHAPES = {
    "vit": [("ViT-S", dict(VIT, image_size=32, patch_size=4, num_layers=12, hidden=384, heads=6)),
            ("ViT-B", dict(VIT, image_size=32, patch_size=4, num_layers=12, hidden=768, heads=12)),
            ("ViT-L", dict(VIT, image_size=32, patch_size=4, num_layers=24, hidden=1024, heads=16))],
    "gpt2": [("GPT-2-Medium", dict(GPT, num_layers=24, hidden=1024, heads=16)),
             ("GPT-2-Large", dict(GPT, num_layers=36, hidden=1280, heads=20)),
             ("GPT-2-XL", dict(GPT, num_layers=48, hidden=1600, heads=25))],
}
BATCH = {"vit": 32, "gpt2": 8}


def how_far(config: dict, space: dict) -> str:
    """The shape's width and depth as multiples of the widest and deepest trained."""
    return f"{config['hidden'] / space['width'][1]:.1f}x wide, {config['num_layers'] / space['depth'][1]:.1f}x deep"


def fine_tuning(family: str, steps: int, device: str) -> str:
    """The fine-tuning table of one family."""
    import torch

    from graphkit.families import build_model, resolve_config
    from graphkit.ghn import load_checkpoint
    from graphkit.ghn.checkpoint import bundled_checkpoint
    from graphkit.ghn.data import default_source, load_source
    from graphkit.ghn.evaluate import fine_tune, initialise
    from graphkit.ghn.calibrate import calibrate
    from graphkit.ghn.predict import predicted_params
    from graphkit.tracing import trace

    ghn = load_checkpoint(bundled_checkpoint(family)).to(device)
    source = load_source(default_source(family), seq_len=64)
    space = ghn.info["space"]
    rows = [f"**{family}** ({bundled_checkpoint(family)}; trained widths {space['width'][0]}-{space['width'][1]}, depths "
            f"{space['depth'][0]}-{space['depth'][1]}), held-out loss / accuracy at steps 0 and {steps}:", "",
            f"| shape | how far out | `predict` @0 | @{steps} | `--calibrate` @0 | @{steps} | random @0 | @{steps} |",
            "|---|---|---|---|---|---|---|---|"]
    wins = {0: 0, steps: 0}
    for what, config in SHAPES[family]:
        config = resolve_config(config)
        graph = trace(build_model(config, "meta"))
        generator = torch.Generator().manual_seed(0)
        held_out = [[t.to(device) for t in source.batch(config, BATCH[family], generator, split="eval")] for _ in range(4)]
        batches = [[t.to(device) for t in source.batch(config, BATCH[family], generator)] for _ in range(steps)]
        cells, loss = [], {}
        predicted = predicted_params(ghn, graph)
        for init in ("predict", "calibrated", "random"):
            torch.manual_seed(0)
            model = build_model(config, "cpu")
            if init != "random":
                initialise(model, "predicted", predicted)
            if init == "calibrated":
                calibrate(model, graph)
            _, scores = fine_tune(model.to(device), batches, source.task, 3e-4, held_out, [0, steps])
            loss[init] = {h: scores[h][0] for h in (0, steps)}
            cells += [f"{scores[h][0]:.2f} / {scores[h][1]:.2f}" for h in (0, steps)]
        for h in wins:
            wins[h] += loss["predict"][h] < loss["random"][h]
        name = f"{config['num_layers']} x {config['hidden']}, {config['heads']} heads ({what})"
        rows.append(f"| {name} | {how_far(config, space)} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    n = len(SHAPES[family])
    rows += ["", f"`predict`'s parameters beat random on {wins[0]}/{n} shapes at step 0 and {wins[steps]}/{n} at step {steps}.", ""]
    return "\n".join(rows)


def stream_statistics(model, family: str, inputs) -> tuple[float, float, float]:
    """The last block's residual-stream RMS, the share of it that varies across tokens, and the
    logits' standard deviation, on ``inputs``."""
    import torch

    from graphkit.families import get_family

    last = model.get_submodule(get_family(family).blocks)[-1]
    seen = []
    hook = last.register_forward_hook(lambda module, args, out: seen.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    hook.remove()
    stream, logits = seen[0].float(), (out.logits if hasattr(out, "logits") else out).float()
    varying = (stream - stream.mean(dim=1, keepdim=True)).pow(2).mean() / stream.pow(2).mean()
    return stream.pow(2).mean().sqrt().item(), varying.item(), logits.std().item()


def propagation(family: str) -> str:
    """The propagation table of one family: ``predict``'s model, the same prediction calibrated
    (``--calibrate``), and the family's init, measured on a batch the calibration did not see."""
    import torch

    from graphkit.families import build_model
    from graphkit.ghn import load_checkpoint, predict
    from graphkit.ghn.calibrate import calibrate
    from graphkit.ghn.checkpoint import bundled_checkpoint
    from graphkit.tracing import trace

    ghn = load_checkpoint(bundled_checkpoint(family))
    rows = ["| shape | stream RMS: `predict` / `--calibrate` / init | token-varying share | logit std |", "|---|---|---|---|"]
    for name, config in USER_SHAPES[family]:
        generator = torch.Generator().manual_seed(1)  # the calibration batch is seed 0's
        inputs = (torch.randn(4, 3, config["image_size"], config["image_size"], generator=generator) if family == "vit"
                  else {"input_ids": torch.randint(0, 50257, (4, 64), generator=generator)})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the init calibrate() reads, built once for both
            init_model = build_model(config, "cpu").eval()
        init = stream_statistics(init_model, family, inputs)
        model = build_model(config, "meta")
        graph = trace(model)
        predict(model, ghn, graph=graph)
        raw = stream_statistics(model.eval(), family, inputs)
        calibrate(model, graph, reference=init_model)
        got = stream_statistics(model.eval(), family, inputs)
        rows.append(f"| {name} ({config['num_layers']} x {config['hidden']}) | " + " | ".join(
            f"{r:.2f} ({r / i:.1f}x) / {p:.2f} ({p / i:.1f}x) / {i:.2f}" for p, r, i in zip(got, raw, init)) + " |")
        print(rows[-1], flush=True)
        del model, init_model
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--family", choices=sorted(SHAPES), action="append", help="only this family (repeatable)")
    parser.add_argument("--steps", type=int, default=100, help="fine-tuning steps (scored at 0 and here)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    where = f"a GPU ({torch.cuda.get_device_name()})" if args.device != "cpu" else f"{common.cores()} CPU cores"
    for family in args.family or SHAPES:
        text = "\n".join([f"Measured {time.strftime('%Y-%m-%d')} on {where}; AdamW lr 3e-4, the same batches for every "
                          f"initialisation. Command: `.venv/bin/python benchmarks/ghn_extrapolation.py --family {family} "
                          "--write`.", "", fine_tuning(family, args.steps, args.device), propagation(family)])
        print(text, flush=True)
        if args.write:  # one section a family, so that rerunning one leaves the other's
            common.write_section(text, f"ghn_extrapolation_{family}")


if __name__ == "__main__":
    main()

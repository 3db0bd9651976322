"""Which bundled checkpoint should predict a hand-written model (traced family ``custom``): the
nearest family's (logah-tiny-gpts for nanoGPT, logah-tiny-llamas for a LLaMA written by hand,
logah-tiny-vits for a ViT of torch's layers), or the one trained across families of its input
(logah-tiny-zoo-decoders, logah-tiny-zoo-vision). Until 2026-12-04 ``bundled_for`` gave every one
the family's; since then a hand-written decoder gets the decoders' zoo checkpoint
(``checkpoint.HAND_WRITTEN_FIRST``), on this table. Each model is fine-tuned from its own init and
from ``graphkit predict``'s start with each checkpoint (its default form: the prediction added onto
the init, or alone where the own logits saturate), over three seeds of the batches (byte tokens of
stdlib text; digits for the ViTs); every start of a seed sees the same batches. The models' own
inits are their seed-0 draws (nanoGPT seeds itself).

    .venv/bin/python benchmarks/hand_written_checkpoints.py           # about 20 minutes on 2 cores
    .venv/bin/python benchmarks/hand_written_checkpoints.py --write   # updates BENCHMARKS.md
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import grown_starts  # noqa: E402
import saturated_starts  # noqa: E402
import vit_resolution  # noqa: E402
from role_spectra import top_share  # noqa: E402

from graphkit.ghn import load_checkpoint, predict  # noqa: E402
from graphkit.ghn.checkpoint import bundled_for  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

TEXT = ("stdlib-text", 8, "logah-tiny-zoo-decoders")
IMAGES = ("digits", 32, "logah-tiny-zoo-vision")
#: label -> (how the model is built: nanoGPT of (layers, heads, width, vocabulary, context), a case
#: of saturated_starts.py, or vit_resolution.py's ViT of torch's layers with these constants; the
#: family checkpoint whose ops and space are nearest the model's; (data, batch size, the checkpoint
#: trained across families of its input))
CASES = {
    "nanoGPT 6 x 384 (wider than trained at its depth), tied": (
        ("nanogpt", "6, 6, 384, 256, 64"),
        "logah-tiny-gpts",
        TEXT,
    ),
    "nanoGPT 4 x 128, tied": (("nanogpt", "4, 4, 128, 256, 64"), "logah-tiny-gpts", TEXT),
    "examples/llama_block.py, tied": (("saturated", "examples/llama_block.py, tied"), "logah-tiny-llamas", TEXT),
    "examples/llama_block.py (untied)": (("saturated", "examples/llama_block.py (untied)"), "logah-tiny-llamas", TEXT),
    # at 16 px: 300 steps at 32 px take 4 minutes a start (on seed 0 there: 2.41 / 2.06 / 0.12 from the own init,
    # 1.64 / 1.08 / 0.35 from the ViT checkpoint, 2.39 / 2.35 / 0.75 across families)
    "ViT of torch layers, 6 x 256, 16 px, patch 4": (("torch", {"IMAGE": 16, "PATCH": 4}), "logah-tiny-vits", IMAGES),
}
#: the starts: no prediction (the own init), the nearest family's checkpoint's, the one trained
#: across families'
STARTS = ("own init", "nearest family's", "across families")
SEEDS, STEPS = (0, 1, 2), 300
HORIZONS = (0, 100, STEPS)


def build(label: str) -> tuple[torch.nn.Module, tuple | None]:
    """The case's model with its own init (seed 0), and its example inputs (None: guessed)."""
    (kind, spec), _, _ = CASES[label]
    if kind == "nanogpt":
        return grown_starts.build(spec), None
    if kind == "saturated":
        return saturated_starts.build(spec), None
    return vit_resolution.built(kind, spec)


def run(label: str, start: str, seed: int) -> dict[int, float]:
    """Held-out loss of ``label`` fine-tuned from ``start`` on seed ``seed``'s batches after each
    of HORIZONS AdamW steps."""
    torch.set_num_threads(1)
    model, inputs = build(label)
    _, family, (data, batch_size, across) = CASES[label]
    if start != "own init":
        predict(model, load_checkpoint(family if start == "nearest family's" else across), example_inputs=inputs)
    source = load_source(data, seq_len=64)
    held_out, batches = common.fixed_batches(source, model, batch_size, 4, STEPS, inputs, seed=seed)
    _, scores = up_train(model, source.task, batches.__getitem__, STEPS, 3e-4, held_out=held_out, at=HORIZONS)
    return {h: scores[h][0] for h in HORIZONS}


def largest_top_share(label: str, checkpoint: str | None) -> float:
    """The largest share of a block matrix's energy in its top singular direction, in the case's
    model as ``checkpoint`` predicts it alone (None: its own init). Near-rank-1 blocks, alike in
    every layer, are where nanoGPT's head start went (docs/experiments.md)."""
    model, inputs = build(label)
    if checkpoint is not None:
        predict(model, load_checkpoint(checkpoint), example_inputs=inputs, keep_init=False)
    return max(
        top_share(p)
        for name, p in model.named_parameters()
        if p.dim() == 2 and any(f".{blocks}." in f".{name}" for blocks in ("h", "blocks", "layers"))
    )


def table(args) -> str:
    results, measured = common.run_jobs(
        run, [(label, start, seed) for label in CASES for start in STARTS for seed in SEEDS]
    )
    lines = [
        f"{measured}; held-out loss at {' / '.join(map(str, HORIZONS))} "
        f"AdamW steps (lr 3e-4; batch {TEXT[1]} of 64 byte tokens of stdlib text, {IMAGES[1]} digits for the "
        f"ViTs), the mean of {len(SEEDS)} seeds of the batches. The next-to-last column is the loss from the "
        "checkpoint trained across families minus the family's: its mean, and in how many seeds it is lower; the "
        "last, the largest share of a block matrix's energy in its top singular direction, each checkpoint's "
        "prediction alone. Command: "
        "`.venv/bin/python benchmarks/hand_written_checkpoints.py --write`.",
        "",
        "| model | family's checkpoint | across families | `predict` uses | "
        + " | ".join(STARTS)
        + " | across families minus family's | a block matrix's top direction, most: own, family's, across |",
        "|---" * (len(STARTS) + 6) + "|",
    ]
    for label, (_, family, (_, _, across)) in CASES.items():
        cells = []
        for start in STARTS:
            means = [statistics.mean(results[(label, start, seed)][h] for seed in SEEDS) for h in HORIZONS]
            cells.append(" / ".join(f"{m:.2f}" for m in means))
        pairs = [(results[(label, STARTS[2], s)], results[(label, STARTS[1], s)]) for s in SEEDS]
        gaps = [[zoo[h] - own[h] for zoo, own in pairs] for h in HORIZONS]
        gap = " / ".join(f"{statistics.mean(g):+.2f} ({sum(d < 0 for d in g)} of {len(g)})" for g in gaps)
        model, inputs = build(label)
        used = bundled_for(trace(model, inputs)).name
        shares = " / ".join(f"{largest_top_share(label, c):.0%}" for c in (None, family, across))
        lines.append(f"| {label} | {family} | {across} | {used} | " + " | ".join(cells) + f" | {gap} | {shares} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    common.main(__doc__, "hand_written_checkpoints", table)

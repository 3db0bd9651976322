"""Which bundled checkpoint should predict a model no family checkpoint owns: the nearest
family's, or the one trained across families of its input (logah-tiny-zoo-decoders,
logah-tiny-zoo-vision). Three groups of models:

- ``hand-written`` (traced family ``custom``): nanoGPT and a LLaMA written by hand, whose nearest
  family's checkpoints are logah-tiny-gpts and logah-tiny-llamas, and a ViT of torch's layers
  (logah-tiny-vits). Until 2026-12-04 ``bundled_for`` gave every one the family's; since then a
  hand-written decoder gets the decoders' zoo checkpoint (``checkpoint.HAND_WRITTEN_FIRST``).
- ``library``: transformers' decoders and timm's models of a family other than GPT-2, LLaMA or
  ViT whose ops the family's checkpoint covers (Mistral, Qwen2, GPT-Neo, ConViT, ...), each as
  its mini zoo builds it (:func:`graphkit.datasets.zoo.mini_outcome`: the decoders at 256
  tokens). Until 2026-12-06 ``bundled_for`` gave them that family's checkpoint; since then a
  family's checkpoint only where it trained on their family, else the one trained across families.
- ``vocabularies``: four of those decoders at their own vocabularies (32,000 to 50,257 tokens),
  which the family checkpoints trained at and the decoders' zoo mostly did not: they start far
  lower from the family's, and are behind from it after 300 steps.

Each model is fine-tuned from its own init and from ``graphkit predict``'s start with each
checkpoint (its default form: the prediction added onto the init, or alone where the own logits
saturate), over three seeds of the batches (--seeds; byte tokens of stdlib text; digits for the vision
models); every start of a seed sees the same batches. The models' own inits are their seed-0 draws
(nanoGPT seeds itself).

    .venv/bin/python benchmarks/hand_written_checkpoints.py                  # about 25 minutes on 2 cores
    .venv/bin/python benchmarks/hand_written_checkpoints.py --group library  # about 8 minutes
    .venv/bin/python benchmarks/hand_written_checkpoints.py --group vocabularies --seeds 2  # 35 minutes
    .venv/bin/python benchmarks/hand_written_checkpoints.py --write          # updates BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
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

from graphkit.datasets.zoo import mini_outcome  # noqa: E402
from graphkit.families import build_model  # noqa: E402
from graphkit.ghn import load_checkpoint, predict  # noqa: E402
from graphkit.ghn.checkpoint import bundled_for  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

TEXT = ("stdlib-text", 8, "logah-tiny-zoo-decoders")
IMAGES = ("digits", 32, "logah-tiny-zoo-vision")
#: group -> label -> (how the model is built: nanoGPT of (layers, heads, width, vocabulary,
#: context), a case of saturated_starts.py, vit_resolution.py's ViT of torch's layers with these
#: constants, or a library's model as its mini zoo builds it; the family checkpoint whose ops and
#: space are nearest the model's; (data, batch size, the checkpoint trained across families of its
#: input))
GROUPS: dict[str, dict[str, tuple]] = {}
GROUPS["hand-written"] = {
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
#: a transformers decoder of 6 layers of 128 (4 heads, an MLP of 512), untied
LAYERS_6X128 = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "tie_word_embeddings": False,
}
#: the library models whose ops the GPT-2, LLaMA or ViT checkpoint covers (every such family of
#: transformers' decoders the decoder zoo trained on has a row but GLM's, Helium's and the like:
#: LLaMA's layout under another name; timm's are ConViT and NaFlexViT, ConViT held out of the zoo)
GROUPS["library"] = {
    **{
        f"transformers {model_type}": (("zoo", ("transformers", model_type)), family, TEXT)
        for model_type, family in (
            ("mistral", "logah-tiny-llamas"),
            ("qwen2", "logah-tiny-llamas"),
            ("phi3", "logah-tiny-llamas"),
            ("olmo2", "logah-tiny-llamas"),
            ("gpt_neo", "logah-tiny-gpts"),
            ("bloom", "logah-tiny-gpts"),
            ("biogpt", "logah-tiny-gpts"),
        )
    },
    "timm convit_tiny (held out of the zoo)": (("zoo", ("timm", "convit_tiny")), "logah-tiny-vits", IMAGES),
    "timm naflexvit_base_patch16_siglip": (
        ("zoo", ("timm", "naflexvit_base_patch16_siglip")),
        "logah-tiny-vits",
        IMAGES,
    ),
}
#: the decoders at their own vocabularies (the family checkpoints trained at 32,000 and 50,257
#: tokens, the decoders' zoo at bytes' 256 and some at their own), 6 layers of 128, inside both
#: spaces: a step at 50,257 tokens costs the head 50 times a byte vocabulary's (two seeds, 300 steps:
#: --seeds 2, 35 minutes)
GROUPS["vocabularies"] = {
    f"transformers {model_type}, 6 x 128, its {vocabulary:,} tokens": (
        ("config", {"family": "transformers", "model_type": model_type, "shrink": {**LAYERS_6X128, **shape}}),
        family,
        TEXT,
    )
    for model_type, family, vocabulary, shape in (
        ("mistral", "logah-tiny-llamas", 32000, {"num_key_value_heads": 2}),
        ("phi3", "logah-tiny-llamas", 32064, {"num_key_value_heads": 2}),
        (
            "gpt_neo",
            "logah-tiny-gpts",
            50257,
            {"num_layers": 6, "num_heads": 4, "attention_types": [[["global", "local"], 3]]},
        ),
        ("biogpt", "logah-tiny-gpts", 42384, {}),
    )
}
CASES = {label: case for group in GROUPS.values() for label, case in group.items()}
#: the starts: no prediction (the own init), the nearest family's checkpoint's, the one trained
#: across families'
STARTS = ("own init", "nearest family's", "across families")
SEEDS, STEPS = 3, 300


def horizons(steps: int) -> tuple[int, ...]:
    """The steps a run of ``steps`` is scored at: 0, 100 and its last."""
    return tuple(sorted({0, min(100, steps), steps}))


def build(label: str) -> tuple[torch.nn.Module, tuple | None]:
    """The case's model with its own init (seed 0), and its example inputs (None: guessed)."""
    (kind, spec), _, _ = CASES[label]
    if kind == "nanogpt":
        return grown_starts.build(spec), None
    if kind == "saturated":
        return saturated_starts.build(spec), None
    if kind in ("zoo", "config"):  # a library's model: its mini zoo's config, or one given
        config = json.loads(mini_outcome(*spec)["row"]["config"]) if kind == "zoo" else spec
        torch.manual_seed(0)
        return build_model(config, "cpu"), None
    return vit_resolution.built(kind, spec)


def run(label: str, start: str, seed: int, steps: int = STEPS) -> dict[int, float]:
    """Held-out loss of ``label`` fine-tuned from ``start`` on seed ``seed``'s batches after each
    of :func:`horizons` of ``steps`` AdamW steps."""
    torch.set_num_threads(1)
    model, inputs = build(label)
    _, family, (data, batch_size, across) = CASES[label]
    if start != "own init":
        predict(model, load_checkpoint(family if start == "nearest family's" else across), example_inputs=inputs)
    source = load_source(data, seq_len=64)
    held_out, batches = common.fixed_batches(source, model, batch_size, 4, steps, inputs, seed=seed)
    at = horizons(steps)
    _, scores = up_train(model, source.task, batches.__getitem__, steps, 3e-4, held_out=held_out, at=at)
    return {h: scores[h][0] for h in at}


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
    cases, seeds, at = GROUPS[args.group], range(args.seeds), horizons(args.steps)
    results, measured = common.run_jobs(
        run, [(label, start, seed, args.steps) for label in cases for start in STARTS for seed in seeds]
    )
    lines = [
        f"{measured}; held-out loss at {' / '.join(map(str, at))} "
        f"AdamW steps (lr 3e-4; batch {TEXT[1]} of 64 byte tokens of stdlib text, {IMAGES[1]} digits for the "
        f"ViTs), the mean of {len(seeds)} seeds of the batches. The next-to-last column is the loss from the "
        "checkpoint trained across families minus the family's: its mean, and in how many seeds it is lower; the "
        "last, the largest share of a block matrix's energy in its top singular direction, each checkpoint's "
        "prediction alone. Command: "
        f"`.venv/bin/python benchmarks/hand_written_checkpoints.py --group {args.group}"
        + (f" --steps {args.steps}" if args.steps != STEPS else "")
        + (f" --seeds {args.seeds}" if args.seeds != SEEDS else "")
        + " --write`.",
        "",
        "| model | family's checkpoint | across families | `predict` uses | "
        + " | ".join(STARTS)
        + " | across families minus family's | a block matrix's top direction, most: own, family's, across |",
        "|---" * (len(STARTS) + 6) + "|",
    ]
    for label, (_, family, (_, _, across)) in cases.items():
        cells = []
        for start in STARTS:
            means = [statistics.mean(results[(label, start, seed, args.steps)][h] for seed in seeds) for h in at]
            cells.append(" / ".join(f"{m:.2f}" for m in means))
        pairs = [
            (results[(label, STARTS[2], s, args.steps)], results[(label, STARTS[1], s, args.steps)]) for s in seeds
        ]
        gaps = [[zoo[h] - own[h] for zoo, own in pairs] for h in at]
        gap = " / ".join(f"{statistics.mean(g):+.2f} ({sum(d < 0 for d in g)} of {len(g)})" for g in gaps)
        model, inputs = build(label)
        used = bundled_for(trace(model, inputs)).name
        shares = " / ".join(f"{largest_top_share(label, c):.0%}" for c in (None, family, across))
        lines.append(f"| {label} | {family} | {across} | {used} | " + " | ".join(cells) + f" | {gap} | {shares} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    common.main(
        __doc__,
        lambda args: f"{args.group.replace('-', '_')}_checkpoints",
        table,
        options,
    )


def options(parser) -> None:
    """--group, --steps and --seeds, each checked where it enters."""

    def count(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text!r}")
        return int(text)

    parser.add_argument("--group", choices=sorted(GROUPS), default="hand-written", help="which models")
    parser.add_argument("--steps", type=count, default=STEPS, help=f"AdamW steps (default {STEPS})")
    parser.add_argument("--seeds", type=count, default=SEEDS, help=f"seeds of the batches (default {SEEDS})")


if __name__ == "__main__":
    main()

"""The zoo-decoders checkpoints on shapes users bring: a Mistral (a training family of the decoder
zoo) deeper or wider than the mini zoo's usual 2-4 layers of width 128-256, byte vocabulary,
untied, built from seed 0 with transformers' own init.

    .venv/bin/python benchmarks/zoo_decoder_shapes.py                          # about 15 min on 2 cores
    .venv/bin/python benchmarks/zoo_decoder_shapes.py --shapes 12x128 --write

For each shape (layers x width; heads of 64, a K/V head per 256 of width, MLP 2.75 times the
width), the held-out loss (4 batches of 8 windows of 64 bytes of stdlib-text) at step 0 and after
``--steps`` AdamW steps (lr 3e-4, batch 8, the same batches for every start) from the model's own
init, and from each checkpoint's prediction alone (``P``) and kept on the own init (``W0 + 0.5 P``,
what ``predict`` writes for these models). The reference approach is the own init, in the same run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import graphkit  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

TEXT = {"vocab_size": 256, "context": 64, "family": "transformers"}


def mistral(layers: int, width: int) -> torch.nn.Module:
    """The Mistral of this shape, built from seed 0."""
    import transformers  # noqa: PLC0415

    config = transformers.MistralConfig(
        vocab_size=256, hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 64,
        num_key_value_heads=max(1, width // 256), intermediate_size=int(width * 2.75) // 64 * 64,
        max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config)


def rows(shape: str, ghns: list[tuple[str, str]], steps: int) -> list[str]:
    """One table row per start for the ``LxW`` shape: loss at step 0 and at ``steps``."""
    layers, width = map(int, shape.split("x"))
    source = load_source("stdlib-text", seq_len=64)
    generator = torch.Generator().manual_seed(0)
    held_out = [source.batch(TEXT, 8, generator, split="eval") for _ in range(4)]
    batches = [source.batch(TEXT, 8, generator) for _ in range(steps)]
    model = mistral(layers, width)
    own = {name: p.detach().clone() for name, p in model.named_parameters()}
    graph = graphkit.trace(model)
    starts: dict[str, dict[str, torch.Tensor] | None] = {"own init": None}
    for label, checkpoint in ghns:
        predicted = predicted_params(load_checkpoint(checkpoint), graph)
        starts[f"{label}, P"] = predicted
        starts[f"{label}, W0 + 0.5 P"] = {n: own[n] + 0.5 * v if v.dim() >= 2 else v for n, v in predicted.items()}
    size = sum(p.numel() for p in model.parameters()) / 1e6
    out = []
    for label, params in starts.items():
        model = mistral(layers, width)
        if params is not None:
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(params[name])
        _, scores = up_train(model, "text", batches.__getitem__, steps, 3e-4, held_out=held_out, at=(0, steps))
        out.append(f"| {shape} ({size:.1f}M) | {label} | {scores[0][0]:.3f} | {scores[steps][0]:.3f} |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def table(args) -> str:
    ghns = common.checkpoints(args)
    lines = [line for shape in args.shapes for line in rows(shape, ghns, args.steps)]
    return "\n".join(
        [
            f"| shape | start | loss @0 | loss @{args.steps} |",
            "|---|---|---|---|",
            *lines,
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}. Command: "
            f"`.venv/bin/python benchmarks/zoo_decoder_shapes.py --shapes {' '.join(args.shapes)} "
            f"{' '.join(f'--ghn {s}' for s in args.ghn)} --steps {args.steps} --write`.",
            "",
        ]
    )


def options(parser) -> None:
    parser.add_argument("--shapes", nargs="*", default=["12x128", "3x512", "12x512"], help="layers x width")
    common.ghn_option(parser, "shipped=logah-tiny-zoo-decoders")
    parser.add_argument("--steps", type=int, default=100)


if __name__ == "__main__":
    torch.set_num_threads(common.cores())
    common.main(__doc__, "zoo_decoder_shapes", table, options)

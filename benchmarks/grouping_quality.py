"""Which heads to pool when converting to GQA: neighbours (mean) against heads grouped by
key norm, by K/V similarity or by search on calibration data, on trained models of every family;
and MLA at the same KV cache.

A ViT (digits), a GPT-2 and a LLaMA-style model (bundled stdlib text, byte tokens), 4 layers of
width 128 and 8 heads each, are trained directly for ``--steps`` AdamW steps, so that their heads
have structure to group by. Each is then converted to GQA with 2 K/V heads (a KV cache a quarter
of MHA's) by every grouping, with calibration inputs from the same bundled data (the train
split; the scores are on the eval split), and scored on held-out data right after conversion and
after ``--uptrain`` steps of training on the same batches for every grouping. The reference
approach is mean-pooling neighbouring heads (Ainslie et al., 2023), in the same run. MLA with
the same cache per token follows: a latent of 2 x 2 x head_dim numbers (exact RoPE for LLaMA),
and for LLaMA also partial RoPE, a smaller latent beside 4 rotary key dimensions per head.

    .venv/bin/python benchmarks/grouping_quality.py            # print the table (about 10 min on 2 cores)
    .venv/bin/python benchmarks/grouping_quality.py --write    # also update BENCHMARKS.md
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.attention import convert  # noqa: E402
from graphkit.attention.grouping import GROUPINGS  # noqa: E402
from graphkit.attention.mla import MLAError, kv_cache_bytes, to_mla  # noqa: E402
from graphkit.families import build_model, resolve_config  # noqa: E402
from graphkit.training.data import calibration_inputs, default_source, load_source  # noqa: E402
from graphkit.training.loop import score, up_train  # noqa: E402

MODELS = {  # resolved below: a data source shapes its batches from the full config
    "vit": dict(family="vit", num_layers=4, hidden=128, heads=8, image_size=8, patch_size=2, num_classes=10),
    "gpt2": dict(family="gpt2", num_layers=4, hidden=128, heads=8, vocab_size=256, context=64),
    "llama": dict(family="llama", num_layers=4, hidden=128, heads=8, vocab_size=256, context=64),
}
MODELS = {family: resolve_config(config) for family, config in MODELS.items()}
KV_HEADS = 2
#: LLaMA's partial-RoPE MLA row: rotary dimensions kept per head (MHA2MLA's conversion)
ROPE_DIMS = 4
#: batch size of each family's training and held-out batches (text: windows of 64 bytes)
BATCH = {"vit": 64, "gpt2": 16, "llama": 16}


def trained(family: str, steps: int, source, config: dict | None = None) -> torch.nn.Module:
    """The family's model (or ``config``, one of its shapes) trained directly for ``steps`` AdamW
    steps (lr 1e-3)."""
    config = config or MODELS[family]
    torch.manual_seed(0)
    model = build_model(config, "cpu")
    generator = torch.Generator().manual_seed(1)
    batches = [source.batch(config, BATCH[family], generator) for _ in range(steps)]
    up_train(model, source.task, batches.__getitem__, steps, 1e-3)
    return model


def up_trained(model: torch.nn.Module, batches: list, task: str, held_out: list) -> dict[int, tuple[float, float]]:
    """Held-out (loss, accuracy) of ``model`` at step 0 and after up-training on every batch of
    ``batches`` at lr 3e-4: ``graphkit finetune``'s loop (graphkit.training.loop.up_train), on the
    same batches for every conversion."""
    _, scores = up_train(model, task, batches.__getitem__, len(batches), 3e-4, held_out=held_out, at=(0, len(batches)))
    return scores


def family_rows(family: str, steps: int, uptrain: int) -> list[str]:
    source = load_source(default_source(family), seq_len=64)
    config = MODELS[family]
    generator = torch.Generator().manual_seed(2)
    held_out = [source.batch(config, 128, generator, split="eval") for _ in range(4)]
    generator = torch.Generator().manual_seed(3)
    uptraining = [source.batch(config, BATCH[family], generator) for _ in range(uptrain)]
    model = trained(family, steps, source)
    loss, accuracy = score(model, held_out, source.task)
    rows = [f"| {family} | none (MHA, {config['heads']} K/V heads) | 100% | {loss:.3f} / {accuracy:.3f} | - |"]
    calibration = calibration_inputs(config)
    for grouping in GROUPINGS:
        converted = convert(copy.deepcopy(model), "gqa", KV_HEADS, grouping=grouping, calibration=calibration)
        scores = up_trained(converted, uptraining, source.task, held_out)
        (loss0, acc0), (loss_n, acc_n) = scores[0], scores[uptrain]
        cache = f"{100 * KV_HEADS // config['heads']}%"
        rows.append(f"| {family} | {grouping} | {cache} | {loss0:.3f} / {acc0:.3f} | {loss_n:.3f} / {acc_n:.3f} |")
        print(rows[-1], flush=True)
    rank = 2 * KV_HEADS * config["hidden"] // config["heads"]  # GQA's cache per token and layer
    conversions = [(rank, None)]
    if family == "llama":  # the same cache with partial RoPE: 4 rotary dimensions per head beside the latent
        conversions.append((rank - config["heads"] * ROPE_DIMS, ROPE_DIMS))
    for kv_rank, rope_dims in conversions:
        label = f"mla (kv_rank {kv_rank}" + (f", rope_dims {rope_dims})" if rope_dims else ")")
        try:
            converted = to_mla(copy.deepcopy(model), kv_rank, rope_dims=rope_dims, calibration=calibration)
        except MLAError as e:
            rows.append(f"| {family} | {label} | - | refused: {str(e).split(': ', 1)[1]} | - |")
            continue
        cache = f"{100 * kv_cache_bytes(converted) // kv_cache_bytes(model)}%"
        scores = up_trained(converted, uptraining, source.task, held_out)
        (loss0, acc0), (loss_n, acc_n) = scores[0], scores[uptrain]
        rows.append(f"| {family} | {label} | {cache} | {loss0:.3f} / {acc0:.3f} | {loss_n:.3f} / {acc_n:.3f} |")
        print(rows[-1], flush=True)
    return rows


def table(args) -> str:
    rows = [
        f"| model | grouping | KV cache of MHA's | held-out loss / accuracy, step 0 | after {args.uptrain} steps |",
        "|---|---|---|---|---|",
    ]
    for family in MODELS:
        rows += family_rows(family, args.steps, args.uptrain)
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}; each model "
        f"(4 layers, width 128, 8 heads) trained directly for {args.steps} steps on the bundled data (digits, "
        f"stdlib-text), then converted to GQA with {KV_HEADS} K/V heads by each grouping (calibration: 4 batches of "
        "the train split) and trained on the same batches at lr 3e-4. Command: "
        "`.venv/bin/python benchmarks/grouping_quality.py --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def options(parser) -> None:
    """The training and up-training steps (hf_export.py takes the same)."""
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--uptrain", type=int, default=100)


def main() -> None:
    common.main(__doc__, "grouping_quality", table, options)


if __name__ == "__main__":
    main()

"""MLA saved in DeepSeek's format (`graphkit convert -a mla --format hf`) against graphkit's own MLA,
at a quarter of MHA's KV cache, on the trained LLaMA of grouping_quality.py.

The LLaMA-style model of benchmarks/grouping_quality.py (4 layers, width 128, 8 heads of 16,
stdlib-text as byte tokens) is trained directly for ``--steps`` steps, exactly as there. It is
then converted, each way with 64 cached numbers per token and layer (MHA: 2 x 8 x 16 = 256):

- graphkit's MLA, exact RoPE (latent of 64) and partial RoPE (latent of 32 beside 4 rotary key
  dimensions per K/V head, MHA2MLA's), as grouping_quality.py measures them;
- DeepSeek's format (`to_deepseek`, written with save_pretrained and loaded back with stock
  `AutoModelForCausalLM.from_pretrained`): a latent of R beside one rotary key of D dimensions all
  heads share, made by RoRoPE, at (R, D) = (48, 16) and (56, 8);
- the same DeepSeek models with `kv_a_layernorm` taken out (the latent used as it is, what
  graphkit's MLA does): the difference is what normalising the latent costs. Not a stock model:
  measured to price the norm only;
- DeepSeek's format with the latent as wide as the model (exact): what is left is what sharing
  one rotary key costs, and no basis for the latent (TransMLA's K/V-balanced PCA) can recover it;
- the same LLaMA with 2 heads of 64 (neighbouring frequency pairs 0.75 times as fast as each
  other, as in real models' heads; 0.32 in heads of 16), in DeepSeek's format with FreqFold
  (`to_deepseek`'s default fold) and without (``fold=1``), and with a latent of 12 that binds, its
  basis by a plain SVD of the stacked K and V (``balance_kv=False``) and K/V-balanced (the default).

Each is scored on held-out batches (the eval split) right after conversion and after
``--uptrain`` steps of up-training on the same batches (`graphkit finetune`'s loop,
graphkit.training.loop.up_train, lr 3e-4). Calibration: 4 batches of 8 windows from the train split.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_export.py            # print the table (about 15 min)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_export.py --write    # also update BENCHMARKS.md
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from grouping_quality import BATCH, MODELS, options, trained, up_trained  # noqa: E402

from graphkit.attention.hf_format import check_deepseek, default_fold, save_hf, to_deepseek  # noqa: E402
from graphkit.attention.mla import kv_cache_bytes, to_mla  # noqa: E402
from graphkit.families import resolve_config  # noqa: E402
from graphkit.training.data import calibration_inputs, default_source, load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

#: DeepSeek's (kv_lora_rank, qk_rope_head_dim) at 64 numbers per token and layer
DEEPSEEK = ((48, 16), (56, 8))
#: the same LLaMA with 2 heads of 64, where neighbouring frequency pairs turn 0.75 times as fast as
#: each other (0.32 in heads of 16), as in real models' heads of 64 to 128: FreqFold's case
WIDE_HEADS = resolve_config({**MODELS["llama"], "heads": 2})


def without_latent_norm(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a DeepSeek model whose attention reads its latent as it is, unnormalised (the
    norm's weight, the latent's mean RMS, is what the conversion scaled the latent by)."""
    copied = copy.deepcopy(model)
    for layer in copied.model.layers:
        layer.self_attn.kv_a_layernorm = torch.nn.Identity()
    return copied


def rows(steps: int, uptrain: int) -> list[str]:
    from transformers import AutoModelForCausalLM

    config = MODELS["llama"]
    source = load_source(default_source("llama"), seq_len=64)
    generator = torch.Generator().manual_seed(2)
    held_out = [source.batch(config, 128, generator, split="eval") for _ in range(4)]
    generator = torch.Generator().manual_seed(3)
    uptraining = [source.batch(config, BATCH["llama"], generator) for _ in range(uptrain)]
    calibration = calibration_inputs(config)
    table = []

    def row(label: str, converted: torch.nn.Module, mha: int) -> None:
        cache = f"{100 * kv_cache_bytes(converted) // mha}%"
        scores = up_trained(converted, uptraining, source.task, held_out)
        (loss0, acc0), (loss_n, acc_n) = scores[0], scores[uptrain]
        table.append(f"| {label} | {cache} | {loss0:.3f} / {acc0:.3f} | {loss_n:.3f} / {acc_n:.3f} |")
        print(table[-1], flush=True)

    def deepseek(model: torch.nn.Module, folder: Path, kv_rank: int, rope_dims: int, fold: int | None = None):
        out = folder / f"deepseek-{kv_rank}-{rope_dims}-{fold}"
        save_hf(to_deepseek(model, kv_rank, rope_dims, calibration, fold=fold), out, {"attention": "mla"})
        return AutoModelForCausalLM.from_pretrained(out)

    model = trained("llama", steps, source)
    mha = kv_cache_bytes(model)
    loss, accuracy = score(model, held_out, source.task)
    table.append(f"| original (MHA, 8 K/V heads of 16) | 100% | {loss:.3f} / {accuracy:.3f} | - |")
    row("graphkit MLA (kv_rank 64, exact RoPE)", to_mla(copy.deepcopy(model), 64), mha)
    row(
        "graphkit MLA (kv_rank 32, rope_dims 4 per K/V head)",
        to_mla(copy.deepcopy(model), 32, rope_dims=4, calibration=calibration),
        mha,
    )
    with tempfile.TemporaryDirectory() as folder:
        for kv_rank, rope_dims in DEEPSEEK:
            label = f"kv_lora_rank {kv_rank}, qk_rope_head_dim {rope_dims}"
            row(f"DeepSeek format, loaded ({label})", deepseek(model, Path(folder), kv_rank, rope_dims), mha)
            loaded = deepseek(model, Path(folder), kv_rank, rope_dims)
            row(f"the same, latent norm taken out ({label})", without_latent_norm(loaded), mha)
        exact = deepseek(model, Path(folder), MODELS["llama"]["hidden"], 16)
        row("DeepSeek format, loaded, exact latent (kv_lora_rank 128, qk_rope_head_dim 16)", exact, mha)
        wide = trained("llama", steps, source, WIDE_HEADS)
        mha = kv_cache_bytes(wide)
        loss, accuracy = score(wide, held_out, source.task)
        table.append(f"| original (MHA, 2 K/V heads of 64) | 100% | {loss:.3f} / {accuracy:.3f} | - |")
        for kv_rank, rope_dims in DEEPSEEK:
            label = f"kv_lora_rank {kv_rank}, qk_rope_head_dim {rope_dims}"
            unfolded = deepseek(wide, Path(folder), kv_rank, rope_dims, fold=1)
            row(f"DeepSeek format, heads of 64, no FreqFold ({label})", unfolded, mha)
            fold = default_fold(wide, check_deepseek(wide, kv_rank, rope_dims), rope_dims)
            row(f"the same, FreqFold of {fold} pairs ({label})", deepseek(wide, Path(folder), kv_rank, rope_dims), mha)
        for balance in (False, True):  # a latent that binds: 12 of the 2 x 128 stacked K/V rows
            converted = to_deepseek(wide, 12, 16, calibration, balance_kv=balance)
            label = "K/V-balanced" if balance else "plain SVD"
            row(f"DeepSeek format, heads of 64, latent {label} (kv_lora_rank 12, qk_rope_head_dim 16)", converted, mha)
    return table


def table(args) -> str:
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores ({torch.get_num_threads()} thread, "
        f"beside other work), torch {torch.__version__}; the LLaMA of grouping_quality.py trained directly for "
        f"{args.steps} steps, converted with 64 cached numbers per token and layer, scored on 4 held-out batches of "
        f"128 windows (eval split) at step 0 and after {args.uptrain} steps of up-training (batches of 16 from the "
        "train split, lr 3e-4, the same batches for every row). Command: "
        "`OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_export.py --write`."
    )
    header = [
        f"| model | KV cache of MHA's | held-out loss / accuracy, step 0 | after {args.uptrain} steps |",
        "|---|---|---|---|",
    ]
    return head + "\n\n" + "\n".join(header + rows(args.steps, args.uptrain)) + "\n"


def main() -> None:
    common.main(__doc__, "hf_export", table, options)


if __name__ == "__main__":
    main()

"""Where a prediction's head start goes during fine-tuning (issue #45, items 3 and 5): the
held-out architectures of ``eval-ghn``, fine-tuned from starts that mix the prediction with the
model's own initialisation.

``eval-ghn`` compares the prediction ``P`` with the own init ``W0`` at 0, 100 and 300 steps. The
bundled LLaMA checkpoint wins at 0 and 100 and loses at 300 on most of them: fine-tuning from
``P`` falls slower than from ``W0``. Whether the full-rank random part is what the low-rank
prediction lacks is one experiment: start from ``P + alpha W0`` (every parameter of two or more
dimensions; norms and biases as predicted) for several ``alpha``. ``alpha = 1`` is ``keep_init``;
``alpha = 0`` is the prediction alone. A mix that helps must beat the prediction at 300 steps and
keep its lead over the own init at 0 and 100. Which part of the prediction holds fine-tuning back
is a second: the predicted blocks on the own init's embeddings and head (``blocks``), the
reverse (``outer``), the prediction with its norm gains reset to 1 (``unit-norms``), and with
each block matrix's largest singular directions taken out (``deflate:K``), and with its logits
scaled (``head:S``). A classifier's part is a third (the vision zoo, whose predictions for held-out
families carry the class in their features and not in their logits): any start followed by
``+own-head`` takes the classifier (every linear layer with one output per class) from the own
init, ``+zero-head`` sets it to zero.

Every start sees the same batches and the same random init ``W0`` as ``eval-ghn`` draws them
(``--seed``, 0 as ``eval-ghn``'s default; batches of ``--batch-size``, AdamW at ``--lr``), so the rows for
``own`` and ``predicted`` repeat what ``eval-ghn --seed`` records. Other seeds draw other batches and
another W0: how far a difference between starts stands above one run's noise.

    .venv/bin/python experiments/finetune_starts.py --archs 2 --part 0/2   # and 1/2 beside it: 30 min on 2 cores
    .venv/bin/python experiments/finetune_starts.py --archs 2 --starts own predicted blocks outer unit-norms
    .venv/bin/python experiments/finetune_starts.py --dataset out/zoo-decoders-mini --ghn logah-tiny-zoo-decoders \
        --data stdlib-text --archs 20 --starts own predicted shrink:0.5
    .venv/bin/python experiments/finetune_starts.py --dataset out/zoo-vits-mini --ghn logah-tiny-zoo-vision \
        --data digits --batch-size 32 --archs 8 --starts own predicted predicted+own-head predicted+zero-head

A model with BatchNorm gets its running statistics from its first training batches before step 0,
as ``eval-ghn`` does.

``--case NAME`` takes one of ``benchmarks/grown_starts.py``'s cases instead of a dataset's held-out
architectures: a model as a user builds it (nanoGPT written by hand, transformers' GPT-2, timm-shaped
ViTs) with its checkpoint and data, predicted as ``predict`` predicts it, through its twin and grown
where it is wider than the training space, on the batches that script draws:

    .venv/bin/python experiments/finetune_starts.py --case nanogpt-6x384 --starts own shrink:1 blocks outer

``--ghn`` there predicts the case with another checkpoint than its own, e.g. the decoders' zoo one:

    .venv/bin/python experiments/finetune_starts.py --case gpt2-tied-6x384 --ghn logah-tiny-zoo-decoders \
        --starts shrink:1 shrink:0.5
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import graphkit
from graphkit.errors import GraphkitError
from graphkit.families import build_model
from graphkit.ghn import load_checkpoint
from graphkit.ghn.checkpoint import bundled_checkpoint, check_graph
from graphkit.ghn.evaluate import NORM_BATCHES
from graphkit.ghn.grow import twin_of
from graphkit.ghn.pool import ArchPool, graph_for
from graphkit.ghn.predict import predicted_params
from graphkit.training.data import data_config, default_source, load_source
from graphkit.training.loop import estimate_batch_norm, up_train

ROOT = Path(__file__).resolve().parents[1]
AT = (0, 50, 100, 200, 300)


HEADS = ("+own-head", "+zero-head")


def classifier(model: torch.nn.Module, classes: int) -> list[str]:
    """The names of the parameters of every linear layer with ``classes`` outputs (a distilled
    model's second head included)."""
    return [
        f"{name}.{leaf}" if name else leaf
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module.out_features == classes
        for leaf, _ in module.named_parameters(recurse=False)
    ]


def start(
    build: Callable[[], torch.nn.Module],
    predicted: dict[str, torch.Tensor],
    kind: str,
    classes: int = 0,
    seed: int = 0,
) -> torch.nn.Module:
    """The model ``build`` makes with its own init ``W0`` drawn from ``seed``, then set as ``kind``
    says: ``own`` (W0), ``predicted`` (P), ``mix:A`` (``P + A W0`` for every parameter of two or
    more dimensions, ``P`` for the rest), ``blocks`` (P in the blocks, W0 elsewhere: the
    embeddings, the head, the final norm), ``outer`` (the reverse), ``unit-norms`` (P with every
    norm gain 1, as the init has it), ``deflate:K`` (P with each block matrix's K largest singular
    directions taken out), ``head:S`` (P with the final norm's gain scaled by S: logits S times
    as large, the head being tied to the embeddings), ``shrink:L`` (``L P + W0``, shrink and
    perturb: Ash & Adams, 2020), ``outer-alone:L`` (``L P + W0`` in the blocks, ``P`` alone
    outside them: the embeddings, the head and the final norm as predicted, a start that might
    keep some of the prediction's step-0 loss), ``init-rms`` (P with each parameter of two or more
    dimensions scaled to the RMS of its ``W0``), ``qk:S`` (P with every query and key projection,
    weights and biases, times S: attention logits S^2 times as large; S = 0 attends uniformly, as
    the own init nearly does), ``only:ROLE`` (``P + W0`` in the parameters whose name holds ROLE,
    ``W0`` elsewhere: what one role's prediction alone does to fine-tuning), ``without:ROLE`` (the
    reverse: ``P + W0`` everywhere but there), ``noise`` and ``noise:ROLE`` (their control: ``W0`` plus
    Gaussian noise of ``P``'s RMS in every parameter of two or more dimensions, or in ROLE's: whether
    the prediction's content slows fine-tuning or only its added scale). A kind ending in
    ``+own-head`` or ``+zero-head`` then sets the :func:`classifier` of ``classes`` outputs to the
    own init's or to zero."""
    head = next((h for h in HEADS if kind.endswith(h)), "")
    kind = kind.removesuffix(head)
    torch.manual_seed(seed)
    model = build()
    heads = classifier(model, classes) if head else []
    kept = {name: param.detach().clone() for name, param in model.named_parameters() if name in heads}
    norm_gains = {  # by module, not by name: GPT-2's and nanoGPT's norms are ln_1, ln_2, ln_f
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules()
        if "norm" in type(module).__name__.lower() and isinstance(getattr(module, "weight", None), torch.Tensor)
    }
    role = kind.split(":", 1)[1] if kind.startswith(("only:", "without:", "noise:")) else None
    scaled = kind.startswith(("shrink:", "outer-alone:"))  # L P + W0
    on_init = scaled or kind.startswith(("only:", "without:"))  # P + W0 where they set it
    alpha = float(kind.split(":")[1]) if kind.startswith("mix:") else 1.0 if on_init else 0.0
    shrink = float(kind.split(":")[1]) if scaled else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            # a block's parameter: under layers (LLaMA), h (GPT-2) or blocks (timm's ViT, whose names start there)
            in_block = any(f".{blocks}." in f".{name}" for blocks in ("layers", "h", "blocks"))
            if kind == "own" or (kind == "blocks" and not in_block) or (kind == "outer" and in_block):
                continue
            if role is not None and (role in name) != kind.startswith(("only:", "noise:")):
                continue
            if kind.startswith("noise"):
                if param.dim() >= 2:
                    param.add_(torch.randn_like(param) * predicted[name].float().pow(2).mean().sqrt())
                continue
            value = predicted[name].to(param.dtype)
            if kind == "unit-norms" and param.dim() == 1 and name in norm_gains:
                value = torch.ones_like(value)
            if kind.startswith("head:") and name.endswith(("model.norm.weight", "ln_f.weight")):  # tied heads
                value = value * float(kind.split(":")[1])
            if kind == "init-rms" and value.dim() >= 2:
                value = value * param.pow(2).mean().sqrt() / value.float().pow(2).mean().sqrt().clamp_min(1e-12)
            if kind.startswith("deflate:") and in_block and value.dim() == 2:
                u, s, vh = torch.linalg.svd(value.double(), full_matrices=False)
                k = int(kind.split(":")[1])
                value = (value.double() - (u[:, :k] * s[:k]) @ vh[:k]).to(param.dtype)
            if kind.startswith("qk:"):
                value = scale_queries_and_keys(name, value, float(kind.split(":")[1]))
            if kind.startswith("outer-alone:") and not in_block:
                param.copy_(value)
            else:
                param.copy_(shrink * value + alpha * param if param.dim() >= 2 else value)
        params = dict(model.named_parameters())
        for name, value in kept.items():
            params[name].copy_(value if head == "+own-head" else torch.zeros_like(value))
    return model


def scale_queries_and_keys(name: str, value: torch.Tensor, factor: float) -> torch.Tensor:
    """``value`` (the parameter ``name``) with its query and key part times ``factor``: the first
    two thirds of a fused projection (timm's ``qkv``, rows; GPT-2's ``c_attn``, a Conv1D's
    columns), or all of a separate ``q_proj`` / ``k_proj``; any other parameter as it is."""
    value = value.clone()
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        value[: 2 * value.shape[0] // 3] *= factor
    elif name.endswith(("c_attn.weight", "c_attn.bias")):
        value[..., : 2 * value.shape[-1] // 3] *= factor
    elif any(f".{proj}." in f".{name}" for proj in ("q_proj", "k_proj")):
        value *= factor
    return value


def rms_ratios(model: torch.nn.Module, predicted: dict[str, torch.Tensor]) -> dict[str, float]:
    """RMS(P) / RMS(W0) per role (a parameter name's last two parts), mean over layers: whether
    AdamW's steps, about lr per weight, are small against the prediction's scale."""
    ratios: dict[str, list[float]] = {}
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            role = ".".join(name.split(".")[-2:])
            ratios.setdefault(role, []).append(
                (predicted[name].float().pow(2).mean() / param.pow(2).mean()).sqrt().item()
            )
    return {role: round(statistics.mean(values), 2) for role, values in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=str(ROOT / "out" / "llamas-1k"))
    parser.add_argument(
        "--ghn", default=None, help="checkpoint folder; default: the bundled one of the family, or the case's"
    )
    parser.add_argument("--data", default=None, help="data source; default: the family's (a mini zoo needs one)")
    parser.add_argument("--archs", type=int, default=4)
    parser.add_argument("--part", default="0/1", help="I/N: only every N-th architecture from the I-th")
    parser.add_argument("--ids", nargs="*", help="only these architectures (of the first --archs)")
    parser.add_argument(
        "--starts", nargs="*", default=["own", "predicted", "mix:0.25", "mix:0.5", "mix:1"], help="see start()"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=0, help="steps of linear lr warm-up, every start alike")
    parser.add_argument("--seed", type=int, default=0, help="of W0 and the batches, as eval-ghn --seed")
    parser.add_argument("--case", help="a case of benchmarks/grown_starts.py instead of a dataset's architectures")
    parser.add_argument("--summary", type=Path, help="print the means and wins of a file of this script's rows")
    args = parser.parse_args()
    if args.summary:
        rows = [json.loads(line) for line in args.summary.read_text().splitlines() if line.startswith("{")]
        summary([row for row in rows if "start" in row])  # not the RMS ratios, nor what was skipped
        return
    torch.set_num_threads(1)
    if args.case:
        case_starts(args)
        return
    index, parts = (int(n) for n in args.part.split("/"))
    pool = ArchPool(args.dataset, "eval")
    ghn = load_checkpoint(args.ghn or bundled_checkpoint(pool.family))
    source = load_source(args.data or default_source(pool.family), seq_len=64)
    chosen = [r for r in pool.records[: args.archs] if not args.ids or r.id in args.ids]
    for number, record in enumerate(chosen):
        if number % parts != index:
            continue
        try:  # a mini zoo's held-out family may have an op the checkpoint never trained on
            check_graph(ghn, record.graph)
        except GraphkitError as e:
            print(json.dumps({"id": record.id, "skipped": str(e)}), flush=True)
            continue
        generator = torch.Generator().manual_seed(args.seed)
        held_out = [source.batch(record.config, args.batch_size, generator, split="eval") for _ in range(4)]
        batches = [source.batch(record.config, args.batch_size, generator) for _ in range(args.steps)]
        predicted = predicted_params(ghn, graph_for(record, ghn.config))  # init constants, if it decodes around them
        classes = record.config["num_classes"] if source.task == "image" else 0  # the model's outputs
        build = lambda config=record.config: build_model(config, "cpu")  # noqa: E731
        fine_tune(args, record.id, build, predicted, classes, source, held_out, batches)


def fine_tune(args, name: str, build, predicted: dict, classes: int, source, held_out: list, batches: list) -> None:
    """Print the RMS ratios of ``predicted`` to the own init, then a row of held-out losses (and
    accuracies) for each of ``args.starts``, fine-tuned on ``batches``."""
    at = [h for h in AT if h <= args.steps]
    own = start(build, predicted, "own", seed=args.seed)
    print(json.dumps({"id": name, "rms ratio": rms_ratios(own, predicted)}))
    for kind in args.starts:
        model = start(build, predicted, kind, classes, args.seed)
        estimate_batch_norm(model, [batches[i][0] for i in range(min(NORM_BATCHES, len(batches)))])
        _, scores = up_train(
            model, source.task, batches.__getitem__, args.steps, args.lr, held_out=held_out, at=at, warmup=args.warmup
        )
        row = {"id": name, "start": kind}
        row.update({str(h): round(scores[h][0], 4) for h in at})
        row["accuracy"] = {str(h): round(scores[h][1], 4) for h in at}
        print(json.dumps(row), flush=True)


def case_starts(args) -> None:
    """:func:`fine_tune` on ``benchmarks/grown_starts.py``'s case ``args.case``: its model built
    from seed 0, predicted (by ``args.ghn``, else the case's checkpoint) through its twin as
    ``predict`` does (grown where it is wider than the space trained at its depth), on that
    script's batches (``--seed`` draws them)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grown_starts  # noqa: PLC0415  (a benchmark's cases, for this experiment only)

    checkpoint, data, batch_size, spec = grown_starts.CASES[args.case]
    ghn = load_checkpoint(args.ghn or checkpoint)
    model = grown_starts.build(spec)
    graph = graphkit.trace(model)
    predicted = predicted_params(ghn, graph, grow=twin_of(ghn, graph, model) or False)
    source = load_source(data, seq_len=64)
    shape = grown_starts.TEXT if isinstance(spec, tuple) else data_config(model)
    generator = torch.Generator().manual_seed(args.seed)
    held_out = [source.batch(shape, batch_size, generator, split="eval") for _ in range(4)]
    batches = [source.batch(shape, batch_size, generator) for _ in range(args.steps)]
    classes = int(spec["num_classes"]) if source.task == "image" else 0
    fine_tune(args, args.case, lambda: grown_starts.build(spec), predicted, classes, source, held_out, batches)


def summary(lines: list[dict]) -> None:
    """Mean loss per start and horizon, its mean paired difference to the own init with that
    mean's standard error (how far it stands above one run's noise), and how often each start
    beats the own init."""
    by_id: dict[str, dict] = {}
    for row in lines:
        by_id.setdefault(row["id"], {})[row["start"]] = row
    starts = sorted({row["start"] for row in lines}, key=str)
    horizons = [k for k in lines[0] if k not in ("id", "start", "accuracy")]
    for s in starts:
        means = [statistics.mean(r[s][h] for r in by_id.values() if s in r) for h in horizons]
        paired = [[r[s][h] - r["own"][h] for r in by_id.values() if s in r and "own" in r] for h in horizons]
        accuracy = [
            statistics.mean(r[s]["accuracy"][h] for r in by_id.values() if s in r and "accuracy" in r[s])
            if all("accuracy" in r[s] for r in by_id.values() if s in r)
            else math.nan
            for h in horizons
        ]
        print(
            s,
            " ".join(f"{m:.3f}" for m in means),
            "accuracy",
            " ".join(f"{a:.2f}" for a in accuracy),
            "minus own",
            " ".join(
                f"{statistics.mean(d):+.3f}±{statistics.stdev(d) / math.sqrt(len(d)):.3f}" if len(d) > 1 else "-"
                for d in paired
            ),
            "wins",
            " ".join(f"{statistics.mean(d < 0 for d in ds):.0%}" if ds else "-" for ds in paired),
        )


if __name__ == "__main__":
    main()

"""Is the hypernetwork worth using? Held-out architectures, three initialisations each:

- ``predicted``: the hypernetwork's parameters;
- ``random``: the framework's own initialisation (timm's, Hugging Face's);
- ``orthogonal``: random, then every weight with 2+ dimensions orthogonal (GHN papers' ORTHINIT).

Each model is scored on fixed eval batches at step 0, fine-tuned for ``steps`` AdamW steps on the
same training batches whatever its initialisation, and scored again. The summary counts the
architectures whose predicted initialisation ends with a lower eval loss than random.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from rich.progress import Progress
from torch import nn

from graphkit.ghn.model import LoGAH

INITS = ("predicted", "random", "orthogonal")


@dataclass
class EvalConfig:
    """What to evaluate and how long to fine-tune."""

    dataset: str
    ghn: str | None = None     # checkpoint folder; None: the bundled one for the dataset's family
    split: str = "eval"
    data: str | None = None    # None: the family's bundled data
    archs: int = 16            # at most this many distinct architectures
    steps: int = 50            # fine-tuning steps
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-4           # AdamW; ViTs trained from scratch diverge at 1e-3 without warm-up
    eval_batches: int = 4
    seed: int = 0


def initialise(model: nn.Module, init: str, predicted: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Apply ``init`` (see :data:`INITS`) to a model built with the framework's initialisation."""
    from graphkit.compile import load_params

    if init == "predicted":
        load_params(model, predicted)
    elif init == "orthogonal":
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2:
                    nn.init.orthogonal_(param.view(param.shape[0], -1))
    elif init != "random":
        raise ValueError(f"unknown initialisation {init!r}; accepted: {', '.join(INITS)}")
    return model


def score(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], task: str) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` (in eval mode) over ``batches``."""
    from graphkit.ghn.data import output_loss

    model.eval()
    with torch.no_grad():
        results = [output_loss(task, model(x), y) for x, y in batches]
    return (sum(r[0].item() for r in results) / len(results), sum(r[1].item() for r in results) / len(results))


def fine_tune(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], task: str, lr: float) -> list[float]:
    """Train ``model`` one AdamW step per batch; returns the training losses."""
    from graphkit.ghn.data import output_loss

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for x, y in batches:
        loss, _ = output_loss(task, model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def evaluate(config: EvalConfig, ghn: LoGAH | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """One row per architecture and initialisation: loss and accuracy at step 0 and after
    ``config.steps`` steps, and the training-loss curve."""
    from graphkit.families import build_model
    from graphkit.ghn.checkpoint import bundled_checkpoint, check_graph, load_checkpoint
    from graphkit.ghn.data import default_source, load_source
    from graphkit.ghn.training import ArchPool

    pool = ArchPool(config.dataset, config.split)
    if ghn is None:
        ghn = load_checkpoint(config.ghn or bundled_checkpoint(pool.family))
    source = load_source(config.data or default_source(pool.family), seq_len=config.seq_len)
    chosen = range(min(config.archs, len(pool)))
    rows = []
    with Progress(disable=not progress) as bar:
        task = bar.add_task("eval-ghn", total=len(chosen) * len(INITS))
        for index in chosen:
            record = pool.records[index]
            source.check(record.config)
            check_graph(ghn, record.graph)
            with torch.no_grad():
                predicted = ghn.predict(record.graph)
            generator = torch.Generator().manual_seed(config.seed)
            held_out = [source.batch(record.config, config.batch_size, generator, split="eval") for _ in range(config.eval_batches)]
            train_batches = [source.batch(record.config, config.batch_size, generator) for _ in range(config.steps)]
            for init in INITS:
                torch.manual_seed(config.seed)
                model = initialise(build_model(record.config, "cpu"), init, predicted)
                loss0, acc0 = score(model, held_out, source.task)
                curve = fine_tune(model, train_batches, source.task, config.lr)
                loss, acc = score(model, held_out, source.task)
                rows.append({"id": record.id, "task": source.task, "num_params": record["num_params"], "init": init, "loss_0": loss0,
                             "accuracy_0": acc0, "loss": loss, "accuracy": acc, "curve": curve})
                bar.advance(task)
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means per initialisation, and how often ``predicted`` beats ``random`` after fine-tuning."""
    summary: dict[str, Any] = {}
    for init in INITS:
        mine = [r for r in rows if r["init"] == init]
        summary[init] = {k: sum(r[k] for r in mine) / len(mine) for k in ("loss_0", "accuracy_0", "loss", "accuracy")}
        if mine[0]["task"] == "text":
            summary[init]["perplexity"] = math.exp(min(summary[init]["loss"], 50))
    final = {(r["id"], r["init"]): r["loss"] for r in rows}
    ids = sorted({r["id"] for r in rows})
    wins = sum(final[i, "predicted"] < final[i, "random"] for i in ids)
    summary["archs"] = len(ids)
    summary["predicted_beats_random"] = wins / len(ids)
    return summary


def plot(rows: Sequence[dict[str, Any]], png: str, title: str) -> None:
    """Mean fine-tuning loss per initialisation, step by step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for init in INITS:
        curves = torch.tensor([r["curve"] for r in rows if r["init"] == init])
        ax.plot(range(1, curves.shape[1] + 1), curves.mean(0), label=init)
    ax.set(xlabel="fine-tuning step", ylabel="training loss (mean over architectures)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


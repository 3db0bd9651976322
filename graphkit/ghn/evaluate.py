"""Is the hypernetwork worth using? Held-out architectures, three initialisations each:

- ``predicted``: the hypernetwork's parameters;
- ``random``: the framework's own initialisation (timm's, Hugging Face's);
- ``orthogonal``: random, then every weight with 2+ dimensions orthogonal (GHN papers' ORTHINIT).

Each model is fine-tuned for ``steps`` AdamW steps on the same training batches whatever its
initialisation and scored on fixed held-out batches at the horizons 0, 100 and ``steps``. A head
start that fine-tuning erases is no better initialisation, so the verdicts ("beats random",
"beats orthogonal": a lower held-out loss) are taken at the final step, after hundreds of steps
(300 by default), where the baselines have learned; the summary also gives them at every horizon.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.progress import Progress
from torch import nn

from graphkit.errors import GraphkitError
from graphkit.fileio import atomic_path, figure_metadata
from graphkit.ghn.model import LoGAH
from graphkit.ghn.options import check_counts, check_device, check_flag, check_number, check_seed

INITS = ("predicted", "random", "orthogonal")


class EvalError(GraphkitError, ValueError):
    """An evaluation option out of range (steps, architectures, batch sizes, lr, device)."""


@dataclass
class EvalConfig:
    """What to evaluate and how long to fine-tune."""

    dataset: str
    ghn: str | None = None     # checkpoint folder; None: the bundled one for the dataset's family
    split: str = "eval"
    data: str | None = None    # None: the family's bundled data
    archs: int = 16            # at most this many distinct architectures
    steps: int = 300           # fine-tuning steps: the verdicts are taken after the last
    batch_size: int = 32
    seq_len: int = 64
    lr: float = 3e-4           # AdamW; ViTs trained from scratch diverge at 1e-3 without warm-up
    eval_batches: int = 4
    seed: int = 0
    device: str | None = None  # None: cuda if available, else cpu
    residual_scale: bool | None = None  # scale residual branches as the family's init does; None: when it does (GPT-2)
    calibrate: bool = False  # calibrate the predicted stream to the init's (graphkit.ghn.calibrate), as predict(calibrate=True)

    def __post_init__(self) -> None:
        check_counts(self, ("steps", "archs", "batch_size", "seq_len", "eval_batches"), EvalError)
        check_number("lr", self.lr, EvalError, positive=True)
        check_seed(self.seed, EvalError)
        check_device(self.device, EvalError)
        check_flag("calibrate", self.calibrate, EvalError)


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


def horizons(steps: int) -> list[int]:
    """The steps at which a fine-tuned model is scored: 0, 100 and the last."""
    return sorted({0, min(100, steps), steps})


def fine_tune(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], task: str, lr: float,
              held_out: Sequence[tuple[torch.Tensor, torch.Tensor]] = (), at: Sequence[int] = ()
              ) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """Train ``model`` one AdamW step per batch; returns the training losses and the held-out
    (loss, accuracy) after each step count in ``at`` (0: before the first step)."""
    from graphkit.ghn.data import output_loss

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scores = {0: score(model, held_out, task)} if 0 in at else {}
    losses = []
    for step, (x, y) in enumerate(batches, 1):
        model.train()
        loss, _ = output_loss(task, model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step in at:
            scores[step] = score(model, held_out, task)
    return losses, scores


def evaluate(config: EvalConfig, ghn: LoGAH | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """One row per architecture and initialisation: loss and accuracy at step 0 and after
    ``config.steps`` steps, and the training-loss curve."""
    from graphkit.families import build_model
    from graphkit.ghn.checkpoint import bundled_checkpoint, check_graph, load_checkpoint
    from graphkit.ghn.data import default_source, load_source
    from graphkit.ghn.calibrate import calibrate
    from graphkit.ghn.predict import predicted_params, scales_residuals
    from graphkit.ghn.training import ArchPool

    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pool = ArchPool(config.dataset, config.split)
    if ghn is None:
        ghn = load_checkpoint(config.ghn or bundled_checkpoint(pool.family))
    ghn = ghn.to(device)
    source = load_source(config.data or default_source(pool.family), seq_len=config.seq_len)
    chosen = range(min(config.archs, len(pool)))
    at = horizons(config.steps)
    rows = []
    with Progress(disable=not progress) as bar:
        task = bar.add_task("eval-ghn", total=len(chosen) * len(INITS))
        for index in chosen:
            record = pool.records[index]
            source.check(record.config)
            check_graph(ghn, record.graph)
            predicted = predicted_params(ghn, record.graph, config.residual_scale)
            scaled = scales_residuals(record.graph, config.residual_scale)
            generator = torch.Generator().manual_seed(config.seed)
            held_out = [_to(source.batch(record.config, config.batch_size, generator, split="eval"), device)
                        for _ in range(config.eval_batches)]
            train_batches = [_to(source.batch(record.config, config.batch_size, generator), device) for _ in range(config.steps)]
            for init in INITS:
                torch.manual_seed(config.seed)
                model = initialise(build_model(record.config, "cpu"), init, predicted)
                if init == "predicted" and config.calibrate:
                    calibrate(model, record.graph)
                model = model.to(device)
                curve, scores = fine_tune(model, train_batches, source.task, config.lr, held_out, at)
                row = {"id": record.id, "task": source.task, "num_params": record["num_params"], "init": init,
                       "residual_scale": scaled, "calibrated": config.calibrate and init == "predicted", "horizons": at, "curve": curve}
                for h in at:
                    row[f"loss_{h}"], row[f"accuracy_{h}"] = scores[h]
                row["loss"], row["accuracy"] = scores[config.steps]
                rows.append(row)
                bar.advance(task)
    return rows


def _to(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return batch[0].to(device), batch[1].to(device)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means per initialisation at every horizon, and at each horizon the fraction of
    architectures where ``predicted`` has a lower held-out loss than ``random`` and than
    ``orthogonal``; ``residual_scale``, whether the predictions had their residual branches
    scaled (:func:`graphkit.ghn.predict.scale_residuals`); ``calibrated``, on how many
    architectures the predicted stream was calibrated (:mod:`graphkit.ghn.calibrate`); ``predicted_beats_random`` /
    ``predicted_beats_orthogonal`` are the verdicts at the final step."""
    at = rows[0]["horizons"]
    keys = [f"{m}_{h}" for h in at for m in ("loss", "accuracy")] + ["loss", "accuracy"]
    summary: dict[str, Any] = {"horizons": at}
    for init in INITS:
        mine = [r for r in rows if r["init"] == init]
        summary[init] = {k: sum(r[k] for r in mine) / len(mine) for k in keys}
        if mine[0]["task"] == "text":
            summary[init]["perplexity"] = math.exp(min(summary[init]["loss"], 50))
    ids = sorted({r["id"] for r in rows})
    loss = {(r["id"], r["init"], h): r[f"loss_{h}"] for r in rows for h in at}
    summary["archs"] = len(ids)
    summary["residual_scale"] = any(r.get("residual_scale", False) for r in rows)
    summary["calibrated"] = sum(bool(r.get("calibrated")) for r in rows)
    summary["wins"] = {str(h): {other: sum(loss[i, "predicted", h] < loss[i, other, h] for i in ids) / len(ids)
                                for other in ("random", "orthogonal")} for h in at}
    summary["predicted_beats_random"] = summary["wins"][str(at[-1])]["random"]
    summary["predicted_beats_orthogonal"] = summary["wins"][str(at[-1])]["orthogonal"]
    return summary


def report_json(config: EvalConfig, summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """eval.json's text: the config, the summary and every row. A fine-tuning that diverged has
    NaN or Inf losses, which JSON cannot hold (a bare ``NaN`` breaks strict readers): they are
    written as null."""
    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite({"config": asdict(config), "summary": summary, "rows": list(rows)}), indent=1,
                      allow_nan=False) + "\n"


def plot(rows: Sequence[dict[str, Any]], png: str, title: str) -> None:
    """Every initialisation's fine-tuning loss over all steps (a thin line per architecture, a
    thick one for the mean) beside its held-out loss at each horizon, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (train_ax, held_ax) = plt.subplots(1, 2, figsize=(10, 4))
    at = rows[0]["horizons"]
    for init, color in zip(INITS, ("tab:blue", "tab:orange", "tab:green")):
        mine = [r for r in rows if r["init"] == init]
        curves = torch.tensor([r["curve"] for r in mine])
        steps = range(1, curves.shape[1] + 1)
        for curve in curves:
            train_ax.plot(steps, curve, color=color, alpha=0.15, linewidth=0.7)
        train_ax.plot(steps, curves.mean(0), color=color, linewidth=2, label=init)
        held_ax.plot(at, [sum(r[f"loss_{h}"] for r in mine) / len(mine) for h in at], "o-", color=color, label=init)
    train_ax.set(xlabel="fine-tuning step", ylabel="training loss", title=title)
    held_ax.set(xlabel="fine-tuning step", ylabel="held-out loss (mean over architectures)", xticks=at)
    train_ax.legend()
    held_ax.legend()
    fig.tight_layout()
    with atomic_path(png) as tmp:  # a PNG is complete or not there
        fig.savefig(tmp, dpi=120, format="png", metadata=figure_metadata("png"))
    plt.close(fig)

"""The loop every up-training in graphkit runs: ``graphkit finetune``'s (:mod:`graphkit.finetune`),
the benchmarks' and the hypernetwork evaluation's fine-tuning (:func:`graphkit.ghn.evaluate.fine_tune`):
one AdamW step per batch at a constant learning rate. Step ``i`` draws its batch and its dropout
from a seed of its own (:func:`step_seed`, which hypernetwork training draws from too), so a run
that is interrupted and resumed trains on what the uninterrupted one would have."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from graphkit.errors import TrainError
from graphkit.training.data import output_loss

Batch = tuple[torch.Tensor, torch.Tensor]


class Run(Protocol):
    """What keeps an up-training's run folder (:class:`graphkit.finetune.UpTrainingRun`)."""

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the checkpoint into ``model`` and ``optimizer``; the steps it had done (0 for a fresh run)."""

    def step_done(self, step: int, loss: float, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Log and checkpoint after ``step`` steps, as the run's settings say."""


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """The seed of a step's draws on one process (its architectures, its data batches, dropout in
    the target models): a function of the run's seed, the step and the rank alone, so that a
    resumed run draws what the uninterrupted one drew and no two processes draw alike."""
    return seed * 1_000_003 + step * 4099 + rank


def score(model: nn.Module, batches: Sequence[Batch], task: str) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` (in eval mode) over ``batches``."""
    model.eval()
    with torch.no_grad():
        results = [output_loss(task, model(x), y) for x, y in batches]
    return (sum(r[0].item() for r in results) / len(results), sum(r[1].item() for r in results) / len(results))


def up_train(
    model: nn.Module,
    task: str,
    batch_at: Callable[[int], Batch],
    steps: int,
    lr: float,
    *,
    weight_decay: float = 0.01,
    held_out: Sequence[Batch] = (),
    at: Sequence[int] = (),
    seed: int | None = None,
    run: Run | None = None,
    progress: bool = False,
) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """Train ``model`` for ``steps`` AdamW steps (constant ``lr``), step ``i`` (from 0) on the
    batch ``batch_at(i)``, with dropout drawn from ``step_seed(seed, i)`` when a ``seed`` is given
    (a resumed step then repeats; without one, from the global generator as it stands); returns
    the training losses of the steps it ran and the held-out (loss, accuracy) after each step
    count in ``at`` (0: before the first step). ``run`` keeps the run folder: it resumes the model
    and optimizer from its checkpoint, and logs and checkpoints as the steps go. ``progress``
    shows a bar."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    start = run.resume(model, optimizer) if run is not None else 0
    scores = {0: score(model, held_out, task)} if 0 in at and start == 0 else {}
    losses = []
    columns = (
        TextColumn("finetune"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress) as bar:
        task_id = bar.add_task("finetune", total=steps, completed=start, loss="-")
        for step in range(start, steps):
            x, y = batch_at(step)
            if seed is not None:
                torch.manual_seed(step_seed(seed, step))
            model.train()
            loss, _ = output_loss(task, model(x), y)
            if not torch.isfinite(loss):
                raise TrainError(f"step {step}: the loss is {loss.item()}; up-train with a lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            done = step + 1
            if done in at:
                scores[done] = score(model, held_out, task)
            if run is not None:
                run.step_done(done, losses[-1], model, optimizer)
            bar.update(task_id, completed=done, loss=f"{losses[-1]:.3f}")
    return losses, scores

"""The loop every up-training in graphkit runs: ``graphkit finetune``'s (:mod:`graphkit.finetune`),
the benchmarks' and the hypernetwork evaluation's fine-tuning (:func:`graphkit.ghn.evaluate.fine_tune`):
one AdamW step per batch at a constant learning rate (some parameters at a multiple of it:
:func:`param_groups`). Step ``i`` draws its batch and its dropout
from a seed of its own (:func:`step_seed`, which hypernetwork training draws from too), so a run
that is interrupted and resumed trains on what the uninterrupted one would have."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from graphkit.errors import TrainError
from graphkit.training.data import output_loss

#: a batch's inputs and targets; the inputs a tensor, or keyword arguments (SigLIP 2's patches)
Batch = tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]


def forward(
    model: nn.Module, x: torch.Tensor | Mapping[str, torch.Tensor], targets: torch.Tensor | None = None
) -> object:
    """``model`` run on a batch's inputs ``x`` (and its ``targets``, as :func:`forward_inputs` passes them)."""
    args, kwargs = forward_inputs(model, x, targets)
    return model(*args, **kwargs)


def forward_inputs(
    model: nn.Module, x: torch.Tensor | Mapping[str, torch.Tensor], targets: torch.Tensor | None = None
) -> tuple[tuple, dict]:
    """The (args, kwargs) ``model`` runs with on a batch: ``x`` as its first argument, or a dict
    as keyword arguments, as transformers' Trainer passes a batch; and the batch's ``targets``
    as ``targets=`` to a model whose forward takes them (nanoGPT, minGPT), as its own training
    loop passes them. Without them nanoGPT returns the last position's logits only (its
    inference form), which no next-token loss can score."""
    if isinstance(x, Mapping):
        return (), dict(x)
    if targets is not None and _takes_targets(model):
        return (x,), {"targets": targets.contiguous()}  # nanoGPT's loss reads them with .view
    return (x,), {}


def _takes_targets(model: nn.Module) -> bool:
    """Whether ``model``'s forward has a parameter named ``targets``."""
    try:
        return "targets" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward with no signature to read
        return False


def on_device(batch: Batch, device: torch.device) -> Batch:
    """``batch`` (inputs and targets) moved to ``device``."""
    x, y = batch
    moved = {k: v.to(device) for k, v in x.items()} if isinstance(x, Mapping) else x.to(device)
    return moved, y.to(device)


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


#: what :func:`estimate_batch_norm` recognises (timm's BatchNormAct2d subclasses nn.BatchNorm2d)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def estimate_batch_norm(model: nn.Module, inputs: Sequence[torch.Tensor]) -> bool:
    """Re-estimate the running statistics of every BatchNorm of ``model`` on ``inputs`` (a
    cumulative average over one pass, in train mode, weights untouched:
    ``torch.optim.swa_utils.update_bn``); False, with nothing run, for a model without one.

    Why: in eval mode a BatchNorm normalises by its running statistics, and a model just built
    holds those of no weights (mean 0, variance 1). A hypernetwork trains its predictions in train
    mode, on batch statistics; scored with the constructor's statistics, the zoo-vision
    checkpoint's predictions for its BatchNorm families sat at chance where they reach 0.25-0.43
    accuracy with their own (docs/experiments.md, "BatchNorm statistics"). GHN-3's evaluation
    normalises by batch statistics too (it predicts with ``bn_track_running_stats=False``, so the
    held-out batch's own); these are estimated on training inputs instead. Labels are not read."""
    if not any(isinstance(m, BATCH_NORMS) for m in model.modules()):
        return False
    torch.optim.swa_utils.update_bn(inputs, model)
    return True


def param_groups(model: nn.Module, lr: float, lr_scale: Mapping[str, float] | None = None) -> list[dict]:
    """The optimizer's parameter groups for ``model`` at learning rate ``lr``, the parameters named
    in ``lr_scale`` (state-dict names) at ``lr`` times their factor: every other parameter in the
    first group, then one group a factor. TrainError naming a parameter the model does not have.

    Why: a patch embedding that ``graphkit predict`` resized to a larger kernel holds weights
    about (trained patch / model patch)^2 the size of trained ones, and AdamW moves every weight
    by about ``lr`` a step whatever its size, so at one lr fine-tuning rewrites it within a few
    steps and the prediction's head start goes with it (:func:`graphkit.ghn.grow.lr_scale`)."""
    lr_scale = dict(lr_scale or {})
    named = dict(model.named_parameters())
    unknown = sorted(set(lr_scale) - set(named))
    if unknown:
        raise TrainError(f"lr scale for {unknown[0]}: the model has no such parameter")
    groups = [{"params": [p for name, p in named.items() if name not in lr_scale], "lr": lr}]
    for factor in sorted(set(lr_scale.values())):
        params = [named[name] for name, f in lr_scale.items() if f == factor]
        groups.append({"params": params, "lr": lr * factor})
    return groups


def warmup_factor(step: int, warmup: int) -> float:
    """The fraction of its learning rate step ``step`` (from 0) takes under a linear warm-up of
    ``warmup`` steps: ``(step + 1) / warmup`` until it reaches 1 (0 steps: 1 throughout). A
    function of the step alone, so a resumed run takes the rates the uninterrupted one took.

    Why: AdamW's first steps move every weight by about its learning rate, whatever the gradient's
    size (the second-moment estimate is one gradient's square). From a model's own init that
    is harmless; from a prediction it is not: one such step on a predicted ViT's attention
    weights alone takes its held-out loss from 0.90 to 2.35. On the 2 x 2 token grid a warm-up
    does not let that prediction out-train the own init (docs/experiments.md, "Warm-up, the
    learning rate and the attention's temperature"); on wider ViTs and decoders `predict`'s start
    warmed up over 25 steps gains up to 0.12 nats at 300 steps and beats the own init's better
    recipe at 100 and 300 ("The same starts under a warm-up").
    timm's and transformers' training recipes warm up for the same reason."""
    return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)


def score(model: nn.Module, batches: Sequence[Batch], task: str) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` (in eval mode) over ``batches``."""
    model.eval()
    with torch.no_grad():
        results = [output_loss(task, forward(model, x, y), y) for x, y in batches]
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
    lr_scale: Mapping[str, float] | None = None,
    warmup: int = 0,
) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """Train ``model`` for ``steps`` AdamW steps (constant ``lr``), step ``i`` (from 0) on the
    batch ``batch_at(i)``, with dropout drawn from ``step_seed(seed, i)`` when a ``seed`` is given
    (a resumed step then repeats; without one, from the global generator as it stands); returns
    the training losses of the steps it ran and the held-out (loss, accuracy) after each step
    count in ``at`` (0: before the first step). ``run`` keeps the run folder: it resumes the model
    and optimizer from its checkpoint, and logs and checkpoints as the steps go. ``progress``
    shows a bar. ``lr_scale`` trains the parameters it names at ``lr`` times their factor
    (:func:`param_groups`). ``warmup`` raises every group's rate linearly over the first steps
    (:func:`warmup_factor`)."""
    if warmup < 0:
        raise TrainError(f"warmup {warmup}: must be 0 (none) or a positive number of steps")
    optimizer = torch.optim.AdamW(param_groups(model, lr, lr_scale), lr=lr, weight_decay=weight_decay)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
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
            loss, _ = output_loss(task, forward(model, x, y), y)
            if not torch.isfinite(loss):
                raise TrainError(f"step {step}: the loss is {loss.item()}; up-train with a lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * warmup_factor(step, warmup)
            optimizer.step()
            losses.append(loss.item())
            done = step + 1
            if done in at:
                scores[done] = score(model, held_out, task)
            if run is not None:
                run.step_done(done, losses[-1], model, optimizer)
            bar.update(task_id, completed=done, loss=f"{losses[-1]:.3f}")
    return losses, scores

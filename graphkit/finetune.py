"""Up-training: train a model graphkit loads on the bundled data or the user's (``graphkit finetune``).

Conversion papers up-train after converting (MHA2MLA with 0.6-1% of the pre-training data,
TransMLA, GQA's own 5%); :func:`up_train` is that loop, one AdamW step per batch at a constant
learning rate, the loop every up-training in graphkit runs: the command's, the benchmarks' and
the hypernetwork evaluation's fine-tuning (:func:`graphkit.ghn.evaluate.fine_tune`). Step ``i``
draws its batch and its dropout from a seed of its own (:func:`~graphkit.ghn.training.step_seed`),
so a run that is interrupted and resumed trains on what the uninterrupted one would have.

:func:`finetune` runs it in a run folder, as ``graphkit train-ghn`` does
(:mod:`graphkit.ghn.run_folder`): ``checkpoint/`` (the model's parameters and buffers, the
optimizer's state and the step, replaced whole every ``checkpoint_every`` steps) and
``metrics.jsonl`` (the training loss every ``log_every`` steps, and the held-out loss and
accuracy at the end); ``resume`` continues from the checkpoint with the options it recorded.
The command writes the trained model into the same folder, in either format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from graphkit.errors import TrainError
from graphkit.fileio import write_folder
from graphkit.ghn.checkpoint import load_optimizer_state, read_trainer_state, save_optimizer_state
from graphkit.ghn.data import data_config, load_source, output_loss, source_for
from graphkit.ghn.run_folder import check_resume, trim_metrics
from graphkit.ghn.training import step_seed
from graphkit.params import load_params, save_params, weights_digest
from graphkit.validation import check_counts, check_device, check_number, check_seed, default_device

Batch = tuple[torch.Tensor, torch.Tensor]
#: the options that shape an up-training's result: a resume must repeat them (steps may grow)
RESUMED = ("data", "lr", "batch_size", "seq_len", "weight_decay", "seed")
#: what an up-training run folder holds (either format); a fresh run refuses a folder holding any
RUN_FILES = ("model.safetensors", "config.json", "generation_config.json", "metrics.jsonl", "checkpoint")


@dataclass
class FinetuneConfig:
    """How to up-train: ``steps`` AdamW steps at ``lr`` (constant) on batches of ``batch_size``
    from ``data`` (a spec as ``--data`` takes it; None: the model's bundled data), text windows of
    ``seq_len`` tokens; a checkpoint every ``checkpoint_every`` steps, a metrics line every
    ``log_every``; ``eval_batches`` held-out batches scored at the end. Every value is checked."""

    steps: int = 100
    lr: float = 3e-4
    batch_size: int = 16
    seq_len: int = 64
    weight_decay: float = 0.01
    data: str | None = None
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 10
    eval_batches: int = 4
    device: str | None = None  # None: $GRAPHKIT_DEVICE, else cuda if available, else cpu

    def __post_init__(self) -> None:
        check_counts(
            self, ("steps", "batch_size", "seq_len", "checkpoint_every", "log_every", "eval_batches"), TrainError
        )
        check_number("lr", self.lr, TrainError, positive=True)
        check_number("weight_decay", self.weight_decay, TrainError, positive=False)
        check_seed(self.seed, TrainError)
        check_device(self.device, TrainError)


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
    run: UpTrainingRun | None = None,
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


class UpTrainingRun:
    """An up-training's run folder (module docstring): resumes from and writes ``checkpoint/``,
    logs to ``metrics.jsonl``."""

    def __init__(self, folder: Path, config: FinetuneConfig, data: str, resume: bool, source: str) -> None:
        self.folder, self.config, self.data, self.resuming = folder, config, data, resume
        self.checkpoint, self.metrics = folder / "checkpoint", folder / "metrics.jsonl"
        self.source = source  # the digest of the weights the run started from (params.weights_digest)

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the checkpoint into ``model`` and ``optimizer`` when resuming; the steps done."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.resuming:
            return 0
        load_params(model, self.checkpoint / "model.safetensors")
        step = int(load_optimizer_state(self.checkpoint, optimizer)["step"])
        trim_metrics(self.metrics, step)
        return step

    def step_done(self, step: int, loss: float, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Log and checkpoint after ``step`` steps, as the config says."""
        if step % self.config.log_every == 0 or step == self.config.steps:
            self.log({"step": step, "loss": loss, "lr": optimizer.param_groups[0]["lr"]})
        if step % self.config.checkpoint_every == 0 or step == self.config.steps:
            state = {
                "step": step,
                "config": {**asdict(self.config), "data": self.data},
                "world_size": 1,
                "source": self.source,
            }

            def write(staging: Path) -> None:
                save_params(model, staging / "model.safetensors", kind="finetune")
                save_optimizer_state(staging, optimizer, state, kind="finetune")

            write_folder(self.checkpoint, write)

    def log(self, line: dict[str, Any]) -> None:
        with self.metrics.open("a") as f:
            f.write(json.dumps(line) + "\n")


def check_same_model(folder: Path, digest: str) -> None:
    """Refuse to resume the run in ``folder`` from a model other than the one it started from
    (its weights' :func:`~graphkit.params.weights_digest` differs from the one its checkpoint
    recorded): the checkpoint would overwrite the model's weights and record the run as the
    other model's. A checkpoint written before digests were recorded cannot be checked."""
    recorded = read_trainer_state(folder / "checkpoint").get("source")
    if recorded is not None and recorded != digest:
        raise TrainError(
            f"--resume: {folder} was up-trained from another model (its starting weights differ from this "
            "model's); resume with the model it started from, or up-train into another --out"
        )


def finetune(
    model: nn.Module,
    folder: Path,
    config: FinetuneConfig,
    *,
    resume: bool = False,
    example_inputs: Any = None,
    progress: bool = True,
) -> dict[str, float]:
    """Up-train ``model`` (in place, on ``config.device``) as ``config`` says, in the run folder
    ``folder`` (checked by :func:`~graphkit.ghn.run_folder.run_folder`), on data shaped for it
    (:func:`~graphkit.ghn.data.data_config`: any transformers language model, graphkit's
    families); with ``resume``, from the checkpoint there, its options checked against the
    recorded ones. Returns the last step's training loss and the held-out loss and accuracy,
    also logged to metrics.jsonl."""
    device = torch.device(config.device or default_device(TrainError))
    shape = data_config(model, example_inputs)
    data = config.data or source_for(shape)
    started_from = weights_digest(model)
    if resume:
        check_resume(folder / "checkpoint", {**asdict(config), "data": data}, source_for(shape), names=RESUMED)
        check_same_model(folder, started_from)
    source = load_source(data, seq_len=config.seq_len)
    source.check(shape)
    model.to(device)

    def batch_at(step: int) -> Batch:
        x, y = source.batch(shape, config.batch_size, torch.Generator().manual_seed(step_seed(config.seed, step)))
        return x.to(device), y.to(device)

    generator = torch.Generator().manual_seed(config.seed)
    held_out = [source.batch(shape, config.batch_size, generator, split="eval") for _ in range(config.eval_batches)]
    held_out = [(x.to(device), y.to(device)) for x, y in held_out]
    run = UpTrainingRun(folder, config, data, resume, started_from)
    losses, _ = up_train(
        model,
        source.task,
        batch_at,
        config.steps,
        config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        run=run,
        progress=progress,
    )
    loss, accuracy = score(model, held_out, source.task)
    run.log({"step": config.steps, "eval_loss": loss, "eval_accuracy": accuracy})
    return {"step": config.steps, "loss": losses[-1] if losses else None, "eval_loss": loss, "eval_accuracy": accuracy}

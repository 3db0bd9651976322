"""Up-training: train a model graphkit loads on the bundled data or the user's (``graphkit finetune``).

Conversion papers up-train after converting (MHA2MLA with 0.6-1% of the pre-training data,
TransMLA, GQA's own 5%). :func:`finetune` runs the loop every up-training in graphkit runs
(:func:`graphkit.training.loop.up_train`) in a run folder, as ``graphkit train-ghn`` does
(:mod:`graphkit.training.run_folder`): ``checkpoint/`` (the model's parameters and buffers, the
optimizer's state and the step, replaced whole every ``checkpoint_every`` steps) and
``metrics.jsonl`` (the training loss every ``log_every`` steps, and the held-out loss and
accuracy at the end); ``resume`` continues from the checkpoint with the options it recorded.
A prediction whose patch embedding ``graphkit predict`` resized records a learning-rate factor
for it (:func:`graphkit.ghn.grow.lr_scale`), which :func:`lr_scale_of` reads back.
The command writes the trained model into the same folder, in either format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphkit.attention.hf_format import save_hf
from graphkit.attention.mla import attention_metadata
from graphkit.errors import TrainError
from graphkit.fileio import write_folder
from graphkit.params import load_params, read_params, save_params, weights_digest
from graphkit.tracing.export import describe_failure
from graphkit.tracing.inputs import evaluated
from graphkit.training.data import DataSource, data_config, load_source, model_inputs, output_loss, source_for
from graphkit.training.loop import Batch, forward_inputs, on_device, score, step_seed, up_train
from graphkit.training.run_folder import check_resume, nothing_left_unless_checkpointed, trim_metrics
from graphkit.training.state import load_optimizer_state, read_trainer_state, save_optimizer_state
from graphkit.validation import check_counts, check_device, check_number, check_seed, default_device, is_number

#: the options that shape an up-training's result: a resume must repeat them (steps may grow)
RESUMED = ("data", "lr", "warmup", "batch_size", "seq_len", "weight_decay", "seed", "lr_scale")
#: the safetensors metadata key of a prediction's learning-rate factors (JSON: name -> factor)
LR_SCALE_KEY = "graphkit_lr_scale"
#: what an up-training run folder holds (either format); a fresh run refuses a folder holding any
RUN_FILES = ("model.safetensors", "config.json", "generation_config.json", "metrics.jsonl", "checkpoint")


@dataclass
class FinetuneConfig:
    """How to up-train: ``steps`` AdamW steps at ``lr`` (constant after ``warmup`` steps of a linear
    warm-up: :func:`graphkit.training.loop.warmup_factor`) on batches of ``batch_size``
    from ``data`` (a spec as ``--data`` takes it; None: the model's bundled data), text windows of
    ``seq_len`` tokens; a checkpoint every ``checkpoint_every`` steps, a metrics line every
    ``log_every``; ``eval_batches`` held-out batches scored at the end; ``lr_scale`` trains the
    parameters it names at ``lr`` times their factor (:func:`lr_scale_of`). Every value is checked."""

    steps: int = 100
    lr: float = 3e-4
    warmup: int = 0
    batch_size: int = 16
    seq_len: int = 64
    weight_decay: float = 0.01
    data: str | None = None
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 10
    eval_batches: int = 4
    device: str | None = None  # None: $GRAPHKIT_DEVICE, else cuda if available, else cpu
    lr_scale: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_counts(
            self, ("steps", "batch_size", "seq_len", "checkpoint_every", "log_every", "eval_batches"), TrainError
        )
        check_counts(self, ("warmup",), TrainError, least=0)
        check_number("lr", self.lr, TrainError, positive=True)
        check_number("weight_decay", self.weight_decay, TrainError, positive=False)
        check_seed(self.seed, TrainError)
        check_device(self.device, TrainError)
        for name, factor in self.lr_scale.items():
            if not is_number(factor) or factor <= 0:  # not check_number: it would spell the name as a flag
                raise TrainError(f"lr scale of {name} must be a positive number; got {factor!r}")
        if self.data is not None:
            load_source(self.data)  # a bad spec fails before any model is loaded


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


def starting_weights(
    model: nn.Module, source: str, params: str | Path | None = None, lr_scale: Mapping[str, float] | None = None
) -> None:
    """Give ``model`` (loaded from ``source``, the name error lines use) the weights an up-training
    starts from: those of the parameters file ``params`` (``predict --out``'s prediction, or any
    graphkit parameters file), refused when the file holds a conversion ``model`` is not, or when
    ``lr_scale``, the factors read from it (:func:`lr_scale_of`), names a parameter ``model``
    lacks; without a file, the model's own, refused on the meta device."""
    if params is None:
        if any(p.is_meta for p in model.parameters()):
            raise TrainError(f"{source}: the model is on the meta device; finetune needs its weights")
        return
    unknown = sorted(set(lr_scale or {}) - {name for name, _ in model.named_parameters()})
    if unknown:
        raise TrainError(
            f"--params {params}: records an lr factor for {unknown[0]}, which {source} does not have; "
            "give --no-lr-scale to train it at one lr"
        )
    converted = read_params(params, tensors=False)[1].get("graphkit_attention")
    if converted is not None and attention_metadata(model).get("graphkit_attention") != converted:
        raise TrainError(
            f"--params {params}: holds a model converted to {converted} (its metadata), and {source} is not; "
            f"finetune the converted model (`graphkit convert ... -a {converted} --format hf`) instead"
        )
    load_params(model, params)


def lr_scale_of(params: str | Path, metadata: Mapping[str, str] | None = None) -> dict[str, float]:
    """The learning-rate factors a parameters file records (``graphkit predict`` writes them for
    a patch embedding it resized to a larger kernel and for the weights that read a width it grew:
    :func:`graphkit.ghn.grow.lr_scale`), by
    state-dict name; empty when it records none. ``metadata``: the file's header, when the caller
    has read it already. TrainError naming the file when the record is not a JSON object of
    positive finite numbers."""
    if metadata is None:
        metadata = read_params(params, tensors=False)[1]
    recorded = metadata.get(LR_SCALE_KEY)
    if recorded is None:
        return {}
    try:
        scales = json.loads(recorded)
    except ValueError:
        scales = None
    if not isinstance(scales, dict) or not all(is_number(v) and v > 0 for v in scales.values()):
        raise TrainError(
            f"--params {params}: its {LR_SCALE_KEY} metadata is not a JSON object of positive factors by parameter "
            "name; give --no-lr-scale to train it at one lr"
        )
    return {str(name): float(factor) for name, factor in scales.items()}


def lr_factor_phrase(factor: float) -> str:
    """``lr x 1/64`` for a factor of 1/64: how predict's and finetune's messages name a factor."""
    return f"lr x 1/{1 / factor:.3g}"


def lr_scale_phrase(scales: Mapping[str, float]) -> str:
    """The factors of ``scales`` in one phrase, parameters grouped by factor, smallest first:
    "patch_embed.proj.weight at lr x 1/64, 48 weights (blocks.0.attn.qkv.weight,
    blocks.0.attn.proj.weight, ...) at lr x 1/3". A grown model has one factor for every weight
    that reads its stream, so that predict and finetune say it in a line, not one line each.
    Factors the phrase rounds alike share a group: a Qwen2 grown from 128 to 384 wide and from
    341 to 1,024 in its MLP records 1/3 and 341/1024, both "lr x 1/3"."""
    groups: dict[str, list[str]] = {}
    for name, factor in sorted(scales.items(), key=lambda item: item[1]):
        groups.setdefault(lr_factor_phrase(factor), []).append(name)
    parts = []
    for phrase, names in groups.items():
        shown = ", ".join(names[:2]) + (", ..." if len(names) > 2 else "")
        listed = names[0] if len(names) == 1 else f"{len(names)} weights ({shown})"
        parts.append(f"{listed} at {phrase}")
    return ", ".join(parts)


def save_finetuned(model: nn.Module, folder: Path, format: str, record: dict[str, Any]) -> Path:
    """Write the up-trained ``model`` into its run folder ``folder`` in ``format``: ``hf``, as a
    model folder stock transformers loads (:func:`~graphkit.attention.hf_format.save_hf`, checked
    with :func:`~graphkit.attention.hf_format.check_stock` before training), else ``graphkit``,
    ``model.safetensors`` with the model's attention metadata; ``record`` (the run's options)
    goes into either. Returns the path written."""
    if format == "hf":
        return save_hf(model, folder, {"finetune": record}, in_place=True)
    metadata = {**attention_metadata(model), "graphkit_finetune": json.dumps(record)}
    save_params(model, folder / "model.safetensors", metadata=metadata, kind="finetune")
    return folder / "model.safetensors"


def check_output(model: nn.Module, batch: Batch, source: DataSource, shape: Mapping[str, Any]) -> None:
    """Refuse, before any step, a model whose output on ``batch`` is not what ``source`` scores:
    class logits for images, next-token logits for text. ImageGPT's image classifier reads colour
    tokens as a language model does (``data_config`` gives it text) but scores classes. A timm
    model built with ``num_classes=0`` returns its pooled features, which a loss would read as
    logits of as many classes."""
    if getattr(model, "num_classes", None) == 0 and isinstance(getattr(model, "pretrained_cfg", None), Mapping):
        raise TrainError(
            f"{type(model).__name__} was built with num_classes=0 and returns features, not class logits: "
            "build it with the classes to train (timm:NAME?num_classes=10)"
        )
    try:
        output = evaluated(model, forward_inputs(model, *batch))
    except Exception as e:  # the model's own forward, on inputs of the shape it reads: where it failed
        raise TrainError(f"{describe_failure(e, model)} (on a batch of {source.spec})") from e
    try:
        output_loss(source.task, output, batch[1])
    except ValueError as e:
        raise TrainError(
            f"{shape.get('family')} model: its output does not fit {source.spec} ({e}); finetune trains "
            "image classifiers on images and language models on text"
        ) from None


def finetune(
    model: nn.Module,
    folder: Path,
    config: FinetuneConfig,
    *,
    resume: bool = False,
    example_inputs: Any = None,
    progress: bool = True,
) -> dict[str, float | None]:
    """Up-train ``model`` (in place, on ``config.device``) as ``config`` says, in the run folder
    ``folder`` (checked by :func:`~graphkit.training.run_folder.run_folder`), on data shaped for it
    (:func:`~graphkit.training.data.data_config`: any transformers language model, graphkit's
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

    def drawn(generator: torch.Generator, split: str = "train") -> Batch:
        x, y = source.batch(shape, config.batch_size, generator, split=split)
        return on_device((model_inputs(x, shape), y), device)

    def batch_at(step: int) -> Batch:
        return drawn(torch.Generator().manual_seed(step_seed(config.seed, step)))

    generator = torch.Generator().manual_seed(config.seed)
    held_out = [drawn(generator, "eval") for _ in range(config.eval_batches)]
    check_output(model, held_out[0], source, shape)
    run = UpTrainingRun(folder, config, data, resume, started_from)
    with nothing_left_unless_checkpointed(folder, RUN_FILES, resume):
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
            lr_scale=config.lr_scale,
            warmup=config.warmup,
        )
        loss, accuracy = score(model, held_out, source.task)
        run.log({"step": config.steps, "eval_loss": loss, "eval_accuracy": accuracy})
    return {"step": config.steps, "loss": losses[-1] if losses else None, "eval_loss": loss, "eval_accuracy": accuracy}

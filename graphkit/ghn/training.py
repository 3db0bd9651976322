"""Train a LoGAH on a graph dataset (LoGAH section 4, GHN-3's recipe).

Each step samples ``meta_batch`` architectures of the train split, predicts all their
parameters in one hypernetwork pass, runs every model on a data batch with the predicted
parameters (``torch.func.functional_call``: models are built once, their own weights are never
allocated) and backpropagates the mean cross-entropy plus ``gamma`` times the mean over models
of the summed L2 norms of the predicted parameters. AdamW, cosine schedule, gradient clipping,
bf16 autocast on GPU, atomic checkpoints every ``checkpoint_every`` steps, ``resume``, a metrics
log (``metrics.jsonl``) and a progress bar.

Under ``torchrun`` every process samples its own architectures and data (seeded by step and
rank, so a resumed run draws the same ones) and DDP averages the gradients.

    >>> train(TrainConfig(dataset="out/vits-1k", out="runs/tiny", steps=1000))
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphkit.datasets import load
from graphkit.errors import GraphkitError
from graphkit.families import build_model
from graphkit.fileio import atomic_path, check_output_dir, figure_metadata, write_text_atomic
from graphkit.ghn.checkpoint import load_checkpoint, load_optimizer_state, read_trainer_state, save_checkpoint
from graphkit.ghn.config import DECODERS, LOGAH_VARIANTS, LoGAHConfig
from graphkit.ghn.data import default_source, load_source, output_loss
from graphkit.ghn.encoding import EncodedGraph, encode, role_of
from graphkit.ghn.model import LoGAH
from graphkit.ghn.options import check_counts, check_device, check_flag, check_number, check_seed, default_device
from graphkit.ghn.space import training_space

#: the default of ``TrainConfig.lr_fan_in`` (``--lr-fan-in``): every nn.Linear weight of the
#: hypernetwork trains at lr * min(1, lr_fan_in / fan-in); see parameter_groups. 64 fits one
#: architecture best (32 and 128 do worse on the fit tests); pools that mix many widths and
#: depths leave their plateau sooner at 8 (docs/experiments.md has the seed study and the sweep)
LR_FAN_IN = 64
#: the per-parameter gain head trains at GAIN_LR times the base lr; see parameter_groups
GAIN_LR = 0.1
#: devices with a fused AdamW: one kernel per parameter group instead of about nine per tensor
FUSED_DEVICES = ("cpu", "cuda")


class TrainError(GraphkitError):
    """Training cannot start or continue (bad dataset, data, resume folder or loss)."""


@dataclass
class TrainConfig:
    """Everything a training run depends on; saved in every checkpoint. Every value is checked
    when the config is made (TrainError, one line naming the option and what it accepts)."""

    dataset: str
    out: str
    data: str | None = None  # a data source spec; None: the family's bundled default
    variant: str = "tiny"
    decoder: str = "low_rank"  # or "ghn3", the tiling baseline
    depth_buckets: int = LoGAHConfig.depth_buckets  # the encoder's relative-depth embeddings; 0: none
    role_maps: bool = False  # one r -> K map per parameter role (LoGAHConfig.roles: the train split's)
    meta_batch: int = 4  # architectures per step (per process)
    batch_size: int = 32  # images or sequences per architecture
    seq_len: int = 64
    steps: int = 1000
    lr: float = 3e-4
    lr_fan_in: float = LR_FAN_IN  # Linear weights train at lr * min(1, lr_fan_in / fan-in)
    weight_decay: float = 1e-2
    gamma: float = 3e-5  # predicted-parameter norm penalty
    clip: float = 5.0
    amp: bool | None = None  # bf16 autocast; None: on when training on a GPU
    deterministic: bool = False  # deterministic kernels on a GPU (see repeatable); CPU runs repeat without
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 10
    split: str = "train"
    device: str | None = None  # None: $GRAPHKIT_DEVICE, else cuda:LOCAL_RANK if available, else cpu

    def __post_init__(self) -> None:
        check_counts(
            self, ("steps", "meta_batch", "batch_size", "seq_len", "checkpoint_every", "log_every"), TrainError
        )
        check_counts(self, ("depth_buckets",), TrainError, least=0)
        check_number("lr", self.lr, TrainError, positive=True)
        check_number("clip", self.clip, TrainError, positive=True)
        check_number("lr_fan_in", self.lr_fan_in, TrainError, positive=True)
        for name in ("weight_decay", "gamma"):
            check_number(name, getattr(self, name), TrainError, positive=False)
        check_seed(self.seed, TrainError)
        check_device(self.device, TrainError)
        if self.variant not in LOGAH_VARIANTS:
            raise TrainError(f"unknown LoGAH variant {self.variant!r}; known: {', '.join(LOGAH_VARIANTS)}")
        if self.decoder not in DECODERS:
            raise TrainError(f"unknown decoder {self.decoder!r}; accepted: {', '.join(DECODERS)}")
        check_flag("role_maps", self.role_maps, TrainError)
        check_flag("deterministic", self.deterministic, TrainError)
        if self.role_maps and self.decoder != "low_rank":
            raise TrainError(f"--role-maps needs the low_rank decoder, not {self.decoder!r}")


class ArchPool:
    """The distinct architectures of a dataset split, each with its encoding for the hypernetwork
    and a parameter-less model for ``functional_call``, built on first use."""

    def __init__(self, dataset: str | Path, split: str = "train", device: str | torch.device = "cpu") -> None:

        distinct: dict[str, Any] = {}
        everything = load(dataset)
        for record in everything.filter(split=split):
            distinct.setdefault(record["fingerprint"], record)
        self.records = list(distinct.values())
        if not self.records:
            splits = sorted(set(everything.metadata("arrow").column("split").to_pylist()))
            raise TrainError(
                f"{dataset}: no records in split {split!r}; its splits: {', '.join(splits) or 'none (empty)'}"
            )
        families = {r.config["family"] for r in self.records}
        if len(families) > 1:
            raise TrainError(f"{dataset}: mixes families {sorted(families)}; train one hypernetwork per family")
        self.family = families.pop()
        self.device = torch.device(device)

    def __len__(self) -> int:
        return len(self.records)

    @functools.cache
    def encoded(self, index: int, config: LoGAHConfig) -> EncodedGraph:
        """Architecture ``index`` encoded for a LoGAH of ``config`` (once per pool)."""
        return encode(self.records[index].graph, config)

    @functools.lru_cache(maxsize=256)
    def model(self, index: int) -> nn.Module:
        """Architecture ``index`` with real buffers and parameters on meta (functional_call
        supplies them), so a cached model costs no weight memory."""
        return functional_model(self.records[index].config, self.device)

    def ops(self) -> list[str]:
        """Every op the pool's graphs use."""
        return sorted({node.op for r in self.records for node in r.graph.nodes})

    def roles(self) -> list[str]:
        """Every parameter role (:func:`~graphkit.ghn.encoding.role_of`) of the pool's graphs."""
        return sorted({role_of(name) for r in self.records for node in r.graph.nodes for name in node.params})


def functional_model(config: dict[str, Any], device: str | torch.device) -> nn.Module:
    """The model of ``config`` on ``device`` with its parameters on meta (ties kept): a shell for
    ``functional_call`` that allocates no weights but has real buffers (rotary tables, masks)."""

    model = build_model(config, device, init=False)
    metas: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in metas:
                    metas[id(param)] = nn.Parameter(param.to("meta"), requires_grad=False)
                module._parameters[name] = metas[id(param)]
    return model


def parameter_groups(ghn: LoGAH, lr: float, fan_in: float = LR_FAN_IN) -> list[dict[str, Any]]:
    """AdamW parameter groups: every ``nn.Linear`` weight at ``lr * min(1, fan_in / its fan-in)``,
    the decoder's role maps as its low-rank map (they are rows of it), the decoder's gain head
    at ``GAIN_LR * lr``, everything else (embeddings, norms, biases) at ``lr``.

    Why (docs/experiments.md has the measurements): Adam moves every weight by about ``lr`` a step
    whatever its gradient's size, so when the updates of a Linear layer agree, its output moves by
    about ``lr * fan_in`` times its input. A hypernetwork's shared layers produce every parameter
    of the target model at once, so at the paper's lr one step replaced every predicted weight
    (93% of its size) and training fell into a dead state, uniform output and vanishing gradients,
    that it never left. Scaling each Linear weight's lr by 1 / fan-in (muP's rule for Adam) keeps
    the change of every predicted weight near what direct training makes (a few percent). The gain
    head sets the scale of every predicted weight through one shared readout, so it moves slower
    still. The constant ``fan_in`` trades one architecture's speed for a mixed pool's: 64 fits a
    single model fastest, 8 takes a pool of many widths and depths off its plateau sooner."""
    gain = getattr(ghn.decoder, "gain", None)
    groups: list[dict[str, Any]] = []
    seen: set[int] = set()

    def scaled(width: int) -> float:
        return lr * min(1.0, fan_in / width)

    for module in ghn.modules():
        if isinstance(module, nn.Linear):
            groups.append(
                {"params": [module.weight], "lr": lr * GAIN_LR if module is gain else scaled(module.in_features)}
            )
            seen.add(id(module.weight))
            if module is gain and module.bias is not None:
                groups.append({"params": [module.bias], "lr": lr * GAIN_LR})
                seen.add(id(module.bias))
    role_maps = getattr(ghn.decoder, "role_maps", None)
    if role_maps is not None:
        groups.append({"params": [role_maps], "lr": scaled(role_maps.shape[-1])})  # rows of an r-in map
        seen.add(id(role_maps))
    rest = [p for p in ghn.parameters() if id(p) not in seen]
    return groups + [{"params": rest, "lr": lr}]


def gradient_norms(ghn: LoGAH) -> dict[str, float]:
    """The gradient norm of each part of the hypernetwork (encoder, decoder MLP, low-rank map,
    gain head, decoder embeddings), for metrics.jsonl: a part whose norm collapses or explodes
    shows where training goes wrong."""
    parts: dict[str, list[torch.Tensor]] = {}
    for name, param in ghn.named_parameters():
        if param.grad is not None:
            top, _, rest = name.partition(".")
            part = top if top == "encoder" else rest.split(".")[0]
            parts.setdefault("embed" if part.endswith("_embed") else part, []).append(
                param.grad.detach().float().norm()
            )
    return {part: torch.stack(norms).norm().item() for part, norms in parts.items()}


def make_optimizer(ghn: LoGAH, config: TrainConfig) -> torch.optim.AdamW:
    """Training's optimiser: AdamW over :func:`parameter_groups`, fused where torch has a fused
    kernel for the hypernetwork's device (:data:`FUSED_DEVICES`)."""
    device = next(ghn.parameters()).device
    return torch.optim.AdamW(
        parameter_groups(ghn, config.lr, config.lr_fan_in),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=device.type in FUSED_DEVICES,
    )


def meta_batch_loss(
    model: nn.Module,
    graphs: Sequence[EncodedGraph],
    pool: ArchPool,
    indices: Sequence[int],
    source,
    config: TrainConfig,
    generator: torch.Generator,
    amp: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training step's forward: the loss (mean cross-entropy plus ``gamma`` times the mean
    parameter norm), its parts (cross-entropy, metric, norm) and the node embeddings. ``model``
    is the LoGAH, or its DDP wrapper; ``graphs`` are the encodings of ``indices``."""
    with torch.autocast(pool.device.type, dtype=torch.bfloat16, enabled=amp):
        predicted, norms, nodes = model(graphs, details=True)
    ce, metric = run_models(pool, indices, predicted, source, config, generator, torch.bfloat16 if amp else None)
    penalty = norms.mean()
    return ce + config.gamma * penalty, ce, metric, penalty, nodes


def run_models(
    pool: ArchPool,
    indices: Sequence[int],
    predicted: Sequence[dict[str, torch.Tensor]],
    source,
    config: TrainConfig,
    generator: torch.Generator,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean loss and mean metric (accuracy) of the models ``indices`` with ``predicted``
    parameters, each on its own data batch; with ``dtype``, the models run in it throughout
    (parameters and images; the loss in float32).

    Why a dtype and not autocast for the target models: the hypernetwork decodes in bf16 under
    autocast, and autocast would cast every LayerNorm's input, weight and bias to float32 and
    back, and each Linear's input to bf16, in the forward and again in the backward: about 1,000
    of a meta-batch-8 step's kernel launches. bf16 norms accumulate in float32 and round their
    output, as the next Linear's cast did, so little else changes."""

    losses, metrics = [], []
    for index, params in zip(indices, predicted):
        model = pool.model(index).train()
        inputs, labels = source.batch(pool.records[index].config, config.batch_size, generator)
        inputs = inputs.to(pool.device)
        if dtype is not None:
            params = {name: value.to(dtype) for name, value in params.items()}  # no copy for those already in it
            inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
        output = functional_call(model, params, (inputs,))
        loss, metric = output_loss(source.task, output, labels.to(pool.device))
        losses.append(loss)
        metrics.append(metric)
    return torch.stack(losses).mean(), torch.stack(metrics).float().mean()


@contextlib.contextmanager
def repeatable(enabled: bool) -> Iterator[None]:
    """Deterministic kernels for the block, when ``enabled``: ``torch.use_deterministic_algorithms``
    (an op that has no deterministic kernel raises), cuBLAS with a fixed workspace
    (``CUBLAS_WORKSPACE_CONFIG``, set if unset) and SDPA's math kernel (the flash and
    memory-efficient backwards accumulate in a varying order). The global settings are restored
    afterwards.

    Why: on a GPU, atomic adds (index_add, the scatter in an embedding's or a gather's backward)
    sum in a varying order, so two runs, or a run and its resume, drift apart in the last bits
    and then further. CPU runs repeat exactly without this. The price is speed: the math
    attention kernel and the sorted accumulations are slower than the defaults."""
    if not enabled:
        yield
        return

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def machine(device: torch.device, world: int = 1) -> str:
    """Where a run trains, for config.json: "2 CPU cores", "1 x NVIDIA H100 80GB HBM3"."""
    if device.type == "cuda":
        return f"{world} x {torch.cuda.get_device_name(device)}"
    return f"{len(os.sched_getaffinity(0))} CPU cores" + (f", {world} processes" if world > 1 else "")


def train(config: TrainConfig, resume: bool = False, progress: bool = True) -> dict[str, float]:
    """Train (or, with ``resume``, continue training) a LoGAH as ``config`` says; writes
    ``config.out/checkpoint`` every ``checkpoint_every`` steps and the final hypernetwork to
    ``config.out``; returns the last logged metrics. The run folder, the dataset, the data and
    (with ``resume``) the recorded options are checked before the first step and the first write
    (see :func:`run_folder`, :func:`check_resume`)."""

    rank, world, device = _distributed(config.device)
    out = run_folder(config.out, resume, config.dataset)
    pool = ArchPool(config.dataset, config.split, device)
    data = config.data or default_source(pool.family)
    if resume:
        check_resume(out / "checkpoint", config, data, default_source(pool.family), world)
    source = load_source(data, seq_len=config.seq_len)
    source.check(pool.records[0].config)  # fail before the first step, not inside it
    torch.manual_seed(config.seed)  # the same seed, the same hypernetwork: runs (and resumes) repeat exactly
    ghn = LoGAH.from_variant(
        config.variant, config.decoder, config.depth_buckets, pool.roles() if config.role_maps else ()
    ).to(device)
    optimizer = make_optimizer(ghn, config)
    start = _resume(out / "checkpoint", ghn, optimizer) if resume else 0
    cosine = lambda s: 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine, last_epoch=start - 1
    )  # resumed: the lr of ``start``
    model = nn.parallel.DistributedDataParallel(ghn) if world > 1 else ghn
    amp = device.type == "cuda" if config.amp is None else config.amp
    info = {
        "variant": config.variant,
        "family": pool.family,
        "trained_ops": pool.ops(),
        "data": data,
        "train": asdict(config),
        "dataset": str(config.dataset),
        "space": training_space(r.graph for r in pool.records),
        "trained_on": machine(device, world),
    }
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    metrics_file = out / "metrics.jsonl"
    if resume and rank == 0 and metrics_file.exists():  # lines logged after the checkpoint will be logged again
        write_text_atomic(
            metrics_file,
            "".join(line for line in metrics_file.read_text().splitlines(keepends=True) if _logged_step(line) <= start),
        )
    last: dict[str, float] = {}
    columns = (
        TextColumn("train-ghn"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
    )
    with repeatable(config.deterministic), Progress(*columns, disable=not (progress and rank == 0)) as bar:
        task = bar.add_task("train", total=config.steps, completed=start, loss="-")
        tic, diagnostics = time.perf_counter(), _Stopwatch()  # archs_per_s leaves out what only the log needs
        for step in range(start, config.steps):
            step_seed = config.seed * 1_000_003 + step * 4099 + rank
            torch.manual_seed(step_seed)  # dropout in the target models draws from here: a resumed step repeats too
            generator = torch.Generator().manual_seed(step_seed)
            indices = torch.randint(len(pool), (config.meta_batch,), generator=generator).tolist()
            graphs = [pool.encoded(i, ghn.config) for i in indices]
            loss, ce, metric, penalty, nodes = meta_batch_loss(
                model, graphs, pool, indices, source, config, generator, amp
            )
            if not torch.isfinite(loss):
                raise TrainError(
                    f"step {step}: the loss is {loss.item()}; resume from {out / 'checkpoint'} with a lower --lr"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            logging = (step + 1) % config.log_every == 0 or step + 1 == config.steps
            with diagnostics:
                norms = gradient_norms(ghn) if logging else {}
            grad_norm = nn.utils.clip_grad_norm_(ghn.parameters(), config.clip)
            if not torch.isfinite(grad_norm):  # clipping by a NaN or Inf norm would write NaN into every weight
                raise TrainError(
                    f"step {step}: the gradient norm is {grad_norm.item()}; resume from {out / 'checkpoint'} "
                    "with a lower --lr"
                )
            optimizer.step()
            schedule.step()
            done = step + 1
            if logging:
                values = torch.stack([loss.detach(), ce.detach(), metric.detach(), penalty.detach()])
                if world > 1:
                    dist.all_reduce(values)
                    values /= world
                with diagnostics:
                    health = {
                        **_factor_similarity(ghn, nodes, graphs),
                        **_feature_constancy(ghn, nodes, graphs[0], pool, indices[0], source, config, step_seed),
                    }
                elapsed = time.perf_counter() - tic - diagnostics.seconds
                last = {
                    "step": done,
                    "loss": values[0].item(),
                    "ce": values[1].item(),
                    "metric": values[2].item(),
                    "norm": values[3].item(),
                    "lr": optimizer.param_groups[-1]["lr"],
                    "grad_norm": grad_norm.item(),
                    "archs_per_s": config.meta_batch * world * (done - start) / elapsed,
                    "world_size": world,
                    "grad_norms": norms,
                    **health,
                }
                if rank == 0:
                    with metrics_file.open("a") as f:
                        f.write(json.dumps(last) + "\n")
            bar.update(task, completed=done, loss=f"{loss.item():.3f}")
            if done % config.checkpoint_every == 0 or done == config.steps:
                if rank == 0:
                    save_checkpoint(
                        out / "checkpoint",
                        ghn,
                        info,
                        optimizer=optimizer,
                        state={"step": done, "config": asdict(config), "world_size": world},
                    )
                if world > 1:
                    dist.barrier()
    if rank == 0:
        save_checkpoint(out, ghn, {**info, "steps": config.steps, "metrics": last})
        if metrics_file.exists():
            plot_metrics(metrics_file, out / "metrics.png")
    if world > 1:
        dist.destroy_process_group()
    return last


def plot_metrics(metrics_file: str | Path, png: str | Path) -> None:
    """The run's curves as a PNG: training loss and accuracy, the gradient norm of each part of the
    hypernetwork (log scale), the factor similarity and the feature constancy, by step. A collapse
    shows as gradient norms falling by orders of magnitude while the similarity climbs towards 1;
    a plateau where the predicted models ignore their input, as a constancy far above 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(line) for line in Path(metrics_file).read_text().splitlines()]
    steps = [m["step"] for m in lines]
    fig, (loss_ax, grad_ax, sim_ax, const_ax) = plt.subplots(1, 4, figsize=(17, 3.6))
    loss_ax.plot(steps, [m["ce"] for m in lines], label="cross-entropy")
    loss_ax.set(xlabel="step", ylabel="training cross-entropy", title="loss")
    accuracy_ax = loss_ax.twinx()
    accuracy_ax.plot(steps, [m["metric"] for m in lines], color="tab:orange", alpha=0.6)
    accuracy_ax.set_ylabel("accuracy (orange)")
    for part in sorted({p for m in lines for p in m.get("grad_norms", {})}):
        grad_ax.plot(steps, [m.get("grad_norms", {}).get(part, float("nan")) for m in lines], label=part)
    grad_ax.set(xlabel="step", ylabel="gradient norm (before clipping)", yscale="log", title="gradients per part")
    grad_ax.legend(fontsize=7)
    sim_ax.plot(steps, [m.get("factor_similarity", float("nan")) for m in lines])
    sim_ax.set(xlabel="step", ylabel="mean cosine of factors", ylim=(0, 1), title="factor similarity")
    const_ax.plot(steps, [m.get("feature_constancy", float("nan")) for m in lines])
    const_ax.set(
        xlabel="step",
        ylabel="|mean| / spread of the head's input",
        yscale="log",
        title="feature constancy (high: output ignores input)",
    )
    fig.tight_layout()
    with atomic_path(png) as tmp:  # a PNG is complete or not there
        fig.savefig(tmp, dpi=110, format="png", metadata=figure_metadata("png"))
    plt.close(fig)


class _Stopwatch:
    """Seconds spent inside its ``with`` blocks, summed: the log's diagnostics (per-part gradient
    norms, factor similarity, feature constancy) cost a decode and a forward of their own, which
    ``archs_per_s`` leaves out so that it measures training, whatever ``--log-every`` is."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> None:
        self._tic = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._tic


def feature_constancy(model: nn.Module, params: dict[str, torch.Tensor], inputs: torch.Tensor, head: str) -> float:
    """How little a model's output depends on its input: the features entering its output head
    (module path ``head``), run in eval mode with ``params``, as the norm of their mean over the
    batch (and tokens) over their mean distance from that mean. Below 1 at random init; far above
    when the output hardly depends on the input, as on the plateaus a hypernetwork can train
    into: a ViT's class token that ignores the image, a GPT-2 whose residual stream is a constant
    (docs/experiments.md has the values checkpoints gave)."""
    captured: list[torch.Tensor] = []
    hook = model.get_submodule(head).register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    try:
        with torch.no_grad():
            functional_call(model.eval(), params, (inputs,))
    finally:
        hook.remove()
    features = captured[0].float().flatten(0, -2)
    mean = features.mean(0)
    return (mean.norm() / (features - mean).norm(dim=-1).mean().clamp_min(1e-12)).item()


def _feature_constancy(
    ghn: LoGAH,
    nodes: torch.Tensor,
    graph: EncodedGraph,
    pool: ArchPool,
    index: int,
    source,
    config: TrainConfig,
    seed: int,
) -> dict[str, float]:
    """The step's :func:`feature_constancy` for the meta-batch's first architecture, decoded again
    from the step's node embeddings on a batch of its own (the training draws are left as they
    are); {} for a graph without an output head."""
    head = next((node.module for node in pool.records[index].graph.nodes if node.op == "head"), None)
    if head is None:
        return {}
    with torch.no_grad():
        decoded, _ = ghn.decoder(nodes[: graph.num_nodes].detach().float(), [graph])  # per graph: parameters, norm
    params = decoded[0]
    inputs, _ = source.batch(pool.records[index].config, config.batch_size, torch.Generator().manual_seed(seed))
    return {"feature_constancy": feature_constancy(pool.model(index), params, inputs.to(pool.device), head)}


def _factor_similarity(ghn: LoGAH, nodes: torch.Tensor, graphs: Sequence[EncodedGraph]) -> dict[str, float]:
    """The step's factor similarity from the node embeddings its forward made (no second encoder
    pass); {} for the GHN-3 baseline, which has no factors."""
    if not hasattr(ghn.decoder, "factor_similarity"):
        return {}
    return {"factor_similarity": ghn.decoder.factor_similarity(nodes.detach().float(), graphs)}


#: what a run folder holds (see train); a fresh run refuses a folder holding any of them
RUN_FILES = ("model.safetensors", "config.json", "metrics.jsonl", "metrics.png", "checkpoint")
#: the options that shape a run's result: a resume must repeat them (steps may grow; logging,
#: checkpointing and the device may change)
RESUMED_OPTIONS = (
    "variant",
    "decoder",
    "depth_buckets",
    "role_maps",
    "dataset",
    "data",
    "split",
    "meta_batch",
    "batch_size",
    "seq_len",
    "lr",
    "lr_fan_in",
    "weight_decay",
    "gamma",
    "clip",
    "amp",
    "seed",
)


def run_folder(out: str | Path, resume: bool, dataset: str | Path) -> Path:
    """The absolute run folder for ``--out`` (``.`` included), checked before any work: it must
    be (or become) a folder outside the dataset, a fresh run must not land on an earlier run's
    files (or anyone else's files of those names), and a resumed one must find a training
    checkpoint there."""
    folder = Path(os.path.abspath(check_output_dir(out)))
    data_folder = Path(os.path.abspath(dataset))
    if folder == data_folder or data_folder in folder.parents:
        raise TrainError(f"--out {out}: lies in the dataset folder {dataset}; choose another --out")
    if resume:
        if not (folder / "checkpoint" / "trainer_state.json").is_file():
            raise TrainError(f"{folder / 'checkpoint'}: nothing to resume (no training checkpoint there)")
        return folder
    clash = next((name for name in RUN_FILES if (folder / name).exists()), None)
    if clash is not None:
        raise TrainError(
            f"--out {out}: already holds {clash}; continue that run with --resume, or choose another --out "
            "(nothing was changed)"
        )
    return folder


def check_resume(folder: Path, config: TrainConfig, data: str, default_data: str, world: int = 1) -> None:
    """Refuse a resume whose options differ from those the checkpoint in ``folder`` was trained
    with (they would be recorded as if used throughout), with another number of processes
    (each draws its own meta-batch), or whose ``--steps`` is below the steps already done.
    ``data`` is the run's resolved data source, ``default_data`` the family's (what a run
    recorded without ``--data`` used)."""
    state = read_trainer_state(folder)
    if state.get("world_size", world) != world:
        raise TrainError(
            f"--resume: {folder.parent} was trained by {state['world_size']} processes, not {world}; "
            f"resume it with {state['world_size']} processes"
        )
    # a run recorded before the encoder read depth or had role maps has neither
    recorded = {
        "depth_buckets": 0,
        "role_maps": False,
        **state["config"],
        "data": state["config"].get("data") or default_data,
    }
    given = {**asdict(config), "data": data}
    for name in RESUMED_OPTIONS:
        if name not in recorded:  # an option added after the run was recorded: it cannot be checked
            continue
        before, now = recorded[name], given[name]
        same = before == now or (name == "dataset" and Path(str(before)).resolve() == Path(now).resolve())
        if not same:
            raise TrainError(
                f"--resume: {folder.parent} was trained with --{name.replace('_', '-')} {before}, "
                f"not {now}; resume with the run's options, or train into another --out"
            )
    if config.steps < state["step"]:
        raise TrainError(
            f"--steps {config.steps}: {folder.parent} has already trained {state['step']} steps; "
            f"resume with --steps {state['step']} or more"
        )


def _logged_step(line: str) -> float:
    """The step of a metrics.jsonl line; a line cut short by an interruption counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def _resume(folder: Path, ghn: LoGAH, optimizer: torch.optim.Optimizer) -> int:
    saved = load_checkpoint(folder)
    if saved.config != ghn.config:
        raise TrainError(
            f"{folder}: holds a LoGAH {saved.info.get('variant')} with another config; resume with the same --variant"
        )
    ghn.load_state_dict(saved.state_dict())
    state = load_optimizer_state(folder, optimizer)
    return int(state["step"])


def _distributed(device: str | None) -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group torchrun describes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(device or default_device(TrainError, local))
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank() if world > 1 else 0), world, device

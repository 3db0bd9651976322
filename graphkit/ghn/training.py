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
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphkit.errors import CheckpointError, TrainError
from graphkit.families import get_family
from graphkit.ghn.checkpoint import load_checkpoint, save_checkpoint
from graphkit.ghn.config import DECODERS, LOGAH_VARIANTS, ROLE_KEYS, LoGAHConfig
from graphkit.ghn.diagnostics import (
    Stopwatch,
    decoded_feature_constancy,
    factor_similarity,
    gradient_norms,
    plot_metrics,
)
from graphkit.ghn.encoding import EncodedGraph
from graphkit.ghn.keep_init import onto_init
from graphkit.ghn.model import LoGAH
from graphkit.ghn.pool import ArchPool
from graphkit.ghn.space import input_task, training_space
from graphkit.training.data import DEFAULT_SOURCES, default_source, load_source, output_loss
from graphkit.training.loop import step_seed
from graphkit.training.run_folder import check_resume, nothing_left_unless_checkpointed, run_folder, trim_metrics
from graphkit.training.state import load_optimizer_state
from graphkit.validation import (
    check_counts,
    check_device,
    check_flag,
    check_number,
    check_seed,
    default_device,
    is_count,
)

#: the default of ``TrainConfig.lr_fan_in`` (``--lr-fan-in``): every nn.Linear weight of the
#: hypernetwork trains at lr * min(1, lr_fan_in / fan-in); see parameter_groups. 64 fits one
#: architecture best (32 and 128 do worse on the fit tests); pools that mix many widths and
#: depths leave their plateau sooner at 8 (docs/experiments.md has the seed study and the sweep)
LR_FAN_IN = 64
#: the per-parameter gain head trains at GAIN_LR times the base lr; see parameter_groups
GAIN_LR = 0.1
#: the default of ``TrainConfig.look_ahead_lr``: the rate ``eval-ghn`` fine-tunes at (EvalConfig.lr)
LOOK_AHEAD_LR = 3e-4
#: consecutive steps with a non-finite loss or gradient norm that stop training (fewer are skipped)
SKIPPED_IN_A_ROW = 5
#: devices with a fused AdamW: one kernel per parameter group instead of about nine per tensor
FUSED_DEVICES = ("cpu", "cuda")
#: what a run folder holds (see train); a fresh run refuses a folder holding any of them
RUN_FILES = ("model.safetensors", "config.json", "metrics.jsonl", "metrics.png", "checkpoint")
#: the options that shape a run's result: a resume must repeat them (steps may grow; logging,
#: checkpointing and the device may change)
RESUMED_OPTIONS = (
    "variant",
    "decoder",
    "depth_buckets",
    "tie_feature",
    "init_anchors",
    "table_gain",
    "level_head",
    "role_factors",
    "role_means_start",
    "role_vectors",
    "keep_init",
    "initial_checkpoint",
    "zoo_families",
    "mix_families",
    "role_maps",
    "role_key",
    "max_roles",
    "role_rows",
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
    "spread",
    "correction",
    "look_ahead",
    "look_ahead_lr",
    "clip",
    "amp",
    "seed",
)
#: the options a run recorded before the encoder read depth or tying or had role maps used
UNRECORDED = {
    "depth_buckets": 0,
    "tie_feature": False,
    "init_anchors": False,
    "table_gain": LoGAHConfig.table_gain,
    "level_head": False,
    "role_factors": False,
    "role_means_start": False,
    "role_vectors": False,
    "keep_init": False,
    "initial_checkpoint": None,
    "zoo_families": None,
    "mix_families": False,
    "role_maps": False,
    "role_key": LoGAHConfig.role_key,
    "max_roles": None,
    "role_rows": LoGAHConfig.role_rows,
    "spread": 0.0,
    "correction": 0.0,
    "look_ahead": 0,
    "look_ahead_lr": LOOK_AHEAD_LR,
}


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
    tie_feature: bool = LoGAHConfig.tie_feature  # the encoder reads which nodes share a tied token table
    init_anchors: bool = True  # 1-D parameters decoded around their model's init constants (LoGAHConfig.init_anchors)
    table_gain: float = LoGAHConfig.table_gain  # token and position tables at this times the weights' RMS
    level_head: bool = LoGAHConfig.level_head  # a learned level per 1-D parameter (LoGAHConfig.level_head)
    role_factors: bool = LoGAHConfig.role_factors  # a pair of factors per role map (LoGAHConfig.role_factors)
    # the role factors start at the mean of what the fresh MLP gives each role's queries over the
    # train split (all of it, as the role maps, with zoo_families too), the MLP's last layer at zero
    # (LoGAH.start_at_role_means); needs role_factors
    role_means_start: bool = False
    role_vectors: bool = LoGAHConfig.role_vectors  # a vector per role map for its 1-D parameters (LoGAHConfig)
    role_maps: bool = False  # one r -> K map per parameter role (LoGAHConfig.roles: the train split's)
    role_key: str = LoGAHConfig.role_key  # how a name becomes a role (ROLE_KEYS; needs role_maps)
    max_roles: int | None = None  # maps for only the train split's most frequent roles; None: every role
    role_rows: int = LoGAHConfig.role_rows  # rows of the map each role owns (LoGAHConfig.role_rows)
    keep_init: bool = False  # train the prediction as predict(keep_init=True) writes it: onto a fresh init per step
    # start from this checkpoint's weights (a folder or bundled name) instead of a fresh LoGAH of the
    # same config: a curriculum's later stage (a small pool first, docs/experiments.md); None: fresh
    initial_checkpoint: str | None = None
    # train on only these families of a mini zoo (their zoo_family), role maps still the whole
    # split's: a curriculum's first stage, which a stage on the whole zoo starts from; None: all
    zoo_families: list[str] | None = None
    # each step's architectures from meta_batch different zoo families, every family alike
    # (ArchPool.draw); False: uniformly over the architectures, as GHN-3 and LoGAH draw
    mix_families: bool = False
    meta_batch: int = 4  # architectures per step (per process)
    batch_size: int = 32  # images or sequences per architecture
    seq_len: int = 64
    steps: int = 1000
    lr: float = 3e-4
    lr_fan_in: float = LR_FAN_IN  # Linear weights train at lr * min(1, lr_fan_in / fan-in)
    weight_decay: float = 1e-2
    gamma: float = 3e-5  # predicted-parameter norm penalty
    # weight of the low-rank decoder's spread (Decoded.spread): a penalty on predicted blocks that
    # put their energy in one direction (docs/experiments.md, "The curriculum with the spread penalty")
    spread: float = 0.0
    # weight of the MLP's share of the role-factor decoder's factors (Decoded.correction): a penalty
    # that leaves the role factors what the roles share (LowRankDecoder.factors); needs role_factors
    correction: float = 0.0
    # score each prediction also by its loss after this many AdamW steps of fine-tuning from it
    # (look_ahead_loss: first-order, as first-order MAML); 0: by its loss as predicted alone
    look_ahead: int = 0
    look_ahead_lr: float = LOOK_AHEAD_LR  # those steps' learning rate (eval-ghn's by default)
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
        check_counts(self, ("depth_buckets", "look_ahead"), TrainError, least=0)
        check_number("look_ahead_lr", self.look_ahead_lr, TrainError, positive=True)
        if self.look_ahead_lr != LOOK_AHEAD_LR and not self.look_ahead:  # recorded, yet it would change nothing
            raise TrainError("--look-ahead-lr needs --look-ahead (the steps it is the rate of); add --look-ahead N")
        check_number("lr", self.lr, TrainError, positive=True)
        check_number("clip", self.clip, TrainError, positive=True)
        check_number("lr_fan_in", self.lr_fan_in, TrainError, positive=True)
        check_number("table_gain", self.table_gain, TrainError, positive=True)
        if self.table_gain != 1.0 and not self.init_anchors:  # it would change nothing: say so, not train
            raise TrainError("--table-gain needs --init-anchors (it decodes with them); leave out --no-init-anchors")
        for name in ("weight_decay", "gamma", "spread", "correction"):
            check_number(name, getattr(self, name), TrainError, positive=False)
        check_seed(self.seed, TrainError)
        check_device(self.device, TrainError)
        if self.variant not in LOGAH_VARIANTS:
            raise TrainError(f"unknown LoGAH variant {self.variant!r}; known: {', '.join(LOGAH_VARIANTS)}")
        if self.decoder not in DECODERS:
            raise TrainError(f"unknown decoder {self.decoder!r}; accepted: {', '.join(DECODERS)}")
        check_flag("role_maps", self.role_maps, TrainError)
        check_flag("tie_feature", self.tie_feature, TrainError)
        check_flag("init_anchors", self.init_anchors, TrainError)
        check_flag("level_head", self.level_head, TrainError)
        if self.level_head and self.decoder != "low_rank":
            raise TrainError(f"--level-head needs the low_rank decoder, not {self.decoder!r}")
        check_flag("role_factors", self.role_factors, TrainError)
        if self.role_factors and (self.decoder != "low_rank" or not self.role_maps):
            raise TrainError("--role-factors needs the low_rank decoder and --role-maps")
        check_flag("role_means_start", self.role_means_start, TrainError)
        if self.role_means_start and not self.role_factors:
            raise TrainError("--role-means-start needs --role-factors (it sets the role factors)")
        if self.role_means_start and self.initial_checkpoint is not None:  # which start would it be?
            raise TrainError(
                "--role-means-start starts a fresh LoGAH; --initial-checkpoint starts from its checkpoint: give one"
            )
        check_flag("role_vectors", self.role_vectors, TrainError)
        if self.role_vectors and (self.decoder != "low_rank" or not self.role_maps):
            raise TrainError("--role-vectors needs the low_rank decoder and --role-maps")
        if self.correction and not self.role_factors:  # it would weigh a constant 1
            raise TrainError("--correction needs --role-factors (it weighs the MLP's share beside them)")
        check_flag("keep_init", self.keep_init, TrainError)
        check_flag("mix_families", self.mix_families, TrainError)
        check_flag("deterministic", self.deterministic, TrainError)
        if self.zoo_families is not None and (
            not isinstance(self.zoo_families, list)
            or not self.zoo_families
            or not all(isinstance(name, str) and name.strip() == name and name for name in self.zoo_families)
        ):
            raise TrainError(
                f"zoo-families must be one or more family names, comma-separated; got {self.zoo_families!r}"
            )
        if self.role_maps and self.decoder != "low_rank":
            raise TrainError(f"--role-maps needs the low_rank decoder, not {self.decoder!r}")
        self._check_roles()

    def _check_roles(self) -> None:
        """The role-map options: each a known value, and none but its default without --role-maps
        (it would be recorded, yet change nothing)."""
        if self.role_key not in ROLE_KEYS:
            raise TrainError(f"role-key must be one of {', '.join(ROLE_KEYS)}; got {self.role_key!r}")
        if self.max_roles is not None and not is_count(self.max_roles):
            raise TrainError(
                f"max-roles must be an integer >= 1 (left out: every role gets a map); got {self.max_roles!r}"
            )
        k = LOGAH_VARIANTS[self.variant].max_mask
        if not is_count(self.role_rows, 1, k):
            raise TrainError(f"role-rows must be an integer from 1 to {k} (the decoder's K); got {self.role_rows!r}")
        defaults = {"role_key": LoGAHConfig.role_key, "max_roles": None, "role_rows": LoGAHConfig.role_rows}
        given = next((name for name, value in defaults.items() if getattr(self, name) != value), None)
        if given is not None and not self.role_maps:
            raise TrainError(
                f"--{given.replace('_', '-')} needs --role-maps (it shapes the role maps); "
                "add --role-maps or leave it out"
            )


def parameter_groups(ghn: LoGAH, lr: float, fan_in: float = LR_FAN_IN) -> list[dict[str, Any]]:
    """AdamW parameter groups: every ``nn.Linear`` weight at ``lr * min(1, fan_in / its fan-in)``,
    the decoder's role maps as its low-rank map (they are rows of it), the decoder's gain head
    at ``GAIN_LR * lr``, everything else (embeddings, norms, biases, a level head's role levels) at ``lr``.

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
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor | None,
    torch.Tensor,
]:
    """One training step's forward: the loss (mean cross-entropy, plus the mean loss after the
    look-ahead's fine-tuning with ``config.look_ahead``, plus ``gamma`` times the mean parameter
    norm plus ``spread`` times the decoder's spread plus ``correction`` times its MLP's share of the
    factors), its parts (cross-entropy, metric, norm, spread, correction, the look-ahead's loss or
    None) and the node embeddings. ``model`` is the LoGAH, or its
    DDP wrapper; ``graphs`` are the encodings of ``indices``."""
    with torch.autocast(pool.device.type, dtype=torch.bfloat16, enabled=amp):
        predicted, norms, nodes, spread, correction = model(graphs, details=True)
    # graphkit's families run in bf16 throughout; a library's models (a zoo's), as the library
    # wrote them, keep float32 buffers (batch norm's running statistics) and float32 arithmetic of
    # their own (rotary tables, state-space scans), which a bf16 parameter meets in one op and fails
    in_bf16 = amp and get_family(pool.family).bf16
    ce, metric, ahead = run_models(
        pool, indices, predicted, source, config, generator, torch.bfloat16 if in_bf16 else None
    )
    penalty = norms.mean()
    loss = ce + config.gamma * penalty + config.spread * spread + config.correction * correction
    if ahead is not None:
        loss = loss + ahead
    return loss, ce, metric, penalty, spread, correction, ahead, nodes


def run_models(
    pool: ArchPool,
    indices: Sequence[int],
    predicted: Sequence[dict[str, torch.Tensor]],
    source,
    config: TrainConfig,
    generator: torch.Generator,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Mean loss and mean metric (accuracy) of the models ``indices`` with ``predicted``
    parameters, each on its own data batch, and with ``config.look_ahead`` the mean loss after
    that many AdamW steps of fine-tuning from them (:func:`look_ahead_loss`; else None); with
    ``dtype``, the models run in it throughout (parameters and images; the loss in float32), else
    in float32 (parameters decoded in bf16 under autocast are cast up). The look-ahead fine-tunes
    in float32, as ``eval-ghn`` does.

    Why a dtype and not autocast for the target models: the hypernetwork decodes in bf16 under
    autocast, and autocast would cast every LayerNorm's input, weight and bias to float32 and
    back, and each Linear's input to bf16, in the forward and again in the backward: about 1,000
    of a meta-batch-8 step's kernel launches. bf16 norms accumulate in float32 and round their
    output, as the next Linear's cast did, so little else changes."""

    losses, metrics, ahead = [], [], []
    for index, params in zip(indices, predicted):
        model = pool.model(index).train()
        record = pool.records[index].config
        inputs, labels = source.batch(record, config.batch_size, generator)
        inputs = inputs.to(pool.device)
        params = {name: value.to(dtype or torch.float32) for name, value in params.items()}  # no copy if in it
        if config.keep_init:
            params = onto_init(params, pool.initialised(index))
        if dtype is not None:
            inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
        output = functional_call(model, params, (inputs,))
        loss, metric = output_loss(source.task, output, labels.to(pool.device))
        losses.append(loss)
        metrics.append(metric)
        if config.look_ahead:
            batch = lambda: tuple(t.to(pool.device) for t in source.batch(record, config.batch_size, generator))  # noqa: E731
            start = {name: value.float() for name, value in params.items()}
            ahead.append(look_ahead_loss(model, start, batch, source.task, config.look_ahead, config.look_ahead_lr))
    mean_ahead = torch.stack(ahead).mean() if ahead else None
    return torch.stack(losses).mean(), torch.stack(metrics).float().mean(), mean_ahead


def look_ahead_loss(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    task: str,
    steps: int,
    lr: float,
    weight_decay: float = 0.01,
) -> torch.Tensor:
    """The loss of ``model`` after ``steps`` AdamW steps (``lr``, ``weight_decay``: up_train's
    fine-tuning, which eval-ghn measures) from ``params``, each step and the final loss on a new
    ``batch()``, as a tensor whose gradient with respect to ``params`` is the gradient at the end
    point: first-order MAML's approximation, which treats the steps' Jacobian as the identity.

    Why: a prediction scored by its loss alone can sit where fine-tuning is slower than from the
    model's own init (docs/experiments.md, "Where the 2 x 2 head start goes"); scored by where
    fine-tuning takes it, the hypernetwork is meant to move towards starts that train. First order,
    because the exact gradient would backpropagate through every step (memory and time times
    ``steps``). It ignores how the steps depend on where they begin: on the 2 x 2 ViTs, 20 steps
    scored so moved nothing in 150 hypernetwork steps (docs/experiments.md, "A look-ahead
    objective"); horizons past where the starts separate, or the exact gradient, are untried."""
    fast = {name: value.detach().clone().requires_grad_(True) for name, value in params.items()}
    optimizer = torch.optim.AdamW(fast.values(), lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        inputs, labels = batch()
        loss, _ = output_loss(task, functional_call(model, fast, (inputs,)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    inputs, labels = batch()
    loss, _ = output_loss(task, functional_call(model, fast, (inputs,)), labels)
    grads = torch.autograd.grad(loss, list(fast.values()), allow_unused=True)
    # sum(p * g) has the value of a constant and the gradient g with respect to each p
    surrogate = torch.stack([(value * grad).sum() for value, grad in zip(params.values(), grads) if grad is not None])
    surrogate = surrogate.sum()
    return loss.detach() + surrogate - surrogate.detach()


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

    set_here = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if set_here:  # a user's own setting stays
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def machine(device: torch.device, world: int = 1) -> str:
    """Where a run trains, for config.json: "2 CPU cores", "1 x NVIDIA H100 80GB HBM3"."""
    if device.type == "cuda":
        return f"{world} x {torch.cuda.get_device_name(device)}"
    return f"{len(os.sched_getaffinity(0))} CPU cores" + (f", {world} processes" if world > 1 else "")


def start_from(initial: LoGAH, ghn: LoGAH, path: str) -> None:
    """Copy the weights of ``initial`` (the checkpoint ``path`` holds) into the fresh ``ghn``;
    TrainError naming the first setting in which their configs differ (the variant, the roles a
    pool's role maps are for, ...): its weights would not fit, or would fit the wrong roles. A run
    with a level head, role factors or role vectors may start from a checkpoint without them: they start at zero,
    so the start decodes as the checkpoint does. So may a run whose op vocabulary is newer than the
    checkpoint's (the bundled ones read 32 op ids, a fresh run 51): op ids never change meaning, so
    the checkpoint's embedding rows are copied and the ids it never read keep their fresh rows. Role
    prototypes are not copied: the run fits its own when it ends, and until then its checkpoints have none."""
    # init_anchors follows the dataset: a stage on another one may decode 1-D parameters otherwise
    adds_level = ghn.config.level_head and not initial.config.level_head
    adds_factors = ghn.config.role_factors and not initial.config.role_factors
    adds_vectors = ghn.config.role_vectors and not initial.config.role_vectors
    adds_ops = initial.config.num_ops < ghn.config.num_ops
    comparable = replace(
        initial.config,
        init_anchors=ghn.config.init_anchors,
        # fitted when a run ends, never carried over (a start without role maps fails on its roles below)
        role_prototypes=ghn.config.role_prototypes and bool(initial.config.roles),
        level_head=initial.config.level_head or adds_level,
        role_factors=initial.config.role_factors or adds_factors,
        role_vectors=initial.config.role_vectors or adds_vectors,
        num_ops=ghn.config.num_ops if adds_ops else initial.config.num_ops,
    )
    if comparable != ghn.config:
        field = next(f for f in asdict(ghn.config) if getattr(comparable, f) != getattr(ghn.config, f))
        raise TrainError(
            f"--initial-checkpoint {path}: holds a LoGAH whose {field} is {getattr(comparable, field)!r}, "
            f"not this run's {getattr(ghn.config, field)!r}; train with its options (--variant, --role-maps, "
            "--role-key, ...) or start fresh"
        )
    # the configs agree but for the head, the factors, the vectors and the prototypes: their tensors are
    # all a fresh run may miss; prototypes are this run's own, fitted when it ends, never the start's
    state = ghn.with_own_prototypes(initial.state_dict())
    if adds_ops:
        known = state["encoder.op_embed.weight"]
        fresh = ghn.encoder.op_embed.weight.detach()[known.shape[0] :]
        state["encoder.op_embed.weight"] = torch.cat([known, fresh.to(known.device, known.dtype)])
    ghn.load_state_dict(state, strict=not (adds_level or adds_factors or adds_vectors))


def stages(earlier: Mapping[str, Any] | None, dataset: str, data: str, steps: int) -> list[dict[str, Any]]:
    """What a checkpoint was trained on, stage by stage: the stages of ``earlier`` (the info of the
    checkpoint a run started from; a checkpoint recorded before stages were counts as one stage),
    then this run's ``steps`` on ``dataset`` with ``data``. A checkpoint trained further on a new
    dataset is described by its whole history, not only by its last run's steps. A stage of no
    steps is a start written, not trained (``experiments/factor_start.py``'s), and is left out."""
    history: list[dict[str, Any]] = []
    if earlier is not None:
        history = list(earlier.get("stages") or [])
        if not history:
            history = [
                {
                    "dataset": Path(str(earlier.get("dataset", "?"))).name,
                    "data": earlier.get("data"),
                    "steps": earlier.get("steps"),
                }
            ]
    trained = [stage for stage in history if stage.get("steps") != 0]
    return [*trained, {"dataset": Path(dataset).name, "data": data, "steps": steps}]


def resume_from(folder: Path, ghn: LoGAH, optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, Any]]:
    """Load the checkpoint in ``folder`` into ``ghn`` and ``optimizer``; returns the steps it had
    done and its info."""
    saved = load_checkpoint(folder)
    # a run begun before train-ghn fitted role prototypes resumes into one that fits them when it ends
    prototypes = ghn.config.role_prototypes and bool(saved.config.roles)
    if replace(saved.config, role_prototypes=prototypes) != ghn.config:
        raise TrainError(
            f"{folder}: holds a LoGAH {saved.info.get('variant')} with another config; resume with the same --variant"
        )
    ghn.load_state_dict(ghn.with_own_prototypes(saved.state_dict()))
    state = load_optimizer_state(folder, optimizer)
    return int(state["step"]), dict(saved.info)


def train(config: TrainConfig, resume: bool = False, progress: bool = True) -> dict[str, float]:
    """Train (or, with ``resume``, continue training) a LoGAH as ``config`` says; writes
    ``config.out/checkpoint`` every ``checkpoint_every`` steps and the final hypernetwork to
    ``config.out``; returns the last logged metrics. The run folder, the dataset, the data and
    (with ``resume``) the recorded options are checked before the first step and the first write
    (see :func:`run_folder`, :func:`check_resume`)."""

    rank, world, device = _distributed(config.device)
    out = run_folder(config.out, resume, RUN_FILES, "hypernetwork", config.dataset)
    initial: LoGAH | None = None
    if config.initial_checkpoint is not None and not resume:  # a resume continues its own checkpoint
        try:
            initial = load_checkpoint(config.initial_checkpoint)
        except CheckpointError as e:
            raise TrainError(f"--initial-checkpoint {e}") from None
    pool = ArchPool(config.dataset, config.split, device)
    roles = pool.roles(config.role_key, config.max_roles) if config.role_maps else ()  # the whole split's
    if config.zoo_families is not None:
        pool.keep_zoo_families(config.zoo_families)
    # --mix-families: the pool's indices by family, once; a pool without families fails here, before any write
    families = list(pool.zoo_families("--mix-families").values()) if config.mix_families else None
    data = config.data or default_source(pool.family)
    if resume:  # a zoo's pool (timm, transformers) has no default source: its run recorded --data
        options = {**asdict(config), "data": data}
        check_resume(out / "checkpoint", options, DEFAULT_SOURCES.get(pool.family), RESUMED_OPTIONS, world, UNRECORDED)
    source = load_source(data, seq_len=config.seq_len)
    source.check(pool.records[0].config)  # fail before the first step, not inside it
    torch.manual_seed(config.seed)  # the same seed, the same hypernetwork: runs (and resumes) repeat exactly
    ghn = LoGAH.from_variant(
        config.variant,
        config.decoder,
        depth_buckets=config.depth_buckets,
        tie_feature=config.tie_feature,
        roles=roles,
        role_rows=config.role_rows,
        role_key=config.role_key,
        init_anchors=config.init_anchors,
        table_gain=config.table_gain,
        level_head=config.level_head,
        role_factors=config.role_factors,
        role_vectors=config.role_vectors,
        # a role the split lacks never trained the shared map: it takes the nearest trained role instead
        role_prototypes=config.role_maps and config.max_roles is None,
    ).to(device)
    if initial is not None and config.initial_checkpoint is not None:
        start_from(initial, ghn, config.initial_checkpoint)
    if config.role_means_start and not resume:  # a resume loads the start its checkpoint holds
        ghn.start_at_role_means(pool.split_encoded(ghn.config))  # the whole split's, as the role maps
    optimizer = make_optimizer(ghn, config)
    start, saved = resume_from(out / "checkpoint", ghn, optimizer) if resume else (0, {})
    cosine = lambda s: 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine, last_epoch=start - 1
    )  # resumed: the lr of ``start``
    model = nn.parallel.DistributedDataParallel(ghn) if world > 1 else ghn
    amp = device.type == "cuda" if config.amp is None else config.amp
    tasks = {input_task(r.graph) for r in pool.records} - {None}
    # a start from a checkpoint extends that one's history; a resume, the history its start recorded
    history = stages(initial.info if initial is not None else None, str(config.dataset), data, config.steps)
    if "stages" in saved:
        history = [*saved["stages"][:-1], history[-1]]
    info = {  # what bundled_for chooses by: task, trained_ops, space (and family)
        "variant": config.variant,
        "family": pool.family,
        "task": tasks.pop() if len(tasks) == 1 else None,
        "trained_ops": pool.ops(),
        "trained_on": list(dict.fromkeys(str(stage["dataset"]) for stage in history)),
        "stages": history,
        "data": data,
        "train": asdict(config),
        "dataset": str(config.dataset),
        "space": training_space(r.graph for r in pool.records),
        "machine": machine(device, world),
    }
    metrics_file = out / "metrics.jsonl"
    if resume and rank == 0:
        trim_metrics(metrics_file, start)
    last: dict[str, Any] = {}
    columns = (
        TextColumn("train-ghn"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
    )
    # rank 0 writes the run folder; a fresh run stopped before its first checkpoint leaves none
    folder = nothing_left_unless_checkpointed(out, RUN_FILES, resume) if rank == 0 else contextlib.nullcontext()
    bar_shown = progress and rank == 0
    with folder, repeatable(config.deterministic), Progress(*columns, disable=not bar_shown) as bar:
        task = bar.add_task("train", total=config.steps, completed=start, loss="-")
        tic, diagnostics = time.perf_counter(), Stopwatch()  # archs_per_s leaves out what only the log needs
        skipped = in_a_row = 0  # steps skipped for a non-finite loss or gradient norm: since start, and in a row
        for step in range(start, config.steps):
            seed = step_seed(config.seed, step, rank)
            torch.manual_seed(seed)  # dropout in the target models draws from here: a resumed step repeats too
            generator = torch.Generator().manual_seed(seed)
            indices = pool.draw(config.meta_batch, generator, families)
            graphs = [pool.encoded(i, ghn.config) for i in indices]
            loss, ce, metric, penalty, spread, correction, ahead, nodes = meta_batch_loss(
                model, graphs, pool, indices, source, config, generator, amp
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # on every process, even where the loss is not finite: DDP's all-reduce waits for all
            logging = (step + 1) % config.log_every == 0 or step + 1 == config.steps
            with diagnostics:
                norms = gradient_norms(ghn) if logging else {}
            grad_norm = nn.utils.clip_grad_norm_(ghn.parameters(), config.clip)
            problem = non_finite(loss, grad_norm, world)
            if problem is None:
                optimizer.step()
                in_a_row = 0
            else:  # clipping by a NaN or Inf norm would write NaN into every weight: this step changes none
                skipped, in_a_row = skipped + 1, in_a_row + 1
                if in_a_row == SKIPPED_IN_A_ROW:  # before the first checkpoint, the run leaves nothing to resume
                    again = f"resume from {out / 'checkpoint'}" if (out / "checkpoint").exists() else "rerun"
                    first = step + 1 - in_a_row
                    raise TrainError(f"steps {first}-{step}: {problem} at each; {again} with a lower --lr")
                if rank == 0:
                    bar.console.print(f"warning: step {step}: {problem}; skipped, the weights unchanged", markup=False)
            with warnings.catch_warnings():  # a skipped first step: torch warns that the optimizer has not stepped
                warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
                schedule.step()  # a skipped step still counts: a resumed run's schedule stays where this one's is
            done = step + 1
            if logging:
                logged = (loss, ce, metric, penalty, spread, correction) + (() if ahead is None else (ahead,))
                values = torch.stack([t.detach().float() for t in logged])
                if world > 1:
                    dist.all_reduce(values)
                    values /= world
                with diagnostics:
                    health = {
                        **factor_similarity(ghn, nodes, graphs),
                        **decoded_feature_constancy(
                            ghn, nodes, graphs[0], pool, indices[0], source, config.batch_size, seed
                        ),
                    }
                elapsed = time.perf_counter() - tic - diagnostics.seconds
                last = {
                    "step": done,
                    "loss": values[0].item(),
                    "ce": values[1].item(),
                    "metric": values[2].item(),
                    "norm": values[3].item(),
                    "spread": values[4].item(),
                    "correction": values[5].item(),
                    **({} if ahead is None else {"look_ahead": values[6].item()}),
                    "lr": optimizer.param_groups[-1]["lr"],
                    "grad_norm": grad_norm.item(),
                    "archs_per_s": config.meta_batch * world * (done - start) / elapsed,
                    "world_size": world,
                    "skipped_steps": skipped,
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
        if ghn.config.role_prototypes:  # the trained encoder's, over the whole split the role maps are for
            ghn.fit_role_prototypes(pool.split_encoded(ghn.config))
        save_checkpoint(out, ghn, {**info, "steps": config.steps, "metrics": last})
        if metrics_file.exists():
            plot_metrics(metrics_file, out / "metrics.png")
    if world > 1:
        dist.destroy_process_group()
    return last


def non_finite(loss: torch.Tensor, grad_norm: torch.Tensor, world: int = 1) -> str | None:
    """Why a step must not update the weights: ``"the loss is nan"`` (this process's loss, or
    another process's under DDP, which all of them then skip together) or ``"the gradient norm is
    inf"``; None when both are finite. One rare non-finite meta-batch (an architecture whose
    predicted weights overflow at one step) is skipped; :data:`SKIPPED_IN_A_ROW` stop training."""
    bad = torch.stack([~torch.isfinite(loss.detach()), ~torch.isfinite(grad_norm)]).float()
    if world > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad[0]:
        return f"the loss is {loss.item()}" if not torch.isfinite(loss) else "the loss is not finite on another process"
    if bad[1]:
        return f"the gradient norm is {grad_norm.item()}"
    return None


def _distributed(device: str | None) -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group torchrun describes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    chosen = torch.device(device or default_device(TrainError, local))
    if world > 1 and not dist.is_initialized():
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        dist.init_process_group("nccl" if chosen.type == "cuda" else "gloo")
    return (dist.get_rank() if world > 1 else 0), world, chosen

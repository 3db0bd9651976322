"""Stream calibration: give a predicted model the residual stream its family's init would have.

A hypernetwork predicts the blocks of a deep model from nearly the same node embeddings, so the
branches of every block write nearly the same direction into the residual stream. Added up, the
stream grows linearly with depth instead of as the square root: at ViT-L's shape the last block's
stream was 9x the init's and at GPT-2-Medium's 37x, and a stream that large drowns the tokens'
own signal. Scaling every branch by one factor (GPT-2's 1 / sqrt(2 n_layer)) cannot
fix a growth whose rate depends on how aligned the branches are.

The rule, one forward pass on a small calibration batch (LSUV's idea, Mishkin & Matas 2016, with
the family's init as the target instead of unit variance):

1. The family's init model (built from the graph's config, on a fixed seed, so that the result
   does not depend on the caller's random state) runs the batch; after every residual branch
   the stream's RMS is recorded, and so is the logits' standard deviation.
2. The predicted model runs the same batch. At each branch, in order, with the stream ``s``
   before it and the branch's output ``o``, the branch gets the largest factor ``a`` in [0, 1]
   with ``RMS(s + a o)`` at most the init's RMS there (when even ``a = 0`` leaves it above, the
   ``a`` that brings it lowest). The factor is applied in flight, so every later branch sees
   the calibrated stream, exactly as the rescaled weights will compute it.
3. The factors go into the weights (and biases) that write each branch; factors only shrink, so
   a prediction whose stream is already at or below the init's is left as it is.
4. The output layer is scaled the same way to the init's logit spread when it shares no
   weights with the input embedding (scaling a tied one would scale the stream's input too).

Blocks at different depths thus get different factors: those the branches need to add up the
way the init's do. The measurement is in BENCHMARKS.md (``benchmarks/ghn_extrapolation.py``).

Logit balancing (:func:`balance_logits`) is the other calibration here: a classifier's
output-layer bias shifted so that its mean predicted probability over a few unlabeled examples of
the task is the same for every class, which removes the one confident guess a prediction gives
every image on an architecture its hypernetwork covers little.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from graphkit.errors import CalibrationError, GraphkitError
from graphkit.families import ConfigError, build_model, config_from_graph, get_family
from graphkit.graph import ArchGraph
from graphkit.params import tied_names
from graphkit.training.data import DataSource, accepted_sources

#: calibration batch: images or sequences, and tokens per sequence
BATCH, TOKENS = 4, 64


@dataclass
class Calibration:
    """What :func:`calibrate` did: the factor of every residual writer (its module path) and of
    the output layer, and the stream and logits before and after, against the init's."""

    factors: dict[str, float] = field(default_factory=dict)
    head: str | None = None
    head_factor: float = 1.0
    stream: dict[str, float] = field(default_factory=dict)  # last block's stream RMS: before, after, init
    logit_std: dict[str, float] = field(default_factory=dict)  # before, after, init


def residual_writers(graph: ArchGraph) -> list[str]:
    """The weights that write a residual branch into the stream: those of every linear node whose
    output feeds an ``add`` (GPT-2's ``attn.c_proj`` and ``mlp.c_proj``, timm's ``attn.proj`` and
    ``mlp.fc2``, LLaMA's ``o_proj`` and ``down_proj``), in graph order."""
    feeds_add = {src for src, dst in graph.edges if graph.nodes[dst].op == "add"}
    return [
        name
        for i, node in enumerate(graph.nodes)
        if i in feeds_add and node.op == "linear"
        for name, shape in node.params.items()
        if len(shape) >= 2
    ]


def writers_by_block(graph: ArchGraph, blocks: str, depth: int) -> list[list[str]]:
    """The module paths of the residual writers (:func:`residual_writers`)
    of each of the ``depth`` blocks under ``blocks``, in graph order; CalibrationError unless
    every block has its attention and its MLP writer and nothing writes outside the blocks."""
    found: list[list[str]] = [[] for _ in range(depth)]
    for name in residual_writers(graph):
        module = name.rpartition(".")[0]
        index = module[len(blocks) + 1 :].partition(".")[0] if module.startswith(blocks + ".") else ""
        if not index.isdigit() or int(index) >= depth:
            raise CalibrationError(f"residual branch {module!r} lies outside the blocks {blocks!r}")
        if module not in found[int(index)]:
            found[int(index)].append(module)
    bad = next((i for i, modules in enumerate(found) if len(modules) != 2), None)
    if bad is not None:
        raise CalibrationError(
            f"block {blocks}.{bad} has {len(found[bad])} residual branches; calibration reads "
            "pre-norm blocks of two (attention, then MLP)"
        )
    return found


def calibration_inputs(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """A fixed batch the rule runs: normal images at the config's size, or uniform random token
    ids (``TOKENS`` long, fewer when the context is shorter)."""
    generator = torch.Generator().manual_seed(seed)
    if "image_size" in config:
        size = config["image_size"]
        return {"x": torch.randn(BATCH, config.get("in_chans", 3), size, size, generator=generator)}
    length = min(TOKENS, config.get("context") or TOKENS)
    return {"input_ids": torch.randint(0, config["vocab_size"], (BATCH, length), generator=generator)}


def _rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()


def _logits(out: Any) -> torch.Tensor:
    return (out.logits if hasattr(out, "logits") else out).float()


@contextlib.contextmanager
def _hooks(model: nn.Module, blocks: list[nn.Module], writers: list[list[str]], on_branch) -> Iterator[None]:
    """Call ``on_branch(block, branch, stream, output)`` at every residual writer's output, with
    the stream before that branch (the block's input plus what earlier branches of the block
    wrote, as they wrote it); the writer's output becomes what ``on_branch`` returns."""
    state: dict[str, torch.Tensor] = {}
    handles = []

    def enter(module, args, kwargs):
        state["stream"] = (args[0] if args else kwargs["hidden_states"]).detach().float()

    def leave(index: int, branch: int):
        def hook(module, args, output):
            new = on_branch(index, branch, state["stream"], output.detach().float())
            state["stream"] = state["stream"] + new
            return new.to(output.dtype)

        return hook

    try:
        for index, (block, paths) in enumerate(zip(blocks, writers)):
            handles.append(block.register_forward_pre_hook(enter, with_kwargs=True))
            for branch, path in enumerate(paths):
                handles.append(model.get_submodule(path).register_forward_hook(leave(index, branch)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _run(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
    device = next(model.parameters()).device
    with torch.no_grad():
        if "x" in inputs:
            return model(inputs["x"].to(device))
        return model(**{k: v.to(device) for k, v in inputs.items()})


def factor(stream: torch.Tensor, branch: torch.Tensor, target: float) -> float:
    """The largest ``a`` in [0, 1] with ``RMS(stream + a branch) <= target``, or, when none
    reaches it, the ``a`` in [0, 1] that brings the RMS lowest."""
    n = stream.numel()
    a2, b, c = (
        branch.double().pow(2).sum().item(),
        2 * (stream.double() * branch.double()).sum().item(),
        stream.double().pow(2).sum().item() - target**2 * n,
    )
    if a2 == 0 or a2 + b + c <= 0:  # the whole branch keeps the stream within the target
        return 1.0
    if c <= 0:  # the root in (0, 1] of the convex a2 x^2 + b x + c, which is <= 0 at 0 and > 0 at 1
        return (-b + math.sqrt(max(b * b - 4 * a2 * c, 0.0))) / (2 * a2)
    return min(max(-b / (2 * a2), 0.0), 1.0)


def output_layer(graph: ArchGraph) -> str | None:
    """The module path of ``graph``'s output layer: the last ``head`` node holding parameters;
    None when it has none."""
    last = next((n for n in reversed(graph.nodes) if n.op == "head" and n.params), None)
    return None if last is None else next(iter(last.params)).rpartition(".")[0]


def check_calibration(graph: ArchGraph) -> tuple[dict[str, Any], list[list[str]]]:
    """The config of ``graph``'s model and its writers by block (:func:`writers_by_block`) when
    :func:`calibrate` can read it; else a CalibrationError saying why (checked before any weight
    is written)."""

    try:
        config = config_from_graph(graph)
    except ConfigError as e:
        raise CalibrationError(f"stream calibration reads the blocks of graphkit's families only: {e}") from e
    return config, writers_by_block(graph, get_family(config["family"]).blocks, config["num_layers"])


@torch.no_grad()
def calibrate(
    model: nn.Module,
    graph: ArchGraph,
    reference: nn.Module | None = None,
    inputs: dict[str, torch.Tensor] | None = None,
) -> Calibration:
    """Rescale, in place, the weights that write each residual branch of ``model`` (holding
    predicted parameters) and its output layer so that its stream and logits on a calibration
    batch are no larger than those of its family's init (see the module docstring). ``reference``
    is that init model (default: built from ``graph``'s config on a fixed seed); ``inputs`` the
    batch (default: :func:`calibration_inputs`). Returns the factors applied. CalibrationError
    for a model of no graphkit family or with blocks the rule cannot read; the model is then
    left unchanged."""

    config, writers = check_calibration(graph)
    blocks_path = get_family(config["family"]).blocks
    inputs = inputs if inputs is not None else calibration_inputs(config)
    if reference is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            reference = build_model(config, "cpu")
    _fill_meta_buffers(model, reference)
    training = model.training
    model.eval()
    targets: list[list[float]] = [[0.0, 0.0] for _ in writers]

    def record(index: int, branch: int, stream: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        targets[index][branch] = _rms(stream + output)
        return output

    with _hooks(reference, list(cast(nn.ModuleList, reference.get_submodule(blocks_path))), writers, record):
        init_logits = _logits(_run(reference.eval(), inputs))
    result = Calibration()

    def shrink(index: int, branch: int, stream: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        a = factor(stream, output, targets[index][branch])
        result.factors[writers[index][branch]] = a
        return output * a

    block_list = list(cast(nn.ModuleList, model.get_submodule(blocks_path)))
    before_stream, before_logits = _measure(model, block_list, inputs)
    with _hooks(model, block_list, writers, shrink):
        logits = _logits(_run(model, inputs))
    for path, a in result.factors.items():
        for param in model.get_submodule(path).parameters(recurse=False):
            param.mul_(a)
    result.head = output_layer(graph)
    head_params = dict(model.get_submodule(result.head).named_parameters(recurse=False)) if result.head else {}
    tied = {alias.rpartition(".")[0] for aliases in tied_names(model).values() if len(aliases) > 1 for alias in aliases}
    if head_params and result.head not in tied:
        result.head_factor = min(1.0, init_logits.std().item() / max(logits.std().item(), 1e-12))
        for param in head_params.values():
            param.mul_(result.head_factor)
    after_stream, after_logits = _measure(model, block_list, inputs)
    model.train(training)
    result.stream = {"before": before_stream, "after": after_stream, "init": targets[-1][1]}
    result.logit_std = {"before": before_logits, "after": after_logits, "init": init_logits.std().item()}
    return result


def _fill_meta_buffers(model: nn.Module, reference: nn.Module) -> None:
    """Give a model predicted on the meta device the buffers it still lacks (LLaMA's rotary
    frequencies: computed at build time, not predicted), from its init, which computed them."""
    device = next(model.parameters()).device
    computed = dict(reference.named_buffers())
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:
            if name not in computed:
                raise CalibrationError(
                    f"buffer {name!r} of the meta model has no value to run the calibration batch with"
                )
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, computed[name].to(device))


def _measure(model: nn.Module, blocks: list[nn.Module], inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The last block's output RMS and the logits' standard deviation on ``inputs``."""
    seen = []
    handle = blocks[-1].register_forward_hook(lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out))
    try:
        logits = _logits(_run(model, inputs))
    finally:
        handle.remove()
    return _rms(seen[0].float()), logits.std().item()


__all__ = [
    "Calibration",
    "CalibrationError",
    "balance_logits",
    "balanced_head",
    "calibrate",
    "calibration_inputs",
    "check_balancing_data",
    "check_calibration",
    "factor",
    "output_layer",
    "residual_writers",
    "writers_by_block",
]


#: :func:`balance_logits` stops once every class's mean probability is within BALANCE_TOLERANCE
#: (relative) of the others': each of at most BALANCE_STEPS passes of the model solves for the
#: bias's shift in at most BALANCE_SOLVE_STEPS adjustments of that pass's logits
BALANCE_SOLVE_STEPS, BALANCE_STEPS, BALANCE_TOLERANCE = 100, 10, 1e-3


def check_balancing_data(source: DataSource, option: str, error: type[GraphkitError]) -> None:
    """Raise ``error`` naming ``option`` (the flag or parameter that asked for balancing) unless
    ``source`` holds images: a language model's logits carry the tokens' prior, which balancing
    its classes would erase."""
    if source.task != "image":
        raise error(
            f"{option} balances an image classifier's classes; {source.spec} is {source.task} data, whose tokens "
            f"have a prior of their own; accepted: {accepted_sources('image')}"
        )


def balanced_head(model: nn.Module, graph: ArchGraph) -> str:
    """The module path of ``model``'s output layer (``graph``'s, :func:`output_layer`) when
    :func:`balance_logits` can shift it: it has a bias. Else CalibrationError saying why, which
    callers raise before any long work (``model`` may be on the meta device)."""
    path = output_layer(graph)
    if path is None:
        raise CalibrationError("balancing the logits needs an output layer with parameters; the graph has none")
    if not isinstance(getattr(model.get_submodule(path), "bias", None), torch.Tensor):
        raise CalibrationError(f"{path}: the output layer has no bias to balance the logits with")
    return path


def _class_logits(model: nn.Module, inputs: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``model``'s logits for ``inputs``, one row per example."""
    return _logits(model(inputs.to(device))).flatten(0, -2)


def _prior_spread(logits: torch.Tensor) -> torch.Tensor:
    """The log of the mean predicted probability per class over ``logits``' rows, less its mean
    over the classes: zero where every class is predicted equally often on average."""
    log_prior = torch.logsumexp(logits.log_softmax(-1), 0) - math.log(logits.shape[0])
    return log_prior - log_prior.mean()


def _balancing_shift(logits: torch.Tensor) -> torch.Tensor:
    """The shift that, subtracted from every row of ``logits``, leaves each class's mean predicted
    probability within BALANCE_TOLERANCE of the others' (at most BALANCE_SOLVE_STEPS steps of
    Saerens et al.'s adjustment, each subtracting the log of each class's mean probability)."""
    shift = torch.zeros_like(logits[0])
    for _ in range(BALANCE_SOLVE_STEPS):
        spread = _prior_spread(logits - shift)
        if spread.abs().max() < BALANCE_TOLERANCE:
            break
        shift += spread
    return shift


@torch.no_grad()
def balance_logits(model: nn.Module, graph: ArchGraph, inputs: torch.Tensor) -> float:
    """Shift, in place, the bias of ``model``'s output layer so that its mean predicted
    probability over ``inputs`` (a batch of the task's examples, their labels unused) is the same
    for every class; returns the RMS of the shift.

    Why: on an architecture its training covered little, a hypernetwork's prediction gives every
    image nearly the same features, and its head turns them into one confident guess for all
    (docs/experiments.md, "Balancing the logits"). The guess carries nothing about the image; the
    differences between images are what the prediction knows, and one shift for all keeps them.
    It assumes only that the prediction has no business preferring a class before it sees an
    example, which is what the model's own init does too. The shift is the fixed point of
    Saerens et al.'s (2002) prior adjustment toward a uniform prior: each step subtracts the log of
    each class's mean probability. Each pass of the model solves for the shift on its logits, which
    a shift of the output layer's bias shifts by as much, and the next pass checks it; so balancing
    costs two forward passes, not one a step (a ViT-B/16 at 224 px runs for tens of seconds on a
    CPU). Where the output moved less than the bias (a head averaged with another, DeiT's
    distillation head), further passes solve again (at most :data:`BALANCE_STEPS`). For
    classifiers: a language model's logits carry a token prior that this would erase.

    CalibrationError, with the model unchanged, when the output layer has no bias
    (:func:`balanced_head`), or when its output is not the logits (a head whose outputs are
    combined further: the shift then fails to balance them)."""
    bias = cast(torch.Tensor, model.get_submodule(balanced_head(model, graph)).bias)
    original = bias.detach().clone()
    training = model.training
    model.eval()
    try:
        logits = _class_logits(model, inputs, bias.device)
        first = spread = _prior_spread(logits)
        for _ in range(BALANCE_STEPS):
            if spread.abs().max() < BALANCE_TOLERANCE:
                break
            bias.sub_(_balancing_shift(logits).to(bias.dtype))
            logits = _class_logits(model, inputs, bias.device)
            spread = _prior_spread(logits)
        if _rms(spread) > 0.5 * _rms(first) + BALANCE_TOLERANCE:
            bias.copy_(original)
            raise CalibrationError(
                f"{output_layer(graph)}: shifting the output layer's bias does not balance the model's predicted "
                "classes (its output is combined further), so its logits were left as they were"
            )
    finally:
        model.train(training)
    return _rms(bias.detach() - original)

"""``keep_init``: a prediction written on top of the model's own initialisation.

The rule: every parameter with two or more dimensions (weight matrices, convolution kernels,
embeddings, position tables) becomes ``W0 + P``, the model's own initialisation plus the
prediction (with the prediction's residual branches scaled as :func:`predict` scales them); every
1-D parameter (norm gains and biases) is ``P``, as predicted. Why: the initialisation is a
random full-rank matrix the low-rank prediction cannot hold, and what a fine-tuning from
random starts from; a sum keeps both. A norm's gain is 1 at init and near 1 predicted, so adding
them would double every norm's output; a bias is 0 at init, so adding changes nothing there.
docs/experiments.md has the measurements behind the rule and behind each family's default
(``Family.keep_init``: GPT-2, LLaMA, transformers' decoders and timm's models keep their init,
ViTs do not), read for the family the checkpoint trained on, else the model's
(:func:`start_family`).

``shrink`` scales the prediction before it is added: ``W0 + shrink * P`` (norms and biases still
``P``). Why: fine-tuning from a prediction, like any warm start, falls more slowly than from a
random init once its head start is spent (Ash & Adams, 2020, "On warm-starting neural network
training"); their remedy, shrink the warm weights and add fresh noise, is this sum with the
model's own init as the noise. On the 8 held-out LLaMAs of the bundled checkpoint's evaluation,
half the prediction on the own init beats the own init after 0, 100 and 300 fine-tuning steps
on 7, 8 and 8 of them, the prediction alone on 8, 7 and 2 (docs/experiments.md, "Where the head
start goes"): LLaMA's default (``Family.shrink``), and transformers' (the zoo-decoders
checkpoint's: 100, 88 and 76% of 17 held-out decoders of zoo-decoders-mini, the prediction alone
100, 76 and 29%), and timm's (the zoo-vision checkpoint's: on zoo-vits-mini's 8 held-out
architectures 0.60 and 0.19 after 100 and 300 steps, the own init 0.69 and 0.20, the prediction
alone 0.99 and 0.24).

A model built on the meta device has no initialisation yet: its parameters are allocated and
initialised the way its library does at construction (:func:`initialise_as_built`) before the
prediction is added, one parameter at a time, so predicting keeps its memory bound.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import torch
from torch import nn

from graphkit.errors import GraphkitError, KeepInitError
from graphkit.families import FAMILIES, Family, traced_family
from graphkit.graph import ArchGraph
from graphkit.tracing.inputs import evaluated, logits_of, normalise_inputs
from graphkit.validation import check_flag, is_number


def should_keep_init(graph: ArchGraph, choice: bool | None = None, info: Mapping | None = None) -> bool:
    """Whether ``graph``'s prediction is added onto the model's own initialisation: ``choice``
    when given (``keep_init`` of :func:`~graphkit.ghn.predict.predict`), else always for a
    hypernetwork trained that way (``train-ghn --keep-init``, recorded in its config.json,
    ``info``), else whether the start's family does so by default (``Family.keep_init``: GPT-2,
    LLaMA, transformers' decoders; :func:`start_default`)."""
    if choice is not None:
        return choice
    return trained_onto_init(info) or bool(start_default(graph, info, "keep_init", False))


#: how many times a uniform guess's loss (ln of the classes) a model's own initialisation may
#: score a uniformly drawn target at before its logits count as saturated
SATURATED = 2.0


def saturated_init(model: nn.Module, graph: ArchGraph, example_inputs: Any = None) -> tuple[float, float] | None:
    """(the loss, a uniform guess's loss) when ``model`` as it stands, a hand-written model of no
    library (``graph``'s family ``custom``) holding its own initialisation, has saturated logits:
    on its example inputs (None: guessed) it scores a uniformly drawn target at more than
    :data:`SATURATED` times ln(classes). None otherwise, and for a library's model, whose
    initialisation is its library's convention, or one on meta. Why: the prediction added onto
    such an init keeps it. A GPT whose head is tied to an ``nn.Embedding`` left at torch's
    N(0, 1) scores 37.8 nats at step 0 on 256 byte tokens; after 100 AdamW steps its own init
    reaches 5.95, the prediction added onto it 6.08, the prediction alone 3.58 (a tied LLaMA:
    4.21, 4.90, 3.14; untied, where the own init scores 5.7 and 6.9, adding stays ahead or level:
    docs/experiments.md, "Saturated own inits")."""
    if graph.meta.get("family") != "custom" or any(p.is_meta for p in model.parameters()):
        return None
    output = evaluated(model, normalise_inputs(model, example_inputs))
    logits = logits_of(output)
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2 or logits.shape[-1] < 2:
        return None
    rows = logits.detach().float().flatten(0, -2)
    loss = (rows.logsumexp(-1) - rows.mean(-1)).mean().item()  # cross-entropy averaged over every target
    uniform = math.log(rows.shape[-1])
    return (loss, uniform) if loss > SATURATED * uniform else None


def keeps_init(
    model: nn.Module, graph: ArchGraph, choice: bool | None, info: Mapping | None, example_inputs: Any = None
) -> tuple[bool, tuple[float, float] | None]:
    """:func:`should_keep_init` for ``model`` itself: a family's default to keep the init gives
    way, for the prediction alone, where the model's own logits are saturated
    (:func:`saturated_init`, which is returned beside the choice); an option or a hypernetwork
    trained onto the init (whose prediction is a correction) is followed as it is."""
    keeping = should_keep_init(graph, choice, info)
    if not keeping or choice is not None or trained_onto_init(info):
        return keeping, None
    saturated = saturated_init(model, graph, example_inputs)
    return saturated is None, saturated


def start_family(graph: ArchGraph, info: Mapping | None = None) -> Family | None:
    """The family whose start :func:`predict` writes by default (``Family.keep_init``,
    ``Family.shrink``): the family the hypernetwork trained on (``info["family"]``, its
    config.json's, where that is a registered family), else the one ``graph`` was traced from
    (:func:`graphkit.families.traced_family`); None for neither. Why the checkpoint's first: a
    start is measured for a checkpoint on the held-out models of its own pool
    (docs/experiments.md), and the models a zoo checkpoint predicts (a Qwen2-MoE, an EXAONE) are
    of no graphkit family but of its library's (``transformers``); a family's own checkpoint
    predicts its family's models, where both agree."""
    return FAMILIES.get(str((info or {}).get("family"))) or traced_family(graph)


def start_default(graph: ArchGraph, info: Mapping | None, name: str, fallback: Any) -> Any:
    """The field ``name`` (``keep_init``, ``shrink``) of :func:`start_family`, else ``fallback``."""
    family = start_family(graph, info)
    return getattr(family, name) if family is not None else fallback


def check_shrink(shrink: object, error: type[GraphkitError]) -> float:
    """``shrink`` as a factor of the prediction added onto the init: a number above 0 and at most
    1 (0 would leave the init alone, above 1 is no shrink); raises ``error`` naming the value."""
    if not is_number(shrink) or not 0 < shrink <= 1:
        raise error(f"shrink must be a number above 0 and at most 1 (W0 + shrink * prediction); got {shrink!r}")
    return float(shrink)


def keep_init_choice(
    keep_init: bool | None, shrink: float | None, error: type[GraphkitError]
) -> tuple[bool | None, float | None]:
    """``predict``'s ``keep_init`` and ``shrink`` checked together: a ``shrink`` given implies
    keeping the init (``keep_init`` None becomes True, False is refused); None stays None, for
    :func:`default_shrink` to fill once the model is traced. Raises ``error``."""
    if keep_init is not None:
        check_flag("keep_init", keep_init, error)
    if shrink is None:
        return keep_init, None
    shrink = check_shrink(shrink, error)
    if keep_init is False:
        raise error("shrink scales the prediction added onto the model's own init; it needs keep_init, which is off")
    return True, shrink


def default_shrink(graph: ArchGraph, info: Mapping | None = None, choice: float | None = None) -> float:
    """The factor a prediction kept on ``graph``'s init is added with: ``choice`` when given
    (``shrink`` of :func:`~graphkit.ghn.predict.predict`, checked by :func:`check_shrink`), else 1
    for a hypernetwork trained onto the init (``info``, its config.json: its predictions are
    corrections at full scale), else the family's (``Family.shrink``), 1 for a model of no
    graphkit family."""
    if choice is not None:
        return choice
    return 1.0 if trained_onto_init(info) else float(start_default(graph, info, "shrink", 1.0))


def keep_init_as_is(graph: ArchGraph, info: Mapping | None = None) -> bool | None:
    """The ``keep_init`` of :func:`~graphkit.ghn.predict.predict` for a prediction scored as a
    model, with no fine-tuning (a step-0 loss, the stream it propagates): None, the family's
    default, unless that default shrinks the prediction (LLaMA's), a start made for fine-tuning
    whose step-0 loss is near the init's; then False, the prediction alone."""
    return False if default_shrink(graph, info) < 1 else None


def shrunk(predicted: Mapping[str, torch.Tensor], shrink: float) -> dict[str, torch.Tensor]:
    """``predicted`` with every parameter the keep-init rule adds onto the init (two or more
    dimensions) multiplied by ``shrink``, the rest as predicted: what :func:`add_prediction` adds
    for ``W0 + shrink * P``. New tensors where scaled; the others are ``predicted``'s."""
    return {name: value * shrink if adds_onto_init(value.shape) else value for name, value in predicted.items()}


def trained_onto_init(info: Mapping | None) -> bool:
    """Whether the hypernetwork whose config.json is ``info`` trained its predictions added onto
    each model's own init (``train-ghn --keep-init``): its predictions are corrections, and alone
    they are no model."""
    train = (info or {}).get("train")
    return isinstance(train, Mapping) and train.get("keep_init") is True


def adds_onto_init(shape: torch.Size | tuple[int, ...]) -> bool:
    """Whether a parameter of ``shape`` is written as init plus prediction (two or more
    dimensions) rather than as predicted (norm gains, biases): see the module's docstring."""
    return len(shape) >= 2


@torch.no_grad()
def add_prediction(model: nn.Module, predicted: Mapping[str, torch.Tensor]) -> nn.Module:
    """Apply the keep-init rule to ``model``, which holds its own initialisation: each parameter
    named in ``predicted`` (state-dict names, tied aliases once) gets the prediction added when
    it has two or more dimensions, and is replaced by it otherwise. For ``eval-ghn``'s
    ``keep_init`` rows, where the prediction is made before the model is built."""
    for name, param in model.named_parameters():
        if name in predicted:
            value = predicted[name].to(param.device, param.dtype)
            param.add_(value) if adds_onto_init(param.shape) else param.copy_(value)
    return model


def onto_init(predicted: dict[str, torch.Tensor], init: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``predicted`` as ``predict(keep_init=True)`` writes it onto a model whose own
    initialisation is ``init`` (the rule above): every parameter of two or more
    dimensions ``W0 + P``, the rest ``P``. Training in this form (``--keep-init``) teaches the
    hypernetwork a correction to a full-rank random init rather than a whole matrix, the residual
    form MIP (Ortiz et al., 2024) and NiNo use (issue #45's lead 1)."""
    return {
        name: init[name].to(value.dtype) + value if adds_onto_init(value.shape) else value
        for name, value in predicted.items()
    }


@torch.no_grad()
def initialise_as_built(model: nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Fill ``params`` (some of ``model``'s parameters, already allocated off the meta device)
    as ``model``'s library initialises them at construction: a Hugging Face model's
    ``init_weights()`` (its ``_init_weights``, GPT-2's scaled residual projections included); a
    timm model's ``init_weights()`` where it has one (both only when every parameter of ``model``
    is in ``params``, since they redraw them all, and only when it can be called without
    arguments, since what a required one means is the model's own); then ``reset_parameters()`` of each module whose own
    parameters are all in ``params`` and still unfilled (torch's layers). Raises
    :class:`KeepInitError` naming the first parameter none of them filled, which is left NaN."""
    for param in params.values():
        param.fill_(math.nan)
    new = {id(p) for p in params.values()}
    init_weights = getattr(model, "init_weights", None)
    if _takes_no_arguments(init_weights) and all(
        id(p) in new for p in model.parameters()
    ):  # never redraws held weights
        init_weights()
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        unfilled = any(p.isnan().any() for p in own if id(p) in new)
        reset = getattr(module, "reset_parameters", None)
        if unfilled and all(id(p) in new for p in own) and callable(reset):
            reset()
    left = next((name for name, p in params.items() if p.isnan().any()), None)
    if left is not None:
        raise KeepInitError(
            f"{type(model).__name__}: keep_init has no initialisation for its meta parameter {left!r} "
            "(no init_weights() or reset_parameters() fills it); build the model with weights, "
            "or predict without keep_init"
        )


def _takes_no_arguments(function: object) -> TypeGuard[Callable[[], object]]:
    """Whether ``function`` is callable with no arguments (a method whose parameters all have defaults)."""
    if not callable(function):
        return False
    try:
        inspect.signature(function).bind()
    except (TypeError, ValueError):  # a required argument; or a builtin without a signature
        return False
    return True


__all__ = [
    "KeepInitError",
    "add_prediction",
    "adds_onto_init",
    "check_shrink",
    "default_shrink",
    "keep_init_as_is",
    "keep_init_choice",
    "keeps_init",
    "initialise_as_built",
    "onto_init",
    "saturated_init",
    "should_keep_init",
    "shrunk",
    "start_default",
    "start_family",
    "trained_onto_init",
]

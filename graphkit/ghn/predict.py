"""Predict a model's parameters with a LoGAH and write them into it, in place.

A model that already holds weights gets the predictions written into its own tensors, one
parameter at a time: peak memory stays near the model's own size whether it was built on the
meta device or with weights (BENCHMARKS.md).

Families whose own initialisation scales residual branches (GPT-2: the weights that write each
branch into the residual stream start 1 / sqrt(2 n_layer) smaller than the rest) get the same
factor on the predicted weights (:func:`scale_residuals`). Without it the branches of a predicted
GPT-2 add up to a constant about 90 times the tokens' signal in the stream, and fine-tuning sits
on the unigram plateau for some 150 steps (docs/experiments.md has the measurements).

With ``keep_init`` the prediction is added onto the model's own initialisation instead of
replacing it (:mod:`graphkit.ghn.keep_init`: weight matrices ``W0 + P``, norms and biases as
predicted), still one parameter at a time; GPT-2 does so by default (``Family.keep_init``).
``shrink`` scales the prediction so added, ``W0 + shrink * P``: a start for fine-tuning.

A model wider than the hypernetwork trained at its depth is predicted as its narrow twin and
grown to its width without changing what it computes (:mod:`graphkit.ghn.grow`): predicted
directly, the rows past the trained width make it confidently wrong. A ViT with a patch size or a finer
token grid than any trained is predicted as its twin at trained ones, its patch embedding and
position table resized (and, on a finer grid, its output layer scaled by the grids' ratio)."""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from graphkit.buffers import install_buffers, materialize_buffers, meta_buffers, rebuilt_buffers
from graphkit.errors import (
    BufferRebuildError,
    CalibrationError,
    ConfigError,
    GraphkitError,
    KeepInitError,
    PredictError,
)
from graphkit.families import config_from_graph, family_default
from graphkit.ghn.calibrate import balance_logits, balanced_head, check_calibration, residual_writers
from graphkit.ghn.calibrate import calibrate as calibrate_stream
from graphkit.ghn.checkpoint import UntrainedOpError, bundled_for, check_graph, load_checkpoint
from graphkit.ghn.encoding import encode, targets
from graphkit.ghn.grow import GrownDecoding, Twin, growth, twin_of
from graphkit.ghn.keep_init import (
    adds_onto_init,
    default_shrink,
    initialise_as_built,
    keep_init_choice,
    keeps_init,
    should_keep_init,
)
from graphkit.ghn.model import DecodedParams, LoGAH, LowRankDecoding
from graphkit.ghn.pool import with_init_constants
from graphkit.graph import ArchGraph
from graphkit.params import (
    available_memory,
    check_params,
    first_non_finite,
    memory_shortfall,
    persistent_buffers,
    replace_parameter,
    tied_names,
)
from graphkit.tracing import trace
from graphkit.tracing.tracer import init_record
from graphkit.training.loop import estimate_batch_norm


def should_scale_residuals(graph: ArchGraph, choice: bool | None = None) -> bool:
    """Whether ``graph``'s predicted residual branches are scaled: ``choice`` when given (the
    ``residual_scale`` of :func:`predict` and ``eval-ghn``), else whether the family ``graph`` was
    traced from scales them at init (``Family.scaled_residuals``)."""

    return family_default(graph, "scaled_residuals", choice)


@torch.no_grad()
def scale_residuals(graph: ArchGraph, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Multiply, in place, each of ``graph``'s :func:`residual_writers` in ``params`` by
    1 / sqrt(their number), GPT-2's init rule (two branches a block: 1 / sqrt(2 n_layer));
    returns ``params``."""
    names = residual_writers(graph)
    for name in names:
        params[name].mul_(len(names) ** -0.5)
    return params


def decoding(ghn: LoGAH, graph: ArchGraph, grow: bool | Twin = True) -> LowRankDecoding | DecodedParams | GrownDecoding:
    """``ghn``'s prediction of ``graph``, ready to be checked (``first_non_finite``) and written
    (``write_into``): grown from the graph's twin when ``grow`` and the graph is wider than
    ``ghn`` trained at its depth, or a ViT outside its patch sizes or token grids
    (:func:`graphkit.ghn.grow.growth`; ``grow`` may be the twin, when the caller found it
    already), else decoded directly."""
    grown = growth(ghn, graph, grow if isinstance(grow, Twin) else None) if grow else None
    return grown if grown is not None else ghn.decoding(graph)


@torch.no_grad()
def predicted_params(
    ghn: LoGAH, graph: ArchGraph, residual_scale: bool | None = None, grow: bool | Twin = True
) -> dict[str, torch.Tensor]:
    """Every parameter of ``graph``'s model as :func:`predict` would write it (grown when the
    model is wider than the training space, residual branches scaled as ``residual_scale`` and
    :func:`should_scale_residuals` say), as new tensors by state-dict name: for evaluation, where no
    model holds them yet. A graph traced on the meta device, which records no init, gets the
    init record of its config's model where the checkpoint decodes around one (as a dataset's
    graphs do in training: :func:`graphkit.ghn.pool.with_init_constants`)."""
    if ghn.config.init_anchors and "init" not in graph.meta:
        with contextlib.suppress(ConfigError):  # no family reads its config: the encoder's error says what to do
            graph = with_init_constants(graph, config_from_graph(graph))
    plan = targets(graph, ghn.config.max_slots)
    params = decoding(ghn, graph, grow).write_into({t.name: torch.empty(t.shape, device="meta") for t in plan})
    if should_scale_residuals(graph, residual_scale):
        scale_residuals(graph, params)
    return params


def prediction_refusal(graph: ArchGraph, ghn: LoGAH | None = None) -> str | None:
    """Why :func:`predict` would refuse the model of ``graph`` before writing anything, as its
    one-line error: no bundled hypernetwork trained on every op it has (when ``ghn`` is None,
    :func:`~graphkit.ghn.checkpoint.bundled_for`), an op ``ghn`` was not trained on or newer
    than its vocabulary, a parameter it has no slot for. None when it would predict it. Cheap
    (no parameter is decoded): the zoo's report counts the predictable models with it."""
    refusal = refusal_reason(graph, ghn)
    return None if refusal is None else refusal.message


class Refusal(NamedTuple):
    """Why :func:`predict` would refuse a model: the reason to count it under, the one-line
    error, and the op kinds missing from the hypernetwork (empty for other refusals)."""

    reason: str
    message: str
    missing: tuple[str, ...] = ()


def refusal_reason(graph: ArchGraph, ghn: LoGAH | None = None) -> Refusal | None:
    """:func:`prediction_refusal` with the reason to count it under: ``"missing op: scale"``
    (``"missing ops: pad, roll"``) for the op kinds the hypernetwork, or the nearest bundled one,
    never trained on; else the error with the node it names left out. None when :func:`predict`
    would predict it."""
    try:
        ghn = ghn if ghn is not None else bundled_hypernetwork(str(bundled_for(graph)))
        check_graph(ghn, graph, plain=True)  # as predict's default (grow) sees it
        # a graph traced on meta has no init constants; predict reads them from the model's library,
        # so it is encoded here as if it had them (an empty record: each 1-D parameter by its kind)
        encode(
            graph if "init" in graph.meta else ArchGraph(graph.nodes, graph.edges, {**graph.meta, "init": {}}),
            ghn.config,
        )
    except UntrainedOpError as e:
        return Refusal(f"missing op{'s' if len(e.missing) > 1 else ''}: {', '.join(e.missing)}", str(e), e.missing)
    except GraphkitError as e:
        return Refusal(reason_of(str(e)), str(e))
    return None


def reason_of(message: str) -> str:
    """A refusal's one-line ``message`` with the node it names left out (``node '...'``), so that
    models refused for one reason at different nodes are counted together."""
    return re.sub(r"node '[^']*'", "node '...'", message)


@functools.cache
def bundled_hypernetwork(checkpoint: str) -> LoGAH:
    """The bundled hypernetwork ``checkpoint`` (a value of ``BUNDLED``, or the folder
    :func:`~graphkit.ghn.checkpoint.bundled_for` picks), loaded once per process and shared:
    for reading, as :func:`prediction_refusal` does, not for training."""
    return load_checkpoint(checkpoint)


def predict(
    model: nn.Module,
    ghn: LoGAH | None = None,
    example_inputs=None,
    *,
    memory_limit: int | None = None,
    graph: ArchGraph | None = None,
    residual_scale: bool | None = None,
    grow: bool | Twin = True,
    calibrate: bool = False,
    balance_on: torch.Tensor | None = None,
    buffers: str = "all",
    keep_init: bool | None = None,
    shrink: float | None = None,
) -> dict[str, torch.Tensor]:
    """Trace ``model``, predict every parameter with ``ghn`` (default: the bundled LoGAH-tiny
    that fits the model, :func:`~graphkit.ghn.checkpoint.bundled_for`) and write the
    predictions into ``model``: into its own tensors when it holds weights, parameter by
    parameter, with no second copy of the model; into new tensors
    on the hypernetwork's device when it is on the meta device (tied weights stay tied). The
    buffers a meta-built model computed when it was built (rotary frequencies, relative-position
    indices, masks) are recomputed on the parameters' device (:mod:`graphkit.buffers`), so the
    model runs; ``buffers="saved"`` recomputes only those its state dict holds, which is all that
    :func:`~graphkit.params.save_params` writes (``graphkit predict --out``), unless ``calibrate``
    runs the model. Returns the model's parameters by state-dict name, now holding the predictions.

    Refused before anything is allocated or written, so the model is left unchanged: a graph
    with an op the hypernetwork was not trained on (CheckpointError) or whose parameters are not
    the model's (ParamsError); a meta buffer no library recomputes (BufferRebuildError, naming
    it); new tensors and scratch larger than ``memory_limit`` bytes
    (default: the memory available on the hypernetwork's device); predictions that could hold a
    NaN or Inf, which the low-rank decoder proves impossible before its first write (see
    :class:`~graphkit.ghn.model.LowRankDecoding`). ``graph`` skips the trace when the caller
    already holds the model's graph. ``residual_scale`` scales the residual branches' weights
    as the family's own init does (:func:`scale_residuals`); None: when the family does
    (:func:`should_scale_residuals`, GPT-2). ``grow`` predicts a model wider than the
    hypernetwork trained at its depth as its narrow twin, grown, and a ViT outside the trained patch sizes
    or finer than the trained token grids at trained ones, resized (:mod:`graphkit.ghn.grow`;
    the :class:`~graphkit.ghn.grow.Twin` that :func:`~graphkit.ghn.grow.twin_of` found, when the
    caller has it, is used as it is); False decodes it directly. ``calibrate`` then rescales
    the residual branches and the output layer so that the stream and logits are no larger than the family's init gives
    (:func:`graphkit.ghn.calibrate.calibrate`); refused before any write for a model of no
    graphkit family. ``balance_on`` (a batch of the task's images, no labels) then shifts a
    classifier's output-layer bias so that every class has the same mean predicted probability
    over it (:func:`graphkit.ghn.calibrate.balance_logits`): the one guess for every image that a
    prediction gives on an architecture unlike its training set, taken out; refused before any
    write when the output layer has no bias; a model with BatchNorm first gets its running
    statistics from the same images (:func:`~graphkit.training.loop.estimate_batch_norm`), which
    its logits are balanced with, as ``eval-ghn`` does. ``keep_init`` adds the prediction onto the
    model's own initialisation (weight matrices ``W0 + P``, with ``P`` as written without it, residual branches scaled;
    norms and biases ``P``: :mod:`graphkit.ghn.keep_init`); None: when the family does
    (:func:`~graphkit.ghn.keep_init.should_keep_init`, GPT-2), unless the model is a
    hand-written one whose own logits are saturated (:func:`~graphkit.ghn.keep_init.keeps_init`).
    A model with weights keeps the
    ones it holds; a meta one's are first allocated and initialised as its library builds them
    (:func:`~graphkit.ghn.keep_init.initialise_as_built`), and a parameter no library fills is
    refused (KeepInitError) with the model left on meta. ``shrink`` (above 0, at most 1) adds
    the prediction scaled by it, ``W0 + shrink * P``, and implies ``keep_init``: shrink and
    perturb (Ash & Adams, 2020), a start that fine-tunes faster than the prediction once its
    head start is spent (:mod:`graphkit.ghn.keep_init`); None: the family's
    (:func:`~graphkit.ghn.keep_init.default_shrink`, ``Family.shrink``)."""

    if buffers not in ("all", "saved"):
        raise PredictError(f"buffers must be 'all' or 'saved', got {buffers!r}")
    keep_init, shrink = keep_init_choice(keep_init, shrink, PredictError)
    graph = graph if graph is not None else trace(model, example_inputs)
    if ghn is None:
        ghn = load_checkpoint(bundled_for(graph))
    check_graph(ghn, graph, plain=grow is not False)  # a plain form is predicted through a twin
    if calibrate:
        check_calibration(graph)
    if balance_on is not None:
        try:
            balanced_head(model, graph)
        except CalibrationError as e:
            raise PredictError(f"{type(model).__name__}: cannot balance its classes: {e}") from e
    device = next(ghn.parameters()).device
    plan = targets(graph, ghn.config.max_slots)
    spare = graph.meta.get("spare", {})  # cannot change the output: left at the model's own init
    planned = {t.name: torch.empty(t.shape, device="meta") for t in plan}
    spare_shapes = {name: torch.empty(shape, device="meta") for name, shape in spare.items()}
    check_params(model, {**planned, **spare_shapes}, source=f"{type(model).__name__}: ")
    destinations: dict[str, torch.Tensor] = {t.name: model.get_parameter(t.name) for t in plan}
    new = {id(p): p for p in destinations.values() if p.is_meta}.values()
    runs = calibrate or balance_on is not None  # the model is run: every buffer it computes with
    wanted = None if buffers == "all" or runs else set(persistent_buffers(model))
    meta = {name: b for name, b in meta_buffers(model).items() if wanted is None or name in wanted}
    allocated = [*new, *meta.values()]
    needed = sum(t.numel() * t.element_size() for t in allocated) + ghn.decoder.scratch_bytes(plan, destinations)
    limit = memory_shortfall(needed, device, memory_limit)
    if limit is not None:
        raise PredictError(
            f"{type(model).__name__}: its {graph.num_params:,} predicted parameters need {needed / 1e9:.2f} GB "
            f"but {limit / 1e9:.2f} GB are available on {device}; free memory or predict on another device"
        )
    # the buffers a meta-built model computed in __init__ (rotary inv_freq, position indices), on the
    # device its parameters will be on; refused here, naming the buffer, when no library recomputes one
    rebuilt = rebuilt_buffers(model, next((p.device for p in model.parameters() if not p.is_meta), device), meta)
    if any(model.get_parameter(name).is_meta for name in spare):  # initialised as its library builds it
        try:
            _materialise(model, destinations, device)
        except KeepInitError as e:
            raise PredictError(
                f"{type(model).__name__}: its spare parameter {next(iter(spare))!r} (it cannot change the output) "
                "keeps the init its library gives it, but no library initialisation fills the model's meta parameters; "
                "build the model with weights"
            ) from e
    graph = with_init_record(model, graph, ghn)
    # the model itself can give a twin the graph cannot: a transformers decoder of no graphkit family
    prediction = decoding(ghn, graph, (twin_of(ghn, graph, model, example_inputs) or False) if grow is True else grow)
    bad = prediction.first_non_finite()
    if bad is not None:
        raise PredictError(f"the hypernetwork predicted NaN or Inf for {bad!r}; the model was left unchanged")
    scaled = should_scale_residuals(graph, residual_scale)
    keeping, _ = keeps_init(model, graph, keep_init, getattr(ghn, "info", None), example_inputs)
    onto = _onto_init(model, graph, destinations, device) if keeping else set()
    # W0 / c + P, multiplied by c below, is W0 + c P: the init kept as it was, the prediction scaled
    # by c (shrink, times the residual scale on a residual branch's weights when they are scaled)
    factor = default_shrink(graph, getattr(ghn, "info", None), shrink)
    writers = residual_writers(graph) if scaled else []
    residual = {name: len(writers) ** -0.5 for name in onto & set(writers)}
    _multiply(destinations, {name: 1 / (factor * residual.get(name, 1.0)) for name in onto})
    written = prediction.write_into(destinations, onto)
    if scaled:
        scale_residuals(graph, written)
    _multiply(written, dict.fromkeys(onto, factor))
    if new:  # swap the new tensors in under every tied name
        canonical = {id(p): name for name, p in model.named_parameters()}
        names = tied_names(model)
        for name, param in destinations.items():
            if param.is_meta:
                replace_parameter(model, canonical[id(param)], written[name], names)
    install_buffers(model, rebuilt)
    if calibrate:
        calibrate_stream(model, graph)
    if balance_on is not None:
        estimate_batch_norm(model, [balance_on.to(next(model.parameters()).device)])
        try:
            balance_logits(model, graph, balance_on)
        except CalibrationError as e:
            raise PredictError(f"{type(model).__name__}: the prediction is written, its logits unbalanced: {e}") from e
    return {name: model.get_parameter(name).detach() for name in destinations}


@torch.no_grad()
def _multiply(tensors: dict[str, torch.Tensor], factors: dict[str, float]) -> None:
    """Multiply each tensor named in ``factors`` by its factor, in place, once per tensor (tied
    names share one); factors of 1 are skipped."""
    done: set[int] = set()
    for name, factor in factors.items():
        if factor != 1 and id(tensors[name]) not in done:
            done.add(id(tensors[name]))
            tensors[name].mul_(factor)


def with_init_record(model: nn.Module, graph: ArchGraph, ghn: LoGAH) -> ArchGraph:
    """``graph`` as :func:`predict` encodes it for ``ghn``: where the checkpoint decodes 1-D
    parameters around the model's init (``init_anchors``) and the trace recorded none (it ran on
    the meta device), with the init record of ``model`` as its library builds it. A caller that
    encodes the graph before predicting (``graphkit predict`` naming the stand-in roles) passes
    the result to :func:`predict` as ``graph``, so that the record is built once."""
    if not ghn.config.init_anchors or "init" in graph.meta:
        return graph
    return ArchGraph(graph.nodes, graph.edges, {**graph.meta, **_init_record_as_built(model, graph)})


def _init_record_as_built(model: nn.Module, graph: ArchGraph) -> dict[str, Any]:
    """The init record (:func:`~graphkit.tracing.tracer.init_record`) of ``model`` as its
    library builds it: a copy of a meta model gets CPU tensors initialised as built
    (:func:`~graphkit.ghn.keep_init.initialise_as_built`, on a generator of its own), so that the
    model itself, its libraries' marks of what they initialised and the global generator are left
    as they were. Parameters no library initialisation fills are left out of the constants; the
    copy's buffers are recomputed on the CPU for the forward pass that measures the logit scale,
    which is left out where one cannot be."""
    if not any(p.is_meta for p in model.parameters()):
        return init_record(model, graph)
    twin = copy.deepcopy(model)  # on meta: no weights copied
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            _built_off_meta(twin, {name: p for name, p in twin.named_parameters() if p.is_meta}, torch.device("cpu"))
        except KeepInitError:
            pass  # left NaN, which init_constants skips and which measures no logit scale
        with contextlib.suppress(BufferRebuildError):  # then measured on none: logit_scale gives None
            materialize_buffers(twin, "cpu")
        return init_record(twin, graph)


def _built_off_meta(
    model: nn.Module, meta: Mapping[str, torch.Tensor], device: torch.device
) -> dict[str, nn.Parameter]:
    """Give ``model``'s meta parameters ``meta`` (each by one name: a tied parameter once) new
    tensors on ``device``, put into the model and initialised as its library builds them
    (:func:`~graphkit.ghn.keep_init.initialise_as_built`); returns them by name. Raises
    KeepInitError, the new tensors in place and those no initialisation fills left NaN."""
    names = tied_names(model)
    fresh = {
        name: replace_parameter(model, name, torch.empty(p.shape, dtype=p.dtype, device=device), names)
        for name, p in meta.items()
    }
    initialise_as_built(model, fresh)
    return fresh


def _materialise(model: nn.Module, destinations: dict[str, torch.Tensor], device: torch.device) -> None:
    """Give every meta parameter of ``model`` a new tensor on ``device``, initialised as its
    library builds it (:func:`_built_off_meta`), and point ``destinations`` at the new tensors.
    Raises KeepInitError, with the model's meta parameters put back, when no library
    initialisation fills one."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    meta = {canonical[id(p)]: p for p in model.parameters() if p.is_meta}  # a tied parameter once
    try:
        fresh = _built_off_meta(model, meta, device)
    except GraphkitError:
        names = tied_names(model)
        for name, p in meta.items():
            replace_parameter(model, name, p, names)
        raise
    new = {id(meta[name]): tensor for name, tensor in fresh.items()}
    destinations.update({name: new.get(id(p), p) for name, p in destinations.items()})


def _onto_init(
    model: nn.Module, graph: ArchGraph, destinations: dict[str, torch.Tensor], device: torch.device
) -> set[str]:
    """For ``keep_init``: the names whose prediction is added onto the init (two or more
    dimensions), after giving the model's meta parameters new tensors on ``device``, initialised
    as its library builds them; ``destinations`` is updated to them. Raises KeepInitError, with
    the model's meta parameters put back, when no library initialisation fills one."""
    if any(p.is_meta for p in destinations.values()):
        _materialise(model, destinations, device)
    return {name for name, p in destinations.items() if adds_onto_init(p.shape)}


__all__ = [
    "predict",
    "prediction_refusal",
    "refusal_reason",
    "reason_of",
    "Refusal",
    "bundled_hypernetwork",
    "decoding",
    "predicted_params",
    "PredictError",
    "residual_writers",
    "scale_residuals",
    "should_scale_residuals",
    "should_keep_init",
    "available_memory",
    "first_non_finite",
]  # the last two now live in graphkit.params

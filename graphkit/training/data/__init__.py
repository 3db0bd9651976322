"""Data the hypernetwork trains and evaluates on: random batches shaped for any model config.

LoGAH scores predicted parameters by running the predicted model on real data, so a source
must fit every config of a family (any image size, channel count, context length). Images are
resized per batch and text is tokenised as UTF-8 bytes (ids 0..255), which any vocab >= 256
accepts with no tokenizer download. The defaults ship with scikit-learn and Python itself, so
training and tests never touch the network.

    >>> source = load_source("digits")
    >>> images, labels = source.batch(config, 32, torch.Generator().manual_seed(0))

The sources live in ``images``, ``cifar`` and ``text``, on the base class in ``source``; this
module names them (:func:`accepted_sources`), loads one from its spec and scores a model's output.
A new source is one call of :func:`register_source`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from graphkit.errors import ConfigError, GraphkitError, TraceError
from graphkit.families import FamilyTable, config_from_graph
from graphkit.families.libraries import CONTEXT_FIELDS
from graphkit.tracing import trace
from graphkit.tracing.inputs import (
    evaluated,
    logits_of,
    normalise_inputs,
    patch_grid,
    patch_inputs,
    tensors_of,
    text_config,
    token_limit,
)
from graphkit.training.data.cifar import cifar, read_cifar_file
from graphkit.training.data.images import ImageSource, digits, image_folder
from graphkit.training.data.source import SPLITS, DataError, DataSource
from graphkit.training.data.text import TextSource, stdlib_text, text_file, wikitext
from graphkit.validation import is_count

#: each family's default data source (``Family.data``), a live view of the family registry
DEFAULT_SOURCES = FamilyTable("data")

__all__ = [
    "DEFAULT_SOURCES",
    "SPLITS",
    "DataError",
    "DataSource",
    "ImageSource",
    "TextSource",
    "calibration_inputs",
    "data_config",
    "model_inputs",
    "default_source",
    "accepted_sources",
    "load_source",
    "output_loss",
    "register_source",
    "source_for",
    "read_cifar_file",
]


def default_source(family: str | None) -> str:
    """The bundled source for a family's models (used when the user names none)."""
    if family is None or family not in DEFAULT_SOURCES:
        raise DataError(
            f"no default data for family {family!r}; families with one: {', '.join(DEFAULT_SOURCES)}; "
            f"name the data instead (--data): {accepted_sources()}"
        )
    return DEFAULT_SOURCES[family]


def data_config(model: torch.nn.Module, example_inputs: Any = None) -> dict[str, Any]:
    """The config a data source shapes its batches by for ``model``: a transformers language
    model's read off its own config, or a multimodal config's text part (its vocabulary and
    context, None where no field bounds it; family: its model type), so that any causal LM,
    LLaMA-like, Mamba, Gemma 3 or a converted DeepSeek, takes text; an image classifier's from the
    images it reads (``example_inputs``, else those the tracer guesses: timm's ``input_size``, a
    transformers config's image size) and the classes it scores (timm's ``num_classes``,
    transformers' ``num_labels``, else the width of the logits it returns), so that any timm
    model, transformers image classifier or hand-written one takes images (a model that reads
    flattened patches, SigLIP 2's, images of its position table's grid and ``patch_inputs``, its
    patch size: :func:`model_inputs`); anything else's from its graph, for graphkit's families
    (GPT-2s and LLaMAs written by hand), else, for a hand-written language model of no family,
    the vocabulary its (batch, tokens, vocabulary) logits score and the context its tables bound
    (:func:`~graphkit.tracing.inputs.token_limit`). A ConfigError when none says (see
    :func:`graphkit.families.config_from_graph`), or when the images it reads are not square (the
    sources resize to a square)."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None) or type(model).__name__
    text = text_config(config) if config is not None and _reads_token_ids(model) else None
    vocab = getattr(text, "vocab_size", None)
    if isinstance(vocab, int):  # no position limit (Mamba, BLOOM's ALiBi): the windows' own length
        context = next((v for field in CONTEXT_FIELDS if is_count(v := getattr(text, field, None))), None)
        return {"family": family, "vocab_size": vocab, "context": context}
    timm = isinstance(getattr(model, "pretrained_cfg", None), Mapping)  # not graphkit's ViTs, built without one
    classes = getattr(model, "num_classes", None) if timm else getattr(config, "num_labels", None)
    grid = patch_grid(model)
    if grid is not None and is_count(classes):  # SigLIP 2's NaFlex: images of its grid, cut into patches
        channels, patch, side = grid
        return {
            "family": family,
            "image_size": side * patch,
            "in_chans": channels,
            "num_classes": classes,
            "patch_inputs": patch,
        }
    try:
        inputs = normalise_inputs(model, example_inputs)
    except TraceError:  # no input to guess: the graph's family decides, or says why not
        inputs = None
    image = _image_shape(inputs)
    if image is None or not is_count(classes):
        try:  # graphkit's families, their config read back whole
            return config_from_graph(trace(model, example_inputs))
        except GraphkitError as e:  # of no family: a hand-written model's logits say its classes or vocabulary
            if image is None and _token_ids(inputs) is not None and is_count(vocab := _scored(model, inputs, 3)):
                return {"family": family, "vocab_size": vocab, "context": token_limit(model)}
            classes = _scored(model, inputs, 2) if image is not None else None
            if image is not None and not is_count(classes) and isinstance(e, ConfigError):  # traced, runs
                raise ConfigError(
                    f"{type(model).__name__} reads images but returns no class logits for them (a (batch, "
                    f"classes) tensor or an output's logits: timm's features_only models return feature maps); {e}"
                ) from None
            if not is_count(classes):
                raise
    assert image is not None  # for mypy: an image model reached here
    channels, height, width = image
    if height != width:
        raise ConfigError(f"{type(model).__name__} reads {height} x {width} images; the data sources give square ones")
    return {"family": family, "image_size": height, "in_chans": channels, "num_classes": classes}


def _reads_token_ids(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``input_ids``: a language model, where a multimodal
    config's text part is the vision classifier's (CLIP's) otherwise."""
    try:
        return "input_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward with no signature to read
        return False


def _image_shape(inputs: tuple[tuple, dict] | None) -> tuple[int, int, int] | None:
    """(channels, height, width) of ``inputs`` (args, kwargs) when they are one image batch, else None."""
    tensors = list(tensors_of(inputs)) if inputs is not None else []
    if len(tensors) == 1 and tensors[0].dim() == 4 and tensors[0].is_floating_point():
        channels, height, width = tensors[0].shape[1:]
        return int(channels), int(height), int(width)
    return None


def _token_ids(inputs: tuple[tuple, dict] | None) -> Tensor | None:
    """The (batch, tokens) ids ``inputs`` (args, kwargs) are, when they are one such tensor."""
    tensors = list(tensors_of(inputs)) if inputs is not None else []
    if len(tensors) == 1 and tensors[0].dim() == 2 and not tensors[0].is_floating_point():
        return tensors[0]
    return None


def _scored(model: torch.nn.Module, inputs: tuple[tuple, dict] | None, dims: int) -> int | None:
    """The classes or vocabulary ``model`` scores: the width of the logits of ``dims`` dimensions
    ((batch, classes) or (batch, tokens, vocabulary)) it returns for ``inputs``, run in eval mode
    (a BatchNorm's statistics untouched), without gradients; None when it returns anything else
    or fails (training fails there too, and says why)."""
    if inputs is None:
        return None
    try:
        output = evaluated(model, inputs)
    except Exception:  # the caller falls back to the graph, whose trace names what failed
        return None
    logits = logits_of(output)
    return int(logits.shape[-1]) if isinstance(logits, Tensor) and logits.dim() == dims else None


def model_inputs(x: Tensor, config: Mapping[str, Any]) -> Tensor | dict[str, Tensor]:
    """What the model whose data config is ``config`` (:func:`data_config`) takes for the batch
    ``x`` a source drew for it: ``x`` itself, or, for a model that reads flattened patches
    (``patch_inputs``: SigLIP 2's NaFlex), ``x``'s images cut into its patches as its image
    processor cuts them (:func:`graphkit.tracing.inputs.patch_inputs`), a dict of keyword
    arguments (:func:`graphkit.training.loop.forward` passes it so)."""
    patch = config.get("patch_inputs")
    return patch_inputs(x, int(patch)) if patch else x


def source_for(config: dict[str, Any]) -> str:
    """The bundled data for the model ``config`` describes: its family's, else stdlib-text for any
    language model (a config with a vocabulary) and digits for any image model (one with an image
    size); a DataError naming the families otherwise."""
    if config.get("family") not in DEFAULT_SOURCES:
        if "vocab_size" in config:
            return "stdlib-text"
        if "image_size" in config:
            return "digits"
    return default_source(config.get("family"))


def output_loss(task: str, output: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy, accuracy) of a model's output: logits (B, classes) for images,
    (B, T, vocab) for text (accuracy per token). The logits are the tensor itself, an output's
    ``.logits``, or else its first field or element, transformers' main output (PP-LCNet's
    classifier returns its logits as ``last_hidden_state``). The loss keeps its graph, as the
    hypernetwork trains through it; the accuracy does not."""
    logits = logits_of(output)
    dims = {"image": 2, "text": 3}
    if task not in dims:
        raise ValueError(f"task must be one of {', '.join(dims)}; got {task!r}")
    if not isinstance(logits, Tensor):
        raise ValueError(f"the model returns {type(output).__name__}, with no logits")
    if logits.dim() != dims[task] or logits.shape[:-1] != targets.shape:
        raise ValueError(f"{task} logits {tuple(logits.shape)} do not fit targets {tuple(targets.shape)}")
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())  # float32 whatever the model ran in
    return loss, (logits.detach().argmax(-1) == targets).float().mean()


# each loader takes (spec, path) for an image source, (path) for a text one; path is None for a
# source without an argument, a Path for one whose argument (_ARGS) was checked
_IMAGE: dict[str, Callable[..., ImageSource]] = {
    "digits": digits,
    "cifar10": cifar,
    "cifar100": cifar,
    "imagefolder": image_folder,
}
_TEXT: dict[str, Callable[..., tuple[bytes, bytes]]] = {
    "stdlib-text": stdlib_text,
    "text": text_file,
    "wikitext": wikitext,
}
_ARGS = {"cifar10": "DIR", "cifar100": "DIR", "imagefolder": "DIR", "text": "PATH", "wikitext": "DIR"}


def register_source(
    name: str,
    load: Callable[..., ImageSource] | Callable[..., tuple[bytes, bytes]],
    *,
    task: str,
    arg: str | None = None,
) -> None:
    """Make ``name`` a data source every command takes (``--data name``, or ``name:ARG`` when
    ``arg`` says what its argument is: DIR, a folder, or PATH, a file, checked to exist before
    ``load`` runs). An ``image`` source's ``load(spec, path)`` returns an
    :class:`~graphkit.training.data.images.ImageSource`; a ``text`` source's ``load(path)``
    returns its training and held-out bytes, which :class:`TextSource` windows."""
    if task not in ("image", "text"):
        raise DataError(f"data source {name!r}: task {task!r}; accepted: image, text")
    if arg not in (None, "DIR", "PATH"):
        raise DataError(f"data source {name!r}: arg {arg!r}; accepted: DIR, PATH or none")
    if not name or ":" in name:
        raise DataError(f"data source name {name!r}: a word without ':'")
    if task == "image":
        _IMAGE[name] = cast(Callable[..., ImageSource], load)
    else:
        _TEXT[name] = cast(Callable[..., tuple[bytes, bytes]], load)
    if arg is not None:
        _ARGS[name] = arg


def accepted_sources(task: str | None = None) -> str:
    """Every data source's spec, as errors and --help list them; only the image or the text ones
    for ``task`` "image" or "text"."""
    names = [*(_IMAGE if task in (None, "image") else []), *(_TEXT if task in (None, "text") else [])]
    return ", ".join(f"{n}:{_ARGS[n]}" if n in _ARGS else n for n in names)


def load_source(spec: str, seq_len: int = 64) -> DataSource:
    """The source a spec names (see :func:`accepted_sources`); ``seq_len`` is the text window
    before clipping to a model's context."""
    name, _, arg = spec.partition(":")
    if name not in _IMAGE and name not in _TEXT:
        raise DataError(f"unknown data source {spec!r}; accepted: {accepted_sources()}")
    if bool(arg) != (name in _ARGS):
        raise DataError(
            f"data source {spec!r}: write {name}:{_ARGS[name]}"
            if name in _ARGS
            else f"data source {name!r} takes no argument; got {spec!r}"
        )
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1; got {seq_len}")
    path = Path(arg).expanduser() if arg else None
    if path is not None and not path.exists():
        raise DataError(f"data source {spec!r}: {path} does not exist")
    if _ARGS.get(name) == "DIR" and path is not None and not path.is_dir():
        raise DataError(f"data source {spec!r}: {path} is not a folder")
    try:
        if name in _IMAGE:
            return _IMAGE[name](spec, path)
        return TextSource(spec, *_TEXT[name](path), seq_len)
    except OSError as e:  # unreadable files: permissions, a folder that vanished, an I/O error
        raise DataError(f"data source {spec!r}: {e.filename or path}: {e.strerror or e}") from None


def calibration_inputs(
    config: dict[str, Any],
    spec: str | DataSource | None = None,
    batches: int = 4,
    batch_size: int = 8,
    seq_len: int = 64,
) -> list[Tensor]:
    """A few batches of inputs for the model ``config`` describes, to measure its activations on
    (``convert``'s groupings, ``predict --balance-on``): from the source ``spec`` names (or is,
    once loaded), else the family's bundled one, from the train split, drawn with a fixed seed so
    that a conversion repeats."""
    source = spec if isinstance(spec, DataSource) else load_source(spec or source_for(config), seq_len=seq_len)
    source.check(config)
    generator = torch.Generator().manual_seed(0)
    return [source.batch(config, batch_size, generator)[0] for _ in range(batches)]

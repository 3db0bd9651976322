"""Example inputs to trace a model with, guessed from the model when the user gives none."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch
from torch import nn

from graphkit.errors import TraceError
from graphkit.validation import is_count

ExampleInputs = Any  # a tensor, a tuple of positional args, a dict of kwargs, or (args, kwargs)

#: the image side for a transformers image model whose config gives none: the ImageNet resolution
#: its checkpoints are trained at and its image processor crops to
DEFAULT_IMAGE_SIZE = 224


def example_inputs_for(model: nn.Module, length: int = 8) -> tuple[tuple, dict]:
    """Inputs to trace ``model`` with: ``(args, kwargs)`` on the model's device.

    A model that reads images as patches of any grid (SigLIP 2's NaFlex: ``pixel_values`` of
    flattened patches, ``pixel_attention_mask`` and ``spatial_shapes``) gets two images of its
    position table's square grid, unpadded. Other image models (timm ``patch_embed.img_size``, HF
    ``config.image_size``, timm ``pretrained_cfg['input_size']``, else 224 px for a transformers
    model whose main input is ``pixel_values``) get a batch of two images; models with a
    ``config.vocab_size`` (or a multimodal config's text part with one) get two sequences of
    ``length`` token ids, fewer where the position table is shorter (``use_cache=False`` when
    accepted);
    hand-written language models whose first layer with parameters is an ``nn.Embedding``
    (nanoGPT, minGPT) get token ids, as short as every position table, rotary cache and length
    attribute allows.
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    config = getattr(model, "config", None)
    patches = _patch_inputs(model, device)
    if patches is not None:
        return (), patches
    image = _image_size(model)
    if image is not None:
        return (torch.zeros(2, *image, device=device),), {}
    text = text_config(config)
    if text is not None and getattr(text, "vocab_size", None):
        fields = (getattr(text, "n_positions", None), getattr(text, "max_position_embeddings", None))
        limit = next((cast(int, v) for v in fields if is_count(v)), length)  # XLNet's -1: relative positions
        kwargs: dict[str, Any] = {
            "input_ids": torch.zeros(2, max(2, min(length, limit)), dtype=torch.long, device=device)
        }
        parameters = inspect.signature(model.forward).parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        if "use_cache" in parameters or (takes_kwargs and hasattr(config, "use_cache")):
            kwargs["use_cache"] = False  # a returned cache is no output (GraniteMoE takes it through **kwargs)
        return (), kwargs
    tokens = _token_length(model)
    if tokens is not None:
        return (torch.zeros(2, tokens, dtype=torch.long, device=device),), {}
    raise TraceError(
        f"cannot guess example inputs for {type(model).__name__}: it is neither an image model "
        "(no img_size / image_size) nor a language model (no config.vocab_size, and its first layer "
        "with parameters is not an nn.Embedding); pass example_inputs (or define example_inputs() in MODEL.py)"
    )


def text_config(config: Any) -> Any:
    """The config that says how a model reads text: the model's own, or the text part of a
    multimodal one (Gemma 3's ``text_config``, through transformers' ``get_text_config``)."""
    if config is None or getattr(config, "vocab_size", None) or not hasattr(config, "get_text_config"):
        return config
    try:
        return config.get_text_config()
    except Exception:  # a config class whose sub-configs are not text; the model is not a language model
        return config


#: buffer names of precomputed rotary tables, whose first dimension bounds the sequence length
_ROTARY_BUFFER = ("cos", "sin", "freq", "rope", "rotary")
#: names of a bare position table (``nn.Parameter(torch.zeros(1, block_size, dim))``)
_POSITION_PARAMETER = ("pos", "position", "wpe")
#: attributes (of the model or its config) that bound the sequence length
_LENGTH_ATTRIBUTES = (
    "block_size",
    "max_seq_len",
    "max_len",
    "context_length",
    "seq_len",
    "n_ctx",
    "n_positions",
    "max_position_embeddings",
)


def _token_length(model: nn.Module) -> int | None:
    """A sequence length for token-id inputs when ``model``'s first layer holding parameters is
    an ``nn.Embedding`` (a hand-written LM such as nanoGPT or minGPT), else None: at most 8, and
    no longer than :func:`token_limit` allows."""
    first = next(
        (
            m
            for m in model.modules()
            if not any(True for _ in m.children()) and any(True for _ in m.parameters(recurse=False))
        ),
        None,
    )
    if not isinstance(first, nn.Embedding):
        return None
    limit = token_limit(model)
    return max(1, min(8, 8 if limit is None else limit))


def token_limit(model: nn.Module) -> int | None:
    """The longest token sequence a hand-written language model takes: no longer than any
    embedding table but the first (the token table), any bare position-table parameter
    (``pos_emb = nn.Parameter(...)``, on the model or a submodule), any rotary buffer's first
    dimension or a length attribute of the model or its config (``block_size``, which nanoGPT
    asserts, ``max_seq_len``, ...); None when nothing bounds it."""
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    limits = [m.num_embeddings for m in tables[1:]]
    limits += [
        p.shape[-2]
        for name, p in model.named_parameters()
        if p.dim() >= 2
        and any(key in name.rsplit(".", 1)[-1].lower() for key in _POSITION_PARAMETER)
        and not isinstance(model.get_submodule(name.rpartition(".")[0]), nn.Embedding)
    ]
    limits += [
        b.shape[0]
        for name, b in model.named_buffers()
        if b.dim() >= 1 and any(key in name.rsplit(".", 1)[-1].lower() for key in _ROTARY_BUFFER)
    ]
    for owner in (model, *(getattr(model, name, None) for name in ("config", "args", "params"))):
        limits += [cast(int, value) for key in _LENGTH_ATTRIBUTES if is_count(value := getattr(owner, key, None))]
    return min(limits) if limits else None


def _image_size(model: nn.Module) -> tuple[int, int, int] | None:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    patch = getattr(model, "patch_embed", None)
    if patch is not None and getattr(patch, "img_size", None) is not None:
        # a hybrid's patch embedding projects a CNN backbone's features: the image's channels are
        # the model's (timm's input_size), not what the projection reads
        channels = getattr(getattr(patch, "proj", None), "in_channels", 3)
        if getattr(patch, "backbone", None) is not None:
            channels = _timm_channels(model, cfg) or channels
        height, width = (int(s) for s in patch.img_size)
        return int(channels), height, width
    config = getattr(model, "config", None)
    if _reads_images_only(model):  # CLIP's or SigLIP's image classifier: the image size is its vision config's
        config = getattr(config, "vision_config", None) or config
    if config is not None and getattr(config, "image_size", None):
        size = config.image_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return (int(getattr(config, "num_channels", 3)), *size)
    # TimmWrapper keeps timm's in its config when loaded from a checkpoint, in its timm_model when built from one
    wrapped = getattr(getattr(model, "timm_model", None), "pretrained_cfg", None)
    for record in (cfg, getattr(config, "pretrained_cfg", None), wrapped):
        if isinstance(record, Mapping) and record.get("input_size"):
            channels, height, width = (int(s) for s in record["input_size"])
            return _timm_channels(model, record) or channels, height, width
    if config is not None and getattr(model, "main_input_name", None) == "pixel_values":
        # a transformers image model whose config has no image size (ResNet, RegNet, BiT, CvT, SegFormer):
        # it takes any size, and is published and preprocessed at ImageNet's
        return int(getattr(config, "num_channels", 3)), DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE
    return None


def _timm_channels(model: nn.Module, record: Any) -> int | None:
    """The image channels of a timm model, read off the convolution its pretrained config names
    ``first_conv`` (what timm adapts when it loads weights for another ``in_chans``): the config's
    ``input_size`` says 3 whatever ``in_chans`` the model was built with. None when it names none
    that resolves to a convolution."""
    first = record.get("first_conv") if isinstance(record, Mapping) else None
    names = [first] if isinstance(first, str) else list(first or [])
    for name in names:
        for root in (model, getattr(model, "timm_model", None)):  # TimmWrapper holds timm's model
            try:
                channels = getattr(root.get_submodule(name), "in_channels", None) if root is not None else None
            except AttributeError:
                continue
            if is_count(channels):
                return channels
    return None


def patch_grid(model: nn.Module) -> tuple[int, int, int] | None:
    """(channels, patch, side) for a model whose forward takes images as flattened patches of any
    grid (SigLIP 2's NaFlex: ``pixel_values`` of shape (batch, patches, channels x patch x patch),
    with ``pixel_attention_mask`` and ``spatial_shapes``): ``side`` is its position table's square
    grid (16 at the default 256 patches, a 256-px image at patch 16), so that the table is read
    unresized; None for any other model."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward with no signature to read
        return None
    if not {"pixel_values", "pixel_attention_mask", "spatial_shapes"} <= set(parameters):
        return None
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None) or config
    patches, patch = getattr(vision, "num_patches", None), getattr(vision, "patch_size", None)
    if not is_count(patches) or not is_count(patch):
        return None
    return int(getattr(vision, "num_channels", 3)), cast(int, patch), math.isqrt(cast(int, patches))


def patch_inputs(images: torch.Tensor, patch: int) -> dict[str, torch.Tensor]:
    """The NaFlex inputs of a batch of images (B, C, H, W), H and W multiples of ``patch``: each
    image's patches in row-major grid order, each patch's pixels row by row with the channels last
    (the layout of transformers' ``Siglip2ImageProcessor``), every patch an image's (a mask of
    ones: no padding), and each image's grid in ``spatial_shapes``."""
    batch, channels, height, width = images.shape
    rows, cols = height // patch, width // patch
    patches = images.reshape(batch, channels, rows, patch, cols, patch).permute(0, 2, 4, 3, 5, 1)
    return {
        "pixel_values": patches.reshape(batch, rows * cols, patch * patch * channels),
        "pixel_attention_mask": torch.ones(batch, rows * cols, dtype=torch.long, device=images.device),
        "spatial_shapes": torch.tensor([[rows, cols]] * batch, dtype=torch.long, device=images.device),
    }


def _patch_inputs(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor] | None:
    """NaFlex inputs for a model that reads patches (:func:`patch_grid`): two blank images of its
    position table's grid, unpadded; None for any other model."""
    grid = patch_grid(model)
    if grid is None:
        return None
    channels, patch, side = grid
    return patch_inputs(torch.zeros(2, channels, side * patch, side * patch, device=device), patch)


def _reads_images_only(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes images (``pixel_values``) and no token ids: an image
    classifier built on a multimodal config (CLIP's, SigLIP's), whose config says the text
    tower's vocabulary beside the vision tower's image size."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward with no signature to read
        return False
    return "pixel_values" in parameters and "input_ids" not in parameters


#: tokens in the inputs of a second try, for a model whose short guessed inputs leave a branch untaken
LONG_SEQUENCE = 256


def branch_inputs(model: nn.Module) -> tuple[tuple, dict] | None:
    """Inputs that take more of a language model's forward than :func:`example_inputs_for`'s, for
    a model whose guessed inputs leave a parameter unread: ``LONG_SEQUENCE`` tokens, or its
    position limit (DeepSeek-V4 compresses its keys every 128 tokens), and encoder states where
    its forward takes them (TrOCR's decoder cross-attends to an image encoder's). None for a
    model that reads no token ids."""
    args, kwargs = example_inputs_for(model, length=LONG_SEQUENCE)
    tokens = kwargs.get("input_ids")
    if tokens is None:
        return None
    parameters = inspect.signature(model.forward).parameters  # example_inputs_for read it too
    config = text_config(getattr(model, "config", None))
    width = getattr(config, "cross_attention_hidden_size", None) or getattr(config, "hidden_size", None)
    if "encoder_hidden_states" in parameters and is_count(width):
        dtype = next(model.parameters()).dtype
        kwargs["encoder_hidden_states"] = torch.zeros(
            tokens.shape[0], 4, cast(int, width), dtype=dtype, device=tokens.device
        )
    return args, kwargs


def evaluated(model: nn.Module, inputs: tuple[tuple, dict]) -> Any:
    """``model``'s output for ``inputs`` (args, kwargs), run once in eval mode without gradients
    (its dropout off, its BatchNorm statistics untouched) and its mode restored after: what the
    readers of a model's logits (its logit scale, its classes, its init's saturation) run."""
    args, kwargs = inputs
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(*args, **kwargs)
    finally:
        model.train(training)


def logits_of(output: Any) -> Any:
    """The logits in a model's ``output``: the tensor itself, an output's ``.logits``, or else its
    first field or element, transformers' main output (PP-LCNet's classifier returns its logits as
    ``last_hidden_state``; a hand-written model may return ``(logits, loss)``). Anything else is
    returned as it is, for the caller to refuse."""
    logits = getattr(output, "logits", output)
    if isinstance(logits, Mapping) and logits:
        return next(iter(logits.values()))
    if isinstance(logits, (tuple, list)) and logits:
        return logits[0]
    return logits


def normalise_inputs(model: nn.Module, example_inputs: ExampleInputs) -> tuple[tuple, dict]:
    """``example_inputs`` in any accepted form (None: guessed) as ``(args, kwargs)``."""
    if example_inputs is None:
        return example_inputs_for(model)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if (
        isinstance(example_inputs, tuple)
        and len(example_inputs) == 2
        and isinstance(example_inputs[0], (tuple, list))
        and isinstance(example_inputs[1], Mapping)
    ):
        return tuple(example_inputs[0]), dict(example_inputs[1])
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise TraceError(
        "example_inputs must be a tensor, a tuple of args, a dict of "
        f"kwargs or (args, kwargs); got {type(example_inputs).__name__}"
    )


def tensors_of(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested tuples, lists and dicts, in order (input shapes, cache keys)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors_of(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from tensors_of(v)

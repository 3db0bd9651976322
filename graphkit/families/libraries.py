"""The families a library builds by name: ``timm`` (``timm.create_model(model,
pretrained=False)``) and ``transformers`` (the causal LM of ``model_type`` at its config class's
defaults), registered beside graphkit's own so that :func:`~graphkit.families.build_model` builds
a zoo's record as it builds a recipe's. Their configs name the model and, for a mini zoo's
record, hold ``shrink``: the constructor arguments (timm) or config fields (transformers) that
make it small (:mod:`graphkit.datasets.shrink` chooses them).

A library initialises what it builds whatever ``init`` says, except on the meta device, where
there is nothing to fill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphkit.errors import ConfigError, ZooError
from graphkit.families.registry import FAMILIES, Family, get_family, register_family

#: the image side and class count a mini zoo's timm models are built with
IMAGE_SIZE = 32
NUM_CLASSES = 10

# transformers config fields by what they count, across model types: what a mini zoo's decoder
# shrinks (graphkit.datasets.shrink) and what a wide decoder's twin scales (graphkit.ghn.grow)
#: the residual stream's width
WIDTH_FIELDS = ("hidden_size", "n_embd", "d_model", "hidden_dim", "dim", "model_dim")
#: the query heads
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "swa_num_attention_heads")
#: the key/value heads
KV_HEAD_FIELDS = (
    "num_key_value_heads",
    "n_kv_heads",
    "num_kv_heads",
    "multi_query_group_num",
    "swa_num_key_value_heads",
)
#: the longest sequence a decoder's position table or cache takes (a model with none of them,
#: Mamba's or BLOOM's with ALiBi, takes any length)
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
#: a dense MLP's hidden width
MLP_FIELDS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "intermediate_dim")
#: an expert's (or a shared expert's) hidden width
EXPERT_MLP_FIELDS = ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size")


@dataclass(frozen=True)
class LibraryFamily(Family):
    """A family whose models a library builds by name: a config is ``{"family": name,
    model_key: <the library's name for the model>}``; a mini zoo's record adds ``shrink``, its
    architecture family (``zoo_family``) and what a data source shapes its batches by
    (``data_keys``). ``task`` is the input its models read (image or text)."""

    model_key: str = "model"
    task: str = "image"
    data_keys: tuple[str, ...] = ()

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config as it is, after checking it names one model and its overrides are an object.
        A zoo record's ``aliases`` (the other models of the same architecture) are names, not
        build options: accepted, so that such a record builds like any other."""
        known = {"family", self.model_key, "shrink", "zoo_family", "aliases", *self.data_keys}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(
                f"{self.name} config: unknown key {unknown[0]!r}; accepted keys: {', '.join(sorted(known))}"
            )
        if not isinstance(config.get(self.model_key), str):
            raise ConfigError(f"{self.name} config: {self.model_key} must be the {self.name} name of a model")
        if not isinstance(config.get("shrink"), (Mapping, type(None))):
            raise ConfigError(f"{self.name} config: shrink must be an object of overrides")
        aliases = config.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise ConfigError(f"{self.name} config: aliases must be a list of model names")
        return {"family": self.name, **config}


def library_family(name: str) -> LibraryFamily:
    """The library family called ``name`` (``timm``, ``transformers``: a zoo's records are built
    by one); a ConfigError names the library families otherwise."""
    family = get_family(name)
    if not isinstance(family, LibraryFamily):
        libraries = sorted(n for n, f in FAMILIES.items() if isinstance(f, LibraryFamily))
        raise ConfigError(f"family {name!r} is not a library's; library families: {', '.join(libraries)}")
    return family


def first_line(error: BaseException) -> str:
    """The first line of a library's error message, its whitespace runs made one space."""
    text = str(error).strip()
    return " ".join(text.splitlines()[0].split()) if text else "(no message)"


def _library_build(family: str, key: str, make: Callable[[str, Mapping | None, bool], nn.Module]):
    """A :class:`Family` builder for ``make(name, overrides, on_meta)``: the library's own warnings
    silenced, whatever it raises a ZooError naming the model."""

    def build(config: dict[str, Any], init: bool = True) -> nn.Module:
        name = config[key]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # libraries warn about their own defaults while building
                return make(name, config.get("shrink"), torch.get_default_device().type == "meta")
        except Exception as e:  # whatever the library raises, named with the model it was building
            raise ZooError(f"{family} cannot build {name!r}: {type(e).__name__}: {first_line(e)}") from e

    return build


def _timm(name: str, overrides: Mapping | None, on_meta: bool) -> nn.Module:
    import timm  # noqa: PLC0415 - the library, loaded when it is used

    if overrides is None:
        return timm.create_model(name, pretrained=False)
    with watched_timm(name, overrides):
        return timm.create_model(name, pretrained=False)


def _causal_lm(model_type: str, overrides: Mapping | None, on_meta: bool) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    from graphkit.compat import skip_weight_init  # noqa: PLC0415

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a reference config's own inconsistencies are not the user's
    try:
        reference = AutoConfig.for_model(model_type, **(overrides or {}))
        # a dataset's model is trained, never asked to generate: with a cache, a model called as
        # model(ids) in train mode returns one, and a linear-attention cache's own bookkeeping
        # fails (``get_seq_length`` on Qwen3-Next-like hybrids)
        reference.use_cache = False
        if overrides is not None and hasattr(reference, "rescale_every"):
            # RWKV's fp16 trick rescales its weights in place whenever it switches between train
            # and eval mode, which writes into the predicted tensors train-ghn lends a mini model
            # (an error in autograd); at 2 to 4 layers it never rescales the stream (every 6
            # layers by default), so the mini model computes the same
            reference.rescale_every = 0
        if not on_meta:
            return AutoModelForCausalLM.from_config(reference)
        with skip_weight_init():  # nothing to fill on meta; initialisation is most of a build
            model = AutoModelForCausalLM.from_config(reference)
        model.tie_weights()
        return model
    finally:
        hf_logging.set_verbosity(verbosity)


@contextlib.contextmanager
def watched_timm(variant: str, overrides: Mapping[str, Any] | None = None) -> Iterator[list[tuple[type, dict]]]:
    """For the block, every ``build_model_with_cfg`` call of timm's model modules is seen: the
    list yielded gets (model class, the arguments it is built with), and with ``overrides``,
    the call that builds ``variant`` gets them (:func:`apply_overrides`), 32-pixel images (or
    the overrides' ``img_size``, also for a class that takes no such argument) and 10 classes first."""
    import timm.models  # noqa: PLC0415 - the library, loaded when it is used
    from timm.models import _builder  # noqa: PLC0415

    original = _builder.build_model_with_cfg
    seen: list[tuple[type, dict]] = []

    def build(model_cls, name, pretrained, *args, **kwargs):
        if overrides is not None and name == variant:
            accepted = inspect.signature(model_cls).parameters
            overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
            channels, side = kwargs.get("in_chans", 3), overrides.get("img_size", IMAGE_SIZE)
            overlay.update(input_size=(channels, side, side), num_classes=NUM_CLASSES)
            kwargs["pretrained_cfg_overlay"] = overlay
            if "img_size" in accepted or "img_size" in kwargs:
                kwargs["img_size"] = side
            kwargs["num_classes"] = NUM_CLASSES
            for key, value in overrides.items():
                if key == "img_size":
                    continue
                current = kwargs.get(key, accepted[key].default if key in accepted else None)
                kwargs[key] = apply_overrides(current, value)
        seen.append((model_cls, dict(kwargs)))
        return original(model_cls, name, pretrained, *args, **kwargs)

    prefix = timm.models.__name__ + "."
    saved = [  # every model module imported its own name for the builder
        (module, original)
        for name, module in list(sys.modules.items())
        if name.startswith(prefix) and getattr(module, "build_model_with_cfg", None) is original
    ]
    for module, _ in saved:
        setattr(module, "build_model_with_cfg", build)  # a module attribute: ModuleType declares none
    try:
        yield seen
    finally:
        for module, function in saved:
            setattr(module, "build_model_with_cfg", function)


def apply_overrides(current: Any, override: Any) -> Any:
    """``override`` (JSON: lists and dicts) laid over the value it replaces: a dict rewrites a
    config dataclass's (or a dict's) fields, a list of the same length element by element, and
    a list replacing a tuple is a tuple."""
    if isinstance(override, Mapping) and dataclasses.is_dataclass(current) and not isinstance(current, type):
        return dataclasses.replace(current, **{k: apply_overrides(getattr(current, k), v) for k, v in override.items()})
    if isinstance(override, Mapping) and isinstance(current, Mapping):
        return {**current, **{k: apply_overrides(current.get(k), v) for k, v in override.items()}}
    if isinstance(override, list):
        if isinstance(current, (tuple, list)) and len(current) == len(override):
            items = [apply_overrides(c, o) for c, o in zip(current, override, strict=True)]
        else:
            items = [apply_overrides(None, o) for o in override]
        return tuple(items) if isinstance(current, tuple) else items
    return override


TIMM = register_family(
    LibraryFamily(
        name="timm",
        build=_library_build("timm", "model", _timm),
        blocks="",
        required=("model",),
        bf16=False,
        model_key="model",
        task="image",
        data_keys=("image_size", "in_chans", "num_classes"),
        # the start predict writes for what the zoo-vision checkpoint predicts (its config.json's
        # family): fine-tuned from half the prediction on its own init, zoo-vits-mini's 8 held-out
        # architectures reach 0.60 / 0.19 at 100 / 300 steps, the own init 0.69 / 0.20 and the
        # prediction alone 0.99 / 0.24, all three near 2.3 at step 0; at 224 px, which the
        # checkpoint never saw, it starts nearer the own init than the prediction alone does and
        # leads the own init after 100 steps on the 3 measured, where the prediction alone trails
        # on one by 1.3 nats (BENCHMARKS.md, "The zoo checkpoints through eval-ghn" and "The vision
        # zoo at 224 px")
        keep_init=True,
        shrink=0.5,
    )
)
TRANSFORMERS = register_family(
    LibraryFamily(
        name="transformers",
        build=_library_build("transformers", "model_type", _causal_lm),
        blocks="",
        required=("model_type",),
        bf16=False,
        model_key="model_type",
        task="text",
        data_keys=("vocab_size", "context"),
        # the start predict writes for what the zoo-decoders checkpoint predicts (its config.json's
        # family): fine-tuned from half the prediction on its own init, a held-out decoder of
        # zoo-decoders-mini beats its own init at 0, 100 and 300 steps on 100, 88 and 76% of the 17
        # measured; from the prediction alone on 100, 76 and 29% (docs/experiments.md, "The zoo's decoders")
        keep_init=True,
        shrink=0.5,
    )
)

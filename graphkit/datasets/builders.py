"""The models a dataset's records describe, built as their builders build them: a family's from
its config (:func:`graphkit.families.build_model`), a zoo's from its library (timm,
transformers) with a mini zoo's shrink applied. Below everything that reads a dataset to train
or evaluate on it (:mod:`graphkit.ghn`), and below the zoo runs that generate one
(:mod:`graphkit.datasets.zoo`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from graphkit.datasets import shrink
from graphkit.errors import ZooError

#: the ``family`` of zoo records, by library: ``build_zoo_model`` reads them
ZOO_FAMILIES = ("timm", "transformers")


def build_zoo_model(config: Mapping[str, Any], device: str | torch.device = "meta") -> nn.Module:
    """The model a zoo record's ``config`` names, on ``device`` (weights as the library
    initialises them; on meta none are allocated): ``timm.create_model(model,
    pretrained=False)``, or transformers' causal LM of ``model_type`` at its config class's
    defaults. A mini zoo's config also holds ``shrink``: the constructor arguments (timm) or
    config fields (transformers) that make it small (:mod:`graphkit.datasets.shrink`). Raises
    :class:`ZooError` naming the model when its library cannot build it."""
    family = config.get("family")
    name = config.get("model") if family == "timm" else config.get("model_type")
    overrides = config.get("shrink")
    if family not in ZOO_FAMILIES or not isinstance(name, str) or not isinstance(overrides, (dict, type(None))):
        raise ZooError(
            f"not a zoo config: {dict(config)!r}; zoo configs name a timm model or a transformers model_type"
            " (and a mini zoo's, its shrink overrides as an object)"
        )
    try:
        with warnings.catch_warnings(), torch.device(device):
            warnings.simplefilter("ignore")  # libraries warn about their own defaults while building
            if family == "timm":
                import timm  # noqa: PLC0415

                if overrides is None:
                    return timm.create_model(name, pretrained=False).eval()
                with shrink.watched_timm(name, overrides):
                    return timm.create_model(name, pretrained=False).eval()
            from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415
            from transformers.utils import logging as hf_logging  # noqa: PLC0415

            from graphkit.compat import skip_weight_init  # noqa: PLC0415

            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # a reference config's own inconsistencies are not the user's
            try:
                reference = AutoConfig.for_model(name, **(overrides or {}))
                # a dataset's model is trained, never asked to generate: with a cache, a model
                # called as model(ids) in train mode returns one, and a linear-attention cache's
                # own bookkeeping fails (``get_seq_length`` on Qwen3-Next-like hybrids)
                reference.use_cache = False
                if overrides is not None and hasattr(reference, "rescale_every"):
                    # RWKV's fp16 trick rescales its weights in place whenever it switches between
                    # train and eval mode, which writes into the predicted tensors train-ghn lends
                    # a mini model (an error in autograd); at 2 to 4 layers it never rescales the
                    # stream (every 6 layers by default), so the mini model computes the same
                    reference.rescale_every = 0
                if str(device) != "meta":
                    return AutoModelForCausalLM.from_config(reference).eval()
                with skip_weight_init():  # nothing to fill on meta; initialisation is most of a build
                    model = AutoModelForCausalLM.from_config(reference)
                model.tie_weights()
                return model.eval()
            finally:
                hf_logging.set_verbosity(verbosity)
    except Exception as e:  # whatever the library raises, named with the model it was building
        raise ZooError(f"{family} cannot build {name!r}: {type(e).__name__}: {first_line(e)}") from e


def first_line(error: BaseException) -> str:
    """The first line of a library's error message, its whitespace runs made one space."""
    text = str(error).strip()
    return " ".join(text.splitlines()[0].split()) if text else "(no message)"


def build_record_model(config: dict[str, Any], device: str = "meta", init: bool = True):
    """The nn.Module a record's ``config`` describes, on ``device``, initialised as its builder
    does: a family's model from its config, or a zoo's from its library (timm, transformers),
    so that what trains and evaluates on a dataset takes a mini zoo's records as a recipe's.
    ``init=False`` skips a family's initialisation (a shell whose parameters are replaced); a
    zoo's library initialises its model whatever ``init`` says."""
    from graphkit.families import build_model  # noqa: PLC0415 (browsing a dataset needs no model)

    if config.get("family") in ZOO_FAMILIES:
        return build_zoo_model(config, device=device)
    return build_model(config, device=device, init=init)

"""The family registry: :class:`Family` (everything graphkit knows about one family of models),
:data:`FAMILIES` and the functions that build and read configs through it.

It imports no family: each family's file (``gpt2.py``, ``llama.py``, ``vit.py``) imports this
module and registers itself, and ``graphkit.families`` imports them all.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from graphkit.attention.adapter import AttentionAdapter, register_adapter
from graphkit.attention.convert import convert
from graphkit.attention.core import ATTENTION_VARIANTS
from graphkit.compat import skip_weight_init
from graphkit.errors import ConfigError
from graphkit.graph import ArchGraph
from graphkit.validation import is_count, is_number


@dataclass(frozen=True)
class Family:
    """How to build one family: the keys it requires, defaults for the rest, and a builder
    ``build(config, init)``; ``init=False`` (on meta) skips weight initialisation, which has
    nothing to fill there and costs most of a build."""

    name: str
    build: Callable[[dict[str, Any], bool], nn.Module]
    blocks: str  # path of the stack of ``num_layers`` identical blocks, e.g. "transformer.h" ("" for a library's)
    required: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # keys a config may carry but need not, each checked against the type of its value here and,
    # unlike a default, left out of the resolved config when absent: a variant of the family's
    # models that only some configs describe (timm's ViT variants: graphkit.families.vit.OPTIONS)
    options: Mapping[str, Any] = field(default_factory=dict)
    # options a model computes its config without when its parameters are converted from that
    # config's model's, each with how predict names the plain model and the conversion: layer scale
    # with its gains at 1 (graphkit.families.equivalents.plain_form: predicted as that plain model)
    plain: Mapping[str, tuple[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]]] = field(
        default_factory=dict
    )
    check: Callable[[dict[str, Any]], None] | None = None
    mlp_ratio: float = 4.0  # ``mlp`` defaults to mlp_ratio * hidden
    from_graph: Callable[[ArchGraph], dict[str, Any]] | None = None  # the config a traced graph came from
    traced_as: tuple[str, ...] = ()  # graph.meta["family"] values this family's models trace as
    grouped: bool = False  # the family computes GQA from kv_heads itself (without ``attention``)
    recipes: tuple[Mapping[str, Any], ...] = ()  # dataset recipes over it, as data (graphkit.datasets.recipes)
    data: str | None = None  # the hypernetwork's default data source for it (graphkit.training.data)
    bundled_ghn: str | None = None  # the bundled hypernetwork checkpoint (graphkit/ghn/pretrained/<name>)
    # its own init scales the weights that write each residual branch by 1 / sqrt(branches)
    # (GPT-2's 1 / sqrt(2 n_layer)); predicted parameters follow it (graphkit.ghn.predict)
    scaled_residuals: bool = False
    # a prediction is added onto the model's own init by default (graphkit.ghn.keep_init), for a
    # checkpoint trained on the family (its config.json's "family"), else for the family's models;
    # measured per family in docs/experiments.md ("keep_init")
    keep_init: bool = False
    # the factor a prediction kept on the init is added with by default, W0 + shrink * P (shrink
    # and perturb: graphkit.ghn.keep_init); measured in docs/experiments.md ("Where the head start goes")
    shrink: float = 1.0
    attention_adapter: AttentionAdapter | None = None  # how GQA, MLA and the HF export handle its attention
    # its models train in bf16 under train-ghn's autocast; a library's models (timm's,
    # transformers') keep float32 buffers and arithmetic of their own that a bf16 parameter fails
    bf16: bool = True

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The full config: defaults filled in, every key known, required keys present, the
        options given checked."""
        known = {"family", "mlp", "attention", "kv_heads", *self.required, *self.defaults, *self.options}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(
                f"{self.name} config: unknown key {unknown[0]!r}; accepted keys: {', '.join(sorted(known))}"
            )
        missing = [k for k in self.required if k not in config]
        if missing:
            raise ConfigError(f"{self.name} config: missing key {missing[0]!r}")
        full = {"family": self.name, "mlp": None, "attention": None, "kv_heads": None, **self.defaults, **config}
        for key in ("num_layers", "hidden", "heads"):
            self._check_value(key, full[key], 1)
        if full["mlp"] is None:
            full["mlp"] = int(self.mlp_ratio * full["hidden"])
        # a value is checked against its default's type, an option given against its own
        given = {key: kind for key, kind in self.options.items() if key in full}
        for key, default in {"kv_heads": None, "mlp": 1, **self.defaults, **given}.items():
            self._check_value(key, full[key], default)
        if full["hidden"] % full["heads"]:
            raise ConfigError(f"{self.name} config: hidden {full['hidden']} is not divisible by heads {full['heads']}")
        if full["attention"] is not None and full["attention"] not in ATTENTION_VARIANTS:
            raise ConfigError(
                f"{self.name} config: unknown attention {full['attention']!r}; "
                f"accepted: none (the family's own), {', '.join(ATTENTION_VARIANTS)}"
            )
        if full["kv_heads"] is not None and full["attention"] is None and not self.grouped:
            raise ConfigError(
                f"{self.name} config: kv_heads needs an attention variant "
                f"({', '.join(ATTENTION_VARIANTS)}); {self.name} models are MHA"
            )
        if full["kv_heads"] is not None and full["heads"] % full["kv_heads"]:
            raise ConfigError(
                f"{self.name} config: heads {full['heads']} is not divisible by kv_heads {full['kv_heads']}"
            )
        if self.check is not None:
            self.check(full)
        return full

    def _check_value(self, key: str, value: Any, default: Any) -> None:
        """One config value has the type its default has: true/false for a flag, an integer >= 1
        for a size or count (``mlp`` is the MLP's width, not a ratio), a finite number > 0 for
        a float such as ``rms_eps``, a string, or null or an integer >= 1 where the default is
        null (``kv_heads``, ``sliding_window``). A bad value is refused here, in one line,
        before a library's own check stops with its own words (or, worse, accepts it)."""
        if isinstance(default, bool):
            ok, accepted = isinstance(value, bool), "true or false"
        elif isinstance(default, float):
            ok = is_number(value) and value > 0
            accepted = "a finite number > 0"
        elif isinstance(default, str):
            ok, accepted = isinstance(value, str), "a string"
        else:  # a size or a count; null where the default is null
            ok = (value is None and default is None) or is_count(value)
            accepted = "null or an integer >= 1" if default is None else "an integer >= 1"
            if key == "mlp" and isinstance(value, float):
                accepted += " (the MLP's hidden width in units, not a ratio: a 4x MLP is mlp = 4 * hidden)"
        if not ok:
            raise ConfigError(f"{self.name} config: {key} must be {accepted}; got {value!r}")


FAMILIES: dict[str, Family] = {}


def build_hf(model_class: Any, config: Any, init: bool) -> nn.Module:  # a PreTrainedModel subclass
    """A Hugging Face model, skipping weight initialisation unless ``init``; transformers'
    ``no_init_weights`` also skips tying the LM head to the embedding, so ties are redone."""
    if init:
        return model_class(config)

    with skip_weight_init():
        model = model_class(config)
    model.tie_weights()
    return model


def register_family(family: Family) -> Family:
    """Add a family to :data:`FAMILIES` (``build_model``, recipes and the hypernetwork find it
    there) and its attention adapter to every conversion's (:func:`graphkit.attention.adapter.register_adapter`).
    ConfigError, with nothing registered, for a ``shrink`` outside (0, 1]: ``predict`` divides by it."""
    if not is_number(family.shrink) or not 0 < family.shrink <= 1:
        raise ConfigError(
            f"family {family.name!r}: shrink must be a number above 0 and at most 1; got {family.shrink!r}"
        )
    FAMILIES[family.name] = family
    if family.attention_adapter is not None:
        register_adapter(family.attention_adapter)
    return family


class LiveTable(Mapping[str, Any]):
    """A read-only mapping recomputed from :data:`FAMILIES` at every access (subclasses say
    how), so a family registered later appears in it at once."""

    def _items(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items()!r})"


class FamilyTable(LiveTable):
    """One field of every registered family that sets it, by family name (``BUNDLED``,
    ``DEFAULT_SOURCES``)."""

    def __init__(self, field_name: str) -> None:
        self.field_name = field_name

    def _items(self) -> dict[str, Any]:
        return {name: value for name, f in FAMILIES.items() if (value := getattr(f, self.field_name)) is not None}


def get_family(name: str) -> Family:
    """The family called ``name``; a ConfigError lists the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown family {name!r}; known families: {', '.join(sorted(FAMILIES))}") from None


def resolve_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its family's defaults filled in, after checking every key and value."""
    if "family" not in config:
        raise ConfigError(f"config has no 'family' key; known families: {', '.join(sorted(FAMILIES))}")
    return get_family(config["family"]).resolve(config)


def traced_family(graph: ArchGraph) -> Family | None:
    """The ``Family`` the model behind ``graph`` belongs to: the one whose ``traced_as`` lists the
    name it traced as (``graph.meta["family"]``: a Mistral traces as ``mistral``, which the llama
    family lists), else the family of that name; None for a model of no graphkit family (a timm
    module, a transformers model type). The one place a graph's family is looked up, so that a
    config read back (:func:`config_from_graph`) and a default of the family agree."""
    traced = str(graph.meta.get("family"))
    listed = (family for family in FAMILIES.values() if traced in family.traced_as)
    return next(listed, None) or FAMILIES.get(traced)


def family_default(graph: ArchGraph, flag: str, choice: bool | None = None) -> bool:
    """``choice`` when the caller made one, else the boolean field ``flag`` of the ``Family``
    ``graph`` was traced from (:func:`traced_family`); False for a model of no graphkit
    family. A per-family default of ``predict`` that is the model's own is read this way
    (``scaled_residuals``: how its init scales residual branches); the start's defaults
    (``keep_init``, ``shrink``) follow the checkpoint's family first
    (:func:`graphkit.ghn.keep_init.start_family`)."""
    if choice is not None:
        return choice
    family = traced_family(graph)
    return bool(getattr(family, flag)) if family is not None else False


def config_from_graph(graph: ArchGraph) -> dict[str, Any]:
    """The resolved config of the model a graph was traced from (graphs of graphkit's families);
    ConfigError if no family reads it."""
    traced = graph.meta.get("family")
    family = traced_family(graph)
    if family is not None and family.from_graph is not None:
        try:
            return resolve_config(family.from_graph(graph))
        except (KeyError, StopIteration, IndexError) as e:
            raise ConfigError(f"graph of family {traced!r} lacks what a {family.name} config needs ({e})") from e
    readable = sorted(t for f in FAMILIES.values() for t in f.traced_as)
    raise ConfigError(
        f"cannot read a config from a graph of family {traced!r}; readable families: {', '.join(readable)}"
    )


def build_model(config: Mapping[str, Any], device: str | torch.device = "meta", init: bool | None = None) -> nn.Module:
    """Build the model a config describes, in eval mode, on ``device`` (``meta`` allocates no
    weights; any other device gets the library's own initialisation unless ``init=False``, which
    leaves parameters uninitialised for a caller that fills them). ``attention`` (gqa, kdgqa,
    dgqa, pgqa) converts the attention to that variant with ``kv_heads`` K/V heads."""
    full = resolve_config(config)
    device = torch.device(device)
    with torch.device(device):
        model = get_family(full["family"]).build(full, device.type != "meta" if init is None else init)
        if full.get("attention") is not None:  # GQA or a key-driven variant, K/V mean-pooled
            convert(model, full["attention"], full["kv_heads"] or full["heads"])
    return model.eval()


def num_params(config: Mapping[str, Any]) -> int:
    """Parameter count of the model a config describes (tied weights once).

    graphkit's families stack ``num_layers`` identical blocks, so the count is linear in depth:
    it is read off one cached meta build with a single block, so sweeping a search space costs
    one build per width configuration rather than one per config. A family without ``blocks``
    (a library's) is counted on one meta build of the whole model."""
    full = resolve_config(config)
    if not get_family(full["family"]).blocks:
        return sum(p.numel() for p in build_model(full, "meta").parameters())
    base, block = _base_and_block(json.dumps({k: v for k, v in full.items() if k != "num_layers"}, sort_keys=True))
    return base + full["num_layers"] * block


@functools.lru_cache(maxsize=4096)
def _base_and_block(key: str) -> tuple[int, int]:
    config = {**json.loads(key), "num_layers": 1}
    model = build_model(config, "meta")
    total = sum(p.numel() for p in model.parameters())
    blocks = cast(nn.ModuleList, model.get_submodule(get_family(config["family"]).blocks))
    block = sum(p.numel() for p in blocks[0].parameters())
    return total - block, block


__all__ = [
    "FAMILIES",
    "Family",
    "FamilyTable",
    "LiveTable",
    "ConfigError",
    "build_model",
    "family_default",
    "resolve_config",
    "num_params",
    "register_family",
    "get_family",
    "config_from_graph",
]

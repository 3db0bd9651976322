"""Search spaces of graph datasets, declared as data.

A :class:`Recipe` says which family, which depth bins (deeper means narrower, as in LoGAH's
ViTs-1K and GPTs-1K), which head counts, which fixed settings and what parameter cap; it can
be written as a JSON or YAML file, so a new search space needs no code:

    {"name": "tiny-vits", "family": "vit", "max_params": 2000000,
     "bins": [{"layers": [2, 4], "hidden": [64, 128, 32]}],
     "heads": [{"choices": [2, 4]}], "fixed": {"image_size": 32, "patch_size": 4}}

Sampling (:meth:`Recipe.sample`) draws architectures without replacement until the space is
used up, then starts another pass, so every architecture appears before any repeats; the
train / eval split is drawn over architectures, not records, so eval architectures are never
seen in training.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from graphkit.errors import GraphkitError
from graphkit.families import ConfigError, LiveTable, get_family, num_params, resolve_config


class RecipeError(GraphkitError):
    """A recipe is unknown, malformed or describes an empty space."""


@dataclass(frozen=True)
class Bin:
    """Depths ``layers = (low, high)`` (inclusive) take widths ``hidden = (low, high, step)``."""

    layers: tuple[int, int]
    hidden: tuple[int, int, int]


@dataclass(frozen=True)
class HeadRule:
    """Head counts for the widths in ``hidden`` (every width when empty). ``choices`` lists
    counts, or is ``"divisors"`` for every divisor of the width with heads of at least
    ``min_head_dim`` channels. Counts that do not divide the width are skipped."""

    choices: tuple[int, ...] | str
    hidden: tuple[int, ...] = ()
    min_head_dim: int = 1


@dataclass(frozen=True)
class Recipe:
    """A declarative search space (see the module docstring)."""

    name: str
    family: str
    bins: tuple[Bin, ...]
    heads: tuple[HeadRule, ...]
    max_params: int
    fixed: Mapping[str, Any] = field(default_factory=dict)
    kv_heads: str | None = None  # "divisors": every divisor of the head count (MHA, GQA, MQA)
    sliding_window: tuple[int | None, ...] = (None,)
    attention: tuple[str | None, ...] = (None,)  # None: the family's own; or gqa, kdgqa, dgqa, pgqa
    eval_fraction: float = 0.1
    num: int = 1000
    description: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """Build from plain data (a parsed JSON / YAML file); errors name the bad key."""
        try:
            fields = dict(data)
            fields["bins"] = tuple(Bin(layers=tuple(b["layers"]), hidden=tuple(b["hidden"])) for b in fields["bins"])
            fields["heads"] = tuple(
                HeadRule(choices=h["choices"] if isinstance(h["choices"], str) else tuple(h["choices"]),
                         hidden=tuple(h.get("hidden", ())), min_head_dim=h.get("min_head_dim", 1))
                for h in fields["heads"]
            )
            for key in ("sliding_window", "attention"):
                if key in fields:
                    fields[key] = tuple(fields[key])
            recipe = cls(**fields)
        except (KeyError, TypeError, ValueError) as e:
            raise RecipeError(f"recipe {data.get('name', '?')!r}: malformed ({type(e).__name__}: {e})") from e
        get_family(recipe.family)
        return recipe

    @classmethod
    def from_file(cls, path: str | Path) -> Recipe:
        """Read a recipe from a .json or .yaml file."""
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"{path}: no such recipe file")
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(path.read_text())
            else:
                data = json.loads(path.read_text())
        except Exception as e:
            raise RecipeError(f"{path}: cannot parse ({' '.join(str(e).split())})") from e
        if not isinstance(data, Mapping):
            raise RecipeError(f"{path}: a recipe must be a mapping of keys to values")
        return cls.from_dict(data)

    def with_attention(self, variant: str) -> Recipe:
        """This search space with every model converted to ``variant`` (gqa, kdgqa, dgqa, pgqa),
        its K/V heads drawn from the divisors of the head count; "mha" leaves it as it is."""
        if variant == "mha":
            return self
        return replace(self, name=f"{self.name}-{variant}", attention=(variant,), kv_heads="divisors",
                       description=f"{self.description} ({variant} attention)")

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the inverse of :meth:`from_dict` (stored in each dataset's manifest)."""
        return json.loads(json.dumps(asdict(self)))

    # -- the space ---------------------------------------------------------------------------
    def _head_choices(self, hidden: int) -> list[int]:
        rule = next((r for r in self.heads if not r.hidden or hidden in r.hidden), None)
        if rule is None:
            return []
        if rule.choices == "divisors":
            counts = [h for h in range(1, hidden + 1) if hidden % h == 0]
        else:
            counts = list(rule.choices)
        return [h for h in counts if hidden % h == 0 and hidden // h >= rule.min_head_dim]

    def _kv_choices(self, heads: int, attention: str | None) -> list[int | None]:
        if self.kv_heads == "divisors" and (attention is not None or get_family(self.family).grouped):
            return [k for k in range(1, heads + 1) if heads % k == 0]
        return [None]

    @cached_property
    def space(self) -> list[dict[str, Any]]:
        """Every architecture of the recipe under its parameter cap, as resolved family configs,
        in a fixed order."""
        configs = []
        for b in self.bins:
            low, high, step = b.hidden
            for layers in range(b.layers[0], b.layers[1] + 1):
                for hidden in range(low, high + 1, step):
                    for heads in self._head_choices(hidden):
                        for attention in self.attention:
                            for kv in self._kv_choices(heads, attention):
                                for window in self.sliding_window:
                                    config = {"family": self.family, "num_layers": layers, "hidden": hidden,
                                              "heads": heads, "attention": attention, "kv_heads": kv, **self.fixed}
                                    if window is not None:
                                        config["sliding_window"] = window
                                    try:
                                        full = resolve_config(config)
                                    except ConfigError as e:
                                        raise RecipeError(f"recipe {self.name!r}: {e}") from e
                                    if num_params(full) <= self.max_params:
                                        configs.append(full)
        if not configs:
            raise RecipeError(f"recipe {self.name!r}: no architecture fits its bins, heads and max_params {self.max_params:,}")
        return configs

    def sample(self, num: int | None = None, seed: int = 0) -> list[tuple[str, dict[str, Any], str]]:
        """``num`` records ``(id, config, split)``, deterministic in ``seed``: passes over a
        shuffled space (all architectures before any repeats), with ``eval_fraction`` of the
        architectures (at least one) held out as the eval split."""
        num = self.num if num is None else num
        if num < 1:
            raise RecipeError(f"recipe {self.name!r}: num must be at least 1, got {num}")
        space = self.space
        rng = random.Random(f"{self.name}:{seed}")
        held_out = rng.sample(range(len(space)), max(1, math.floor(self.eval_fraction * len(space) + 0.5)))
        held_out_set = set(held_out)
        order: list[int] = []
        while len(order) < num:
            lap = list(range(len(space)))
            rng.shuffle(lap)
            order.extend(lap)
        width = max(5, len(str(num - 1)))
        return [(f"{self.name}-{i:0{width}d}", space[a], "eval" if a in held_out_set else "train")
                for i, a in enumerate(order[:num])]


class RecipeTable(LiveTable):
    """The built-in recipes by name: those every registered family declares
    (``Family.recipes``), read live, each built once."""

    def __init__(self) -> None:
        self._built: dict[int, Recipe] = {}

    def _items(self) -> dict[str, Recipe]:
        from graphkit.families import FAMILIES

        recipes = {}
        for family in FAMILIES.values():
            for data in family.recipes:
                if id(data) not in self._built:
                    self._built[id(data)] = Recipe.from_dict(data)
                recipes[self._built[id(data)].name] = self._built[id(data)]
        return recipes


RECIPES = RecipeTable()


def get_recipe(name_or_path: str | Path | Recipe) -> Recipe:
    """A built-in recipe by name, or one read from a .json / .yaml file; errors list the known names."""
    if isinstance(name_or_path, Recipe):
        return name_or_path
    text = str(name_or_path)
    if text in RECIPES:
        return RECIPES[text]
    if text.endswith((".json", ".yaml", ".yml")):
        return Recipe.from_file(text)
    raise RecipeError(f"unknown recipe {text!r}; known recipes: {', '.join(RECIPES)} (or a .json / .yaml recipe file)")


__all__ = ["Recipe", "Bin", "HeadRule", "RECIPES", "RecipeTable", "get_recipe", "RecipeError"]

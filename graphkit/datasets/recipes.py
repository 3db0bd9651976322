"""Search spaces of graph datasets, declared as data.

A :class:`Recipe` says which family, which depth bins (deeper means narrower, as in LoGAH's
ViTs-1K and GPTs-1K), which head counts, which fixed settings, which other config keys take
several values (``choices``, each multiplying the space) and what parameter cap; it can be
written as a JSON or YAML file, so a new search space needs no code:

    {"name": "tiny-vits", "family": "vit", "max_params": 2000000,
     "bins": [{"layers": [2, 4], "hidden": [64, 128, 32]}],
     "heads": [{"choices": [2, 4]}], "fixed": {"image_size": 32},
     "choices": {"patch_size": [2, 4]}}

Sampling (:meth:`Recipe.sample`) draws architectures without replacement until the space is
used up, then starts another pass, so every architecture appears before any repeats; the
train / eval split is drawn over architectures, not records, so eval architectures are never
seen in training.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn, cast

import yaml

from graphkit.attention.core import ATTENTION_VARIANTS
from graphkit.errors import RecipeError
from graphkit.families import FAMILIES, ConfigError, LiveTable, get_family, num_params, resolve_config
from graphkit.validation import divisors, is_count, is_number

#: a name becomes the default output folder, so it is an identifier, never a path
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: hidden sizes above this are typos (GPT-3 uses 12,288); it bounds the divisor search too
MAX_HIDDEN = 1_000_000
#: architectures enumerated before the parameter cap: a space past this is a typo, not a plan
MAX_CANDIDATES = 10_000
#: records one recipe draws: the record list is held in memory
MAX_RECORDS = 1_000_000
#: config keys the recipe's own fields draw (bins, heads, attention, kv_heads, sliding_window)
DRAWN_KEYS = ("family", "num_layers", "hidden", "heads", "attention", "kv_heads", "sliding_window")


def _is_setting(value: Any) -> bool:
    """A fixed config value: no family setting is negative, NaN or infinite."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return is_number(value) and value >= 0
    return value is None or isinstance(value, bool | str)


def _is_choice_list(values: Any) -> bool:
    """A non-empty list of distinct fixed config values."""
    return (
        isinstance(values, tuple)
        and bool(values)
        and all(map(_is_setting, values))
        and len({json.dumps(v) for v in values}) == len(values)
    )


def _as_tuple(value: Any) -> Any:
    """JSON / YAML lists as tuples; anything else as it is, for validation to name."""
    return tuple(value) if isinstance(value, list | tuple) else value


def _entries(recipe: str, key: str, value: Any, cls: type, required: tuple[str, ...]) -> tuple[Any, ...]:
    """The mappings of the list field ``key`` as ``cls`` instances, each key checked."""
    accepted = [f.name for f in fields(cls)]
    if not isinstance(value, list | tuple) or not value:
        raise RecipeError(
            f"recipe {recipe!r}: {key} must be a non-empty list of "
            f"mappings with keys {', '.join(accepted)}; got {value!r}"
        )
    built = []
    for i, entry in enumerate(value):
        where = f"recipe {recipe!r}: {key}[{i}]"
        if not isinstance(entry, Mapping):
            raise RecipeError(f"{where} must be a mapping with keys {', '.join(accepted)}; got {entry!r}")
        _check_keys(where, entry, accepted, required)
        built.append(cls(**{k: _as_tuple(v) for k, v in entry.items()}))
    return tuple(built)


def _check_keys(where: str, data: Mapping[str, Any], accepted: list[str], required: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in set(data) - set(accepted))
    if unknown:
        raise RecipeError(f"{where}: unknown field {unknown[0]!r}; accepted fields: {', '.join(accepted)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise RecipeError(f"{where}: missing field {missing[0]!r}")


@dataclass(frozen=True)
class Bin:
    """Depths ``layers = (low, high)`` (inclusive) take widths ``hidden = (low, high, step)``."""

    layers: tuple[int, int]
    hidden: tuple[int, int, int]

    def problem(self) -> str | None:
        """What is wrong with this bin, as ``field must be ...``; None when it is sound."""
        layers, hidden = self.layers, self.hidden
        if not (
            isinstance(layers, tuple) and len(layers) == 2 and all(map(is_count, layers)) and layers[0] <= layers[1]
        ):
            return f"layers must be a list (low, high) of integers with 1 <= low <= high; got {layers!r}"
        if not (
            isinstance(hidden, tuple)
            and len(hidden) == 3
            and all(is_count(h, 1, MAX_HIDDEN) for h in hidden)
            and hidden[0] <= hidden[1]
        ):
            return (
                f"hidden must be a list (low, high, step) of integers with 1 <= low <= high <= {MAX_HIDDEN:,} "
                f"and step >= 1; got {hidden!r}"
            )
        return None

    @property
    def widths(self) -> tuple[int, int, int]:
        """The hidden sizes as ``range`` arguments."""
        low, high, step = self.hidden
        return low, high + 1, step

    @property
    def pairs(self) -> int:
        """How many (layers, hidden) pairs the bin spans."""
        return (self.layers[1] - self.layers[0] + 1) * len(range(*self.widths))


@dataclass(frozen=True)
class HeadRule:
    """Head counts for the widths in ``hidden`` (every width when empty). ``choices`` lists
    counts, or is ``"divisors"`` for every divisor of the width with heads of at least
    ``min_head_dim`` channels. Counts that do not divide the width are skipped."""

    choices: tuple[int, ...] | str
    hidden: tuple[int, ...] = ()
    min_head_dim: int = 1

    def problem(self) -> str | None:
        """What is wrong with this rule, as ``field must be ...``; None when it is sound."""
        if self.choices != "divisors" and not (
            isinstance(self.choices, tuple) and self.choices and all(map(is_count, self.choices))
        ):
            return f'choices must be "divisors" or a non-empty list of integers >= 1; got {self.choices!r}'
        if not (isinstance(self.hidden, tuple) and all(map(is_count, self.hidden))):
            return f"hidden must be a list of integers >= 1 (empty: every width); got {self.hidden!r}"
        if not is_count(self.min_head_dim):
            return f"min_head_dim must be an integer >= 1; got {self.min_head_dim!r}"
        return None


@dataclass(frozen=True)
class Recipe:
    """A declarative search space (see the module docstring). Every field is checked when the
    recipe is made, so a bad one is a one-line RecipeError naming the field and what it
    accepts, before any folder is touched."""

    name: str
    family: str
    bins: tuple[Bin, ...]
    heads: tuple[HeadRule, ...]
    max_params: int
    fixed: Mapping[str, Any] = field(default_factory=dict)
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # key -> values; each multiplies the space
    kv_heads: str | None = None  # "divisors": every divisor of the head count (MHA, GQA, MQA)
    sliding_window: tuple[int | None, ...] = (None,)
    attention: tuple[str | None, ...] = (None,)  # None: the family's own; or gqa, kdgqa, dgqa, pgqa
    eval_fraction: float = 0.1
    num: int = 1000
    description: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and NAME_PATTERN.fullmatch(self.name) and ".." not in self.name):
            raise RecipeError(
                "recipe name must be an identifier of at most 100 letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, without '..' (it names the output folder); got {self.name!r}"
            )
        if not isinstance(self.family, str):
            self._refuse("family", "a family name", self.family)
        try:
            get_family(self.family)
        except ConfigError as e:
            raise RecipeError(f"recipe {self.name!r}: family: {e}") from None
        drawn: tuple[tuple[str, tuple[Bin | HeadRule, ...]], ...] = (("bins", self.bins), ("heads", self.heads))
        for key, entries in drawn:
            if not isinstance(entries, tuple) or not entries:
                self._refuse(key, "a non-empty list", entries)
            for i, entry in enumerate(entries):
                problem = entry.problem()
                if problem:
                    raise RecipeError(f"recipe {self.name!r}: {key}[{i}].{problem}")

        checks = [
            ("max_params", is_count(self.max_params), "an integer >= 1"),
            (
                "fixed",
                isinstance(self.fixed, Mapping)
                and all(isinstance(k, str) and _is_setting(v) for k, v in self.fixed.items()),
                "a mapping of config keys to null, true/false, strings or finite numbers >= 0",
            ),
            (
                "choices",
                isinstance(self.choices, Mapping)
                and all(isinstance(k, str) and _is_choice_list(v) for k, v in self.choices.items()),
                "a mapping of config keys to non-empty lists of distinct "
                "null, true/false, strings or finite numbers >= 0",
            ),
            ("kv_heads", self.kv_heads in (None, "divisors"), 'null or "divisors"'),
            (
                "sliding_window",
                isinstance(self.sliding_window, tuple)
                and self.sliding_window
                and all(w is None or is_count(w) for w in self.sliding_window),
                "a non-empty list of null or integers >= 1",
            ),
            (
                "attention",
                isinstance(self.attention, tuple)
                and self.attention
                and all(a is None or a in ATTENTION_VARIANTS for a in self.attention),
                f"a non-empty list of null or {', '.join(ATTENTION_VARIANTS)}",
            ),
            (
                "eval_fraction",
                isinstance(self.eval_fraction, int | float)
                and not isinstance(self.eval_fraction, bool)
                and 0 <= self.eval_fraction < 1,
                "a number in [0, 1)",
            ),
            ("num", is_count(self.num, 1, MAX_RECORDS), f"an integer in 1..{MAX_RECORDS:,}"),
            ("description", isinstance(self.description, str), "a string"),
        ]
        for key, ok, accepted in checks:
            if not ok:
                self._refuse(key, accepted, getattr(self, key))
        for key in self.choices:
            if key in self.fixed:
                raise RecipeError(
                    f"recipe {self.name!r}: choices key {key!r} is also "
                    "in fixed; a config key is either fixed or chosen"
                )
            if key in DRAWN_KEYS:
                raise RecipeError(
                    f"recipe {self.name!r}: choices key {key!r} is drawn by the recipe's own fields; "
                    f"choices takes the family's other config keys (not {', '.join(DRAWN_KEYS)})"
                )
        pairs = sum(b.pairs for b in self.bins)
        if pairs > MAX_CANDIDATES:
            raise RecipeError(
                f"recipe {self.name!r}: bins span {pairs:,} (layers, hidden) pairs, more than the "
                f"{MAX_CANDIDATES:,} a space may enumerate; use larger hidden steps or fewer layers"
            )

    def _refuse(self, key: str, accepted: str, value: Any) -> NoReturn:
        raise RecipeError(f"recipe {self.name!r}: {key} must be {accepted}; got {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """Build from plain data (a parsed JSON / YAML file); errors name the bad field and what
        it accepts."""
        name = data.get("name", "?")
        _check_keys(
            f"recipe {name!r}", data, [f.name for f in fields(cls)], ("name", "family", "bins", "heads", "max_params")
        )
        values = {key: _as_tuple(value) for key, value in data.items()}
        values["bins"] = _entries(name, "bins", data["bins"], Bin, ("layers", "hidden"))
        values["heads"] = _entries(name, "heads", data["heads"], HeadRule, ("choices",))
        if isinstance(data.get("choices"), Mapping):
            values["choices"] = {key: _as_tuple(options) for key, options in data["choices"].items()}
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> Recipe:
        """Read a recipe from a .json or .yaml file."""
        path = Path(path)
        if not path.is_file():
            raise RecipeError(f"{path}: no such recipe file")
        try:
            if path.suffix in (".yaml", ".yml"):
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
        return replace(
            self,
            name=f"{self.name}-{variant}",
            attention=(variant,),
            kv_heads="divisors",
            description=f"{self.description} ({variant} attention)",
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the inverse of :meth:`from_dict` (stored in each dataset's manifest).
        ``choices`` is left out when empty, so a recipe without any reads exactly as it did
        before the field existed and the datasets made then can still be resumed."""
        data = json.loads(json.dumps(asdict(self)))
        if not data["choices"]:
            del data["choices"]
        return data

    # -- the space ---------------------------------------------------------------------------
    def _head_choices(self, hidden: int) -> list[int]:
        rule = next((r for r in self.heads if not r.hidden or hidden in r.hidden), None)
        if rule is None:
            return []
        if rule.choices == "divisors":
            counts = divisors(hidden)
        else:
            counts = list(cast(tuple[int, ...], rule.choices))  # not "divisors": the counts themselves
        return [h for h in counts if hidden % h == 0 and hidden // h >= rule.min_head_dim]

    def _kv_choices(self, heads: int, attention: str | None) -> list[int | None]:
        if self.kv_heads == "divisors" and (attention is not None or get_family(self.family).grouped):
            return list[int | None](divisors(heads))
        return [None]

    def _width_settings(self, hidden: int) -> list[tuple[int, str | None, int | None, int | None]]:
        """The (heads, attention, kv_heads, sliding_window) settings one width takes."""
        return [
            (heads, attention, kv, window)
            for heads in self._head_choices(hidden)
            for attention in self.attention
            for kv in self._kv_choices(heads, attention)
            for window in self.sliding_window
        ]

    def _chosen(self) -> list[dict[str, Any]]:
        """Every combination of the ``choices`` values, in the recipe's order ([{}] without any)."""
        return [dict(zip(self.choices, values, strict=True)) for values in itertools.product(*self.choices.values())]

    @cached_property
    def space(self) -> list[dict[str, Any]]:
        """Every architecture of the recipe under its parameter cap, as resolved family configs,
        in a fixed order. The candidates are counted first, so a space too large to enumerate is
        refused at once rather than hanging."""
        widths = {hidden: self._width_settings(hidden) for b in self.bins for hidden in range(*b.widths)}
        chosen = self._chosen()
        candidates = len(chosen) * sum(
            (b.layers[1] - b.layers[0] + 1) * len(widths[hidden]) for b in self.bins for hidden in range(*b.widths)
        )
        if candidates > MAX_CANDIDATES:
            raise RecipeError(
                f"recipe {self.name!r}: bins, heads and choices give {candidates:,} candidate architectures, more "
                f"than the {MAX_CANDIDATES:,} a space may enumerate; use larger hidden steps, fewer layers, fewer head "
                "choices or fewer choices values"
            )
        configs = []
        for b in self.bins:
            for layers in range(b.layers[0], b.layers[1] + 1):
                for hidden in range(*b.widths):
                    for (heads, attention, kv, window), choice in itertools.product(widths[hidden], chosen):
                        config = {
                            "family": self.family,
                            "num_layers": layers,
                            "hidden": hidden,
                            "heads": heads,
                            "attention": attention,
                            "kv_heads": kv,
                            **self.fixed,
                            **choice,
                        }
                        if window is not None:
                            config["sliding_window"] = window
                        try:
                            full = resolve_config(config)
                            fits = num_params(full) <= self.max_params
                        except ConfigError as e:
                            raise RecipeError(f"recipe {self.name!r}: {e}") from e
                        except (ArithmeticError, TypeError, ValueError) as e:  # a family check that missed a value
                            raise RecipeError(
                                f"recipe {self.name!r}: config {config} cannot be built ({e}); check fixed and choices"
                            ) from e
                        if fits:
                            configs.append(full)
        if not configs:
            raise RecipeError(
                f"recipe {self.name!r}: no architecture fits its bins, heads and max_params {self.max_params:,}"
            )
        return configs

    def sample(self, num: int | None = None, seed: int = 0) -> list[tuple[str, dict[str, Any], str]]:
        """``num`` records ``(id, config, split)``, deterministic in ``seed``: passes over a
        shuffled space (all architectures before any repeats), with ``eval_fraction`` of the
        architectures (at least one) held out as the eval split."""
        num = self.num if num is None else num
        if not is_count(num, 1, MAX_RECORDS):
            raise RecipeError(f"recipe {self.name!r}: num must be at least 1 and at most {MAX_RECORDS:,}, got {num!r}")
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
        return [
            (f"{self.name}-{i:0{width}d}", space[a], "eval" if a in held_out_set else "train")
            for i, a in enumerate(order[:num])
        ]


class RecipeTable(LiveTable):
    """The built-in recipes by name: those every registered family declares
    (``Family.recipes``), read live, each built once."""

    def __init__(self) -> None:
        self._built: dict[int, Recipe] = {}

    def _items(self) -> dict[str, Recipe]:

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

"""Config -> nn.Module, one file per family, like timm's model registry.

A config is a flat, JSON-serialisable dict with a ``family`` key; keys shared by families mean
the same thing everywhere (``num_layers``, ``hidden``, ``heads``, ``mlp``). Datasets store these
configs, and the compiler and the hypernetwork build models from them, so each family is
defined here and nowhere else.

The :class:`Family` a file registers is everything graphkit knows about it, in one place: the
builder and its config checks, the dataset recipes over it, the hypernetwork's default data
source, the bundled hypernetwork checkpoint and the adapter that converts its attention. The
libraries graphkit's zoos read are families too (``timm``, ``transformers``: ``libraries``), so
a zoo's record builds as a recipe's does. The tables other modules read (``RECIPES``,
``DEFAULT_SOURCES``, ``BUNDLED``) are live views of :data:`FAMILIES` (:class:`FamilyTable`), so
adding a family is adding one file.

    >>> model = build_model({"family": "vit", "num_layers": 3, "hidden": 192, "heads": 3})
"""

from graphkit.families import gpt2, libraries, llama, vit  # noqa: F401  (each registers itself)
from graphkit.families.registry import (
    FAMILIES,
    ConfigError,
    Family,
    FamilyTable,
    LiveTable,
    build_hf,
    build_model,
    config_from_graph,
    family_default,
    get_family,
    num_params,
    register_family,
    resolve_config,
    traced_family,
)

__all__ = [
    "FAMILIES",
    "Family",
    "FamilyTable",
    "LiveTable",
    "ConfigError",
    "build_model",
    "family_default",
    "traced_family",
    "resolve_config",
    "num_params",
    "register_family",
    "get_family",
    "config_from_graph",
    "build_hf",
]

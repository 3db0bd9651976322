"""graphkit: neural-network architectures as data and back.

The core is three things: the op vocabulary (:data:`OPS`), the graph IR (:class:`ArchGraph`)
and the tracer (:func:`trace`) that turns a PyTorch module into that graph.

They are imported on first use (PEP 562), not with the package: ``import graphkit`` and
``graphkit --help`` stay free of torch, which takes seconds to import.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphkit.errors import GraphError, GraphkitError, ModelFileError, ModelSourceError, TraceError

__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY = {
    "ArchGraph": "graphkit.graph",
    "Node": "graphkit.graph",
    "trace": "graphkit.tracing",
    "example_inputs_for": "graphkit.tracing",
    "OPS": "graphkit.ops",
    "OPS_VERSION": "graphkit.ops",
    "OP_DOCS": "graphkit.ops",
    "GHN3_PRIMITIVES": "graphkit.ops",
    "op_id": "graphkit.ops",
    "load_model_source": "graphkit.sources",
}

__all__ = [
    "ArchGraph",
    "Node",
    "trace",
    "example_inputs_for",
    "OPS",
    "OPS_VERSION",
    "OP_DOCS",
    "GHN3_PRIMITIVES",
    "op_id",
    "load_model_source",
    "GraphkitError",
    "GraphError",
    "TraceError",
    "ModelFileError",
    "ModelSourceError",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'graphkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

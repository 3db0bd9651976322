"""graphkit: neural-network architectures as data and back.

The core is three things: the op vocabulary (:data:`OPS`), the graph IR (:class:`ArchGraph`)
and the tracer (:func:`trace`) that turns a PyTorch module into that graph.
"""

from graphkit.errors import GraphError, GraphkitError, ModelFileError, TraceError
from graphkit.graph import ArchGraph, Node
from graphkit.ops import GHN3_PRIMITIVES, OP_DOCS, OPS, OPS_VERSION, op_id
from graphkit.trace import example_inputs_for, trace

__version__ = "0.1.0"

__all__ = [
    "ArchGraph", "Node", "trace", "example_inputs_for", "OPS", "OPS_VERSION", "OP_DOCS",
    "GHN3_PRIMITIVES", "op_id", "GraphkitError", "GraphError", "TraceError", "ModelFileError",
]

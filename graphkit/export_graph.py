"""Moved to :mod:`graphkit.trace.builder` when the tracer became one package; this alias warns."""

import warnings

from graphkit.trace.builder import graph_from_export  # noqa: F401

warnings.warn("graphkit.export_graph moved to graphkit.trace.builder", FutureWarning, stacklevel=2)

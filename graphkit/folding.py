"""Moved to :mod:`graphkit.trace.folding` when the tracer became one package; this alias warns."""

import warnings

from graphkit.trace.folding import repeated_blocks, signature, truncated, unfold  # noqa: F401

warnings.warn("graphkit.folding moved to graphkit.trace.folding", FutureWarning, stacklevel=2)

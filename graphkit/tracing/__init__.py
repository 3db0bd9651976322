"""The tracer: any PyTorch model -> :class:`~graphkit.ArchGraph`, one concept a file.

- :mod:`~graphkit.tracing.tracer`: :func:`trace`, the entry point (export, fold, build, validate);
- :mod:`~graphkit.tracing.inputs`: example inputs guessed from the model;
- :mod:`~graphkit.tracing.export`: ``torch.export`` on fake tensors, failures as one line;
- :mod:`~graphkit.tracing.naming`: which modules and ATen ops become which vocabulary op;
- :mod:`~graphkit.tracing.builder`: the exported ATen program -> architecture nodes and edges;
- :mod:`~graphkit.tracing.state`: the node in the making, shared by the builder and its rules;
- :mod:`~graphkit.tracing.mutation`: writes through views (``copy_`` into a slice) keep their edges;
- :mod:`~graphkit.tracing.attention`: attention cores, in any spelling, fused into one node;
- :mod:`~graphkit.tracing.masks`: whether an attention is causal, from its mask's values;
- :mod:`~graphkit.tracing.moe`: mixture-of-experts blocks (router, gating, experts) as one node;
- :mod:`~graphkit.tracing.spatial`: token shifts (``roll``) and zero padding (``pad``) of images;
- :mod:`~graphkit.tracing.folding`: export two blocks of a repeated stack, replicate the rest.

The function is ``graphkit.trace``; this package is ``graphkit.tracing``, so that each module
imports (and patches) by its dotted path. The vocabulary itself (:mod:`graphkit.ops`) does not
import the tracer, so the hypernetwork reads graphs without it. docs/tracer.md explains every
rule.
"""

from graphkit.tracing.builder import graph_from_export
from graphkit.tracing.inputs import example_inputs_for
from graphkit.tracing.tracer import trace

__all__ = ["trace", "example_inputs_for", "graph_from_export"]

"""The tracer: any PyTorch model -> :class:`~graphkit.ArchGraph`, one concept a file.

- :mod:`~graphkit.trace.tracer`: :func:`trace`, the entry point (export, fold, build, validate);
- :mod:`~graphkit.trace.inputs`: example inputs guessed from the model;
- :mod:`~graphkit.trace.export`: ``torch.export`` on fake tensors, failures as one line;
- :mod:`~graphkit.trace.naming`: which modules and ATen ops become which vocabulary op;
- :mod:`~graphkit.trace.builder`: the exported ATen program -> architecture nodes and edges;
- :mod:`~graphkit.trace.attention`: attention cores fused into one node with their attributes;
- :mod:`~graphkit.trace.moe`: mixture-of-experts blocks (router, gating, experts) as one node;
- :mod:`~graphkit.trace.spatial`: token shifts (``roll``) and zero padding (``pad``) of images;
- :mod:`~graphkit.trace.moe`: mixture-of-experts blocks (router, gating, experts) as one node;
- :mod:`~graphkit.trace.folding`: export two blocks of a repeated stack, replicate the rest.

The vocabulary itself (:mod:`graphkit.ops`) does not import the tracer, so the hypernetwork
reads graphs without it. docs/tracer.md explains every rule.
"""

from graphkit.trace.builder import graph_from_export
from graphkit.trace.inputs import example_inputs_for
from graphkit.trace.tracer import trace

__all__ = ["trace", "example_inputs_for", "graph_from_export"]

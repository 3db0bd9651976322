"""The space a hypernetwork was trained on, measured on graphs, and how far a model lies outside it.

A checkpoint's recorded scores were measured on held-out architectures drawn from its training
space (vits-digits: 3 to 9 layers, widths 128 to 512, 8-pixel images). A user's ViT-B/16 at 224
pixels lies far outside it, and the decoder's rows beyond the widest trained width never
received a gradient, so those scores say nothing about it. :func:`training_space` measures the
space on the training graphs (train-ghn stores it in config.json as ``space``);
:func:`outside_training_space` says, in one line, how far a graph lies beyond it.

Each extent is read off the graph, so it means the same for any model:

- ``width``: the residual stream's width, the widest normalisation (layer_norm / rms_norm);
- ``depth``: the attention layers;
- ``resolution``: the longest side of an image input (none for token inputs);
- ``vocabulary``: the rows of the largest token-embedding table (none for images).

The space also records ``width_by_depth``: per depth, the narrowest and widest width trained.
LoGAH's datasets make deeper models narrower, and the hypernetwork predicts well only near
that envelope: a 12-layer, 768-wide ViT grown from a 256-wide twin scores 0.60 on digits from
the predicted parameters alone, from a 512-wide twin 0.19 (:mod:`graphkit.ghn.grow` picks its
twin's width from it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from graphkit.graph import ArchGraph

#: extent -> (what it is called in a warning, its unit)
EXTENTS = {
    "width": ("width", ""),
    "depth": ("depth", " layers"),
    "resolution": ("resolution", " px"),
    "vocabulary": ("vocabulary", " tokens"),
}


def extent(graph: ArchGraph) -> dict[str, int | None]:
    """The width, depth, resolution and vocabulary of a graph (None where it has none)."""
    norms = [
        max(shape)
        for node in graph.nodes
        if node.op in ("layer_norm", "rms_norm")
        for shape in node.params.values()
        if shape
    ]
    tables = [
        shape[0] for node in graph.nodes if node.op == "embedding" for shape in node.params.values() if len(shape) == 2
    ]
    inputs = graph.meta.get("input_shapes") or []
    image = inputs[0] if inputs and len(inputs[0]) == 4 else None
    return {
        "width": max(norms) if norms else None,
        "depth": sum(node.op == "attention" for node in graph.nodes) or None,
        "resolution": max(image[2:]) if image else None,
        "vocabulary": max(tables) if tables else None,
    }


def _widen(bounds: list[int] | None, value: int) -> list[int]:
    return [value, value] if bounds is None else [min(bounds[0], value), max(bounds[1], value)]


def training_space(graphs: Iterable[ArchGraph]) -> dict[str, Any]:
    """The smallest and largest of each extent over ``graphs`` (extents no graph has are left
    out), and ``width_by_depth``: {depth (a string, as JSON keys are): [narrowest, widest]}."""
    space: dict[str, Any] = {}
    by_depth: dict[int, list[int]] = {}
    for graph in graphs:
        extents = extent(graph)
        for name, value in extents.items():
            if value is not None:
                space[name] = _widen(space.get(name), value)
        if extents["depth"] is not None and extents["width"] is not None:
            by_depth[extents["depth"]] = _widen(by_depth.get(extents["depth"]), extents["width"])
    if by_depth:
        space["width_by_depth"] = {str(depth): by_depth[depth] for depth in sorted(by_depth)}
    return space


def widest_at_depth(space: Mapping[str, Any], depth: int) -> int | None:
    """The widest width trained at ``depth``, or at the recorded depth nearest to it (the deeper
    one on a tie); the widest width of all when the space records no depths; None when it
    records no widths."""
    by_depth = space.get("width_by_depth")
    if isinstance(by_depth, Mapping) and by_depth:
        nearest = min((int(d) for d in by_depth), key=lambda d: (abs(d - depth), -d))
        return int(by_depth[str(nearest)][1])
    bounds = space.get("width")
    return int(bounds[1]) if isinstance(bounds, list) and len(bounds) == 2 else None


def outside_training_space(info: Mapping[str, Any], graph: ArchGraph) -> str | None:
    """How far ``graph`` lies outside the training space a checkpoint's config.json records
    (``info``, as ``ghn.info``), in one phrase per extent: "width 768 is 1.5x the widest trained
    (512)"; None when it lies inside, or the checkpoint records no space."""
    space = info.get("space")
    if not isinstance(space, Mapping):
        return None
    beyond = []
    for name, value in extent(graph).items():
        bounds = space.get(name)
        if value is None or not (isinstance(bounds, list) and len(bounds) == 2):
            continue
        (low, high), (label, unit) = bounds, EXTENTS[name]
        if value > high:
            ratio = value / high
            beyond.append(
                f"{label} {value:,}{unit} is {ratio:.1f}x the largest trained ({high:,}{unit})"
                if ratio < 10
                else f"{label} {value:,}{unit} is {ratio:.0f}x the largest trained ({high:,}{unit})"
            )
        elif value < low:
            beyond.append(f"{label} {value:,}{unit} is below the smallest trained ({low:,}{unit})")
    return ", ".join(beyond) or None


__all__ = ["EXTENTS", "extent", "training_space", "outside_training_space", "widest_at_depth"]

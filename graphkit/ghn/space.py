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
- ``vocabulary``: the rows of the largest token-embedding table (none for images);
- ``patch``: the kernel side of the patch embedding that reads the image (none without one);
- ``grid``: the tokens along a side of the image (the resolution over that embedding's stride).

A patch size outside the space is a solved resize: :mod:`graphkit.ghn.grow` predicts such a ViT
at a trained patch size with its own token grid and resizes the patch embedding as FlexiViT
does. A token grid outside it is not: ``grow`` predicts the model at a trained grid and
interpolates its position table, which beats decoding it directly but can still start worse
than the model's own init (BENCHMARKS.md, "Resolutions and patch sizes"), and the warning says
so.

The space also records ``width_by_depth``: per depth, the narrowest and widest width trained.
LoGAH's datasets make deeper models narrower, and the hypernetwork predicts well only near
that envelope: a 12-layer, 768-wide ViT grown from a 256-wide twin scores 0.60 on digits from
the predicted parameters alone, from a 512-wide twin 0.19 (:mod:`graphkit.ghn.grow` picks its
twin's width from it). And ``patch_by_grid`` the same way: per token grid, the smallest and
largest patch trained. A dataset with patch 2 or 4 at 8 px trains 4 x 4 tokens at patch 2 and
2 x 2 at patch 4, never 4 x 4 at patch 4; a model at 16 px with patch 4 is inside the bounds of
each extent alone, and decoded directly started at 2.73 on digits where its twin at patch 2
would start near 0.86 (docs/experiments.md, "Training across token grids").

And ``families``: the model families of the training graphs, as the tracer names them
(``graph.meta["family"]``: a transformers model type, a timm module, ``vit`` for timm's plain ViTs;
:func:`model_family`). A checkpoint's recorded scores are its own training's held-out
architectures', and what a family's architectures share transfers to its unseen ones where it may
not cross to another family: vision checkpoints and pools score the held-out families of
zoo-vits-mini no better than their own inits at step 0 on the mean, and so does one tensor per
role trained directly (docs/experiments.md, "What crosses to another family"), where the decoder
zoo's checkpoint beats them on most of its held-out families. :func:`outside_training_space`
names a family outside the space; a hand-written model's (``custom``) is unknown, and is not
named.

And ``tied``: whether any training model shared its token embedding with its output head
(:func:`tied_embeddings`). A hypernetwork that saw untied models only predicts a tied model's
shared table as an input embedding, and the head that reads that table is then no output layer
the hypernetwork learnt to make: the prediction is no better than the model's own init, where its
untied twin's is below the unigram loss (docs/experiments.md, "Tied embeddings").
:func:`outside_training_space` names tying as it names width and depth.

:func:`input_task` reads what a model takes (token ids or images), which picks the bundled
checkpoint that fits it (:func:`graphkit.ghn.checkpoint.bundled_for`, ranked by
:func:`space_distance` among those trained on every op the model has).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from graphkit.graph import ArchGraph

#: extent -> (what it is called in a warning, its unit)
EXTENTS = {
    "width": ("width", ""),
    "depth": ("depth", " layers"),
    "resolution": ("resolution", " px"),
    "vocabulary": ("vocabulary", " tokens"),
    "patch": ("patch size", " px"),
    "grid": ("token grid", " tokens a side"),
}

#: said after a token grid outside the space: the bundled ViT checkpoint trained on 4 x 4 tokens;
#: on digits at step 0, with the position table resized and the output layer scaled
#: (graphkit.ghn.grow), every finer grid measured (8 x 8, 16 x 16, ViT-S/B/16 at 224 px) started
#: ahead of its own init, 2 x 2 tokens behind it; 224 px is unmeasured after fine-tuning
#: (BENCHMARKS.md, "Resolutions and patch sizes"). Also after a resolution above the trained
#: ones of a model no patch embedding reads the image of (a convolution stem: no token grid to
#: predict at): the vision zoo's checkpoint, trained at 32-128 px, starts timm's LeViT at 224 px
#: behind its own init (3.15 against 2.26), and an EfficientFormerV2 trained directly at 32 px
#: keeps little of it at 224 px (BENCHMARKS.md, "The vision zoo at 224 px")
GRID_CAVEAT = "where predictions may start worse than the model's own init"


def model_family(graph: ArchGraph) -> str | None:
    """The family the tracer named ``graph``'s model by (``graph.meta["family"]``), or None for a
    hand-written model (``custom``) or a graph that records none: a family the space can hold."""
    family = graph.meta.get("family")
    return str(family) if family and family != "custom" else None


def extent(graph: ArchGraph) -> dict[str, int | None]:
    """The width, depth, resolution, vocabulary, patch size and token grid of a graph (None
    where it has none)."""
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
    # the first patch embedding reads the image (a hierarchical model merges patches later)
    first = next((node.attrs for node in graph.nodes if node.op == "patch_embed" and node.attrs.get("kernel")), None)
    inputs = graph.meta.get("input_shapes") or []
    image = inputs[0] if inputs and len(inputs[0]) == 4 else None
    patch = max(first["kernel"]) if first else None
    stride = max(first.get("stride") or first["kernel"]) if first else None
    return {
        "width": max(norms) if norms else None,
        "depth": sum(node.op == "attention" for node in graph.nodes) or None,
        "resolution": max(image[2:]) if image else None,
        "vocabulary": max(tables) if tables else None,
        "patch": patch,
        "grid": max(image[2:]) // stride if image and stride else None,
    }


#: ops that read the raw input of each task: an integer token id is only ever looked up in an
#: embedding table, an image goes through a convolution (a patch embedding or a stem)
TASK_READERS = {"embedding": "text", "patch_embed": "image", "conv": "image"}


def input_task(graph: ArchGraph) -> str | None:
    """What ``graph`` takes as input: ``"text"`` (token ids) or ``"image"``, read off the first
    op with parameters that the input reaches (an ``embedding`` reads tokens, a ``patch_embed``
    or ``conv`` pixels), else off the input's recorded shape (4 dims: images); None when neither
    tells. The hypernetwork that fits a model is one trained on inputs of its task
    (:func:`graphkit.ghn.checkpoint.bundled_for`)."""
    successors: dict[int, list[int]] = {}
    for src, dst in graph.edges:
        successors.setdefault(src, []).append(dst)
    frontier = [i for i, node in enumerate(graph.nodes) if node.op == "input"]
    seen = set(frontier)
    while frontier:  # breadth first, through parameter-free ops (a pad, a cast, a scaling)
        after: list[int] = []
        for i in frontier:
            node = graph.nodes[i]
            if node.op in TASK_READERS:
                return TASK_READERS[node.op]
            if node.op == "input" or not node.params:
                after.extend(j for j in successors.get(i, ()) if j not in seen)
        seen.update(after)
        frontier = after
    inputs = graph.meta.get("input_shapes") or []
    if inputs and len(inputs[0]) == 4:
        return "image"
    return None


def tied_embeddings(graph: ArchGraph) -> bool:
    """Whether ``graph``'s output head reuses its token embedding as its weight (the tracer
    records the shared name in the head's ``tied`` attribute): GPT-2 as transformers builds it
    by default, Gemma, OPT, the small Qwen2 models."""
    tables = {name for node in graph.nodes if node.op == "embedding" for name in node.params}
    return any(node.op == "head" and tables.intersection(node.attrs.get("tied") or ()) for node in graph.nodes)


#: the bounds of one extent recorded per value of another: table -> (the extent keyed on, the one bounded)
_BOUNDS_BY = {"width_by_depth": ("depth", "width"), "patch_by_grid": ("grid", "patch")}


def _widen(bounds: list[int] | None, value: int) -> list[int]:
    return [value, value] if bounds is None else [min(bounds[0], value), max(bounds[1], value)]


def training_space(graphs: Iterable[ArchGraph]) -> dict[str, Any]:
    """The smallest and largest of each extent over ``graphs`` (extents no graph has are left
    out), ``width_by_depth``: {depth (a string, as JSON keys are): [narrowest, widest]},
    ``patch_by_grid``: {token grid: [smallest, largest patch]}, ``families``: their
    :func:`model_family` names, sorted, and ``tied``: whether any of them ties its token embedding
    to its head."""
    space: dict[str, Any] = {}
    by: dict[str, dict[int, list[int]]] = {table: {} for table in _BOUNDS_BY}
    tied, families = False, set()
    for graph in graphs:
        tied = tied or tied_embeddings(graph)
        families.add(model_family(graph))
        extents = extent(graph)
        for name, value in extents.items():
            if value is not None:
                space[name] = _widen(space.get(name), value)
        for table, (key_name, name) in _BOUNDS_BY.items():
            key, value = extents[key_name], extents[name]
            if key is not None and value is not None:
                by[table][key] = _widen(by[table].get(key), value)
    for table, values in by.items():
        if values:
            space[table] = {str(key): values[key] for key in sorted(values)}
    space["families"] = sorted(family for family in families if family is not None)
    space["tied"] = tied
    return space


def trained_bounds(space: Any, name: str) -> list[int] | None:
    """The [smallest, largest] of extent ``name`` that ``space`` (config.json's ``space``)
    records, or None where it records none or is no space (a checkpoint from before the extent)."""
    bounds = space.get(name) if isinstance(space, Mapping) else None
    return bounds if isinstance(bounds, list) and len(bounds) == 2 else None


def _bounds_at(space: Mapping[str, Any], by: str, key: int | None, name: str) -> list[int] | None:
    """The bounds ``space[by]`` records at ``key``, or at the recorded key nearest to it (the
    larger one on a tie); extent ``name``'s bounds over the whole space when it records no
    ``by`` or ``key`` is unknown."""
    table = space.get(by)
    if isinstance(table, Mapping) and table and key is not None:
        nearest = min((int(k) for k in table), key=lambda k: (abs(k - key), -k))
        return [int(bound) for bound in table[str(nearest)]]
    return trained_bounds(space, name)


def widest_at_depth(space: Mapping[str, Any], depth: int) -> int | None:
    """The widest width trained at ``depth``, or at the recorded depth nearest to it (the deeper
    one on a tie); the widest width of all when the space records no depths; None when it
    records no widths."""
    bounds = _bounds_at(space, "width_by_depth", depth, "width")
    return bounds[1] if bounds else None


def grid_to_predict(space: Mapping[str, Any], grid: int | None) -> int | None:
    """The token grid to predict a ``grid`` x ``grid`` model at: the finest grid trained that is
    not finer than ``grid``, whose position table is then upsampled. A hypernetwork trained on
    2 x 2, 4 x 4 and 8 x 8 grids scored ViT-B/32's 7 x 7 at 2.67 on digits at step 0 decoded at
    its own grid, 2.77 predicted at 8 x 8 and downsampled, 1.35 at 4 x 4 and upsampled (its own
    init 2.36; docs/experiments.md, "Training on the 8 x 8 grid too"). ``grid`` itself where no
    trained grid is as coarse (a coarser grid keeps its own) or the grid is unknown; the finest
    trained bound when the space records its grids as bounds only (a checkpoint from before
    ``patch_by_grid``)."""
    if grid is None:
        return None
    trained = _trained_grids(space)
    if trained:
        coarser = [trained_grid for trained_grid in trained if trained_grid <= grid]
        return max(coarser) if coarser else grid
    bounds = trained_bounds(space, "grid")
    return grid if bounds is None else min(grid, bounds[1])


def _trained_grids(space: Mapping[str, Any]) -> list[int]:
    """The token grids ``space`` records patches for (``patch_by_grid``'s keys), smallest first;
    empty for a checkpoint from before ``patch_by_grid``."""
    table = space.get("patch_by_grid")
    return sorted(int(key) for key in table) if isinstance(table, Mapping) else []


def patches_at_grid(space: Mapping[str, Any], grid: int | None) -> list[int] | None:
    """The [smallest, largest] patch trained on a ``grid`` x ``grid`` token grid, or on the
    recorded grid nearest to it (the finer one on a tie); the patch bounds over the whole space
    when it records none per grid (a checkpoint from before ``patch_by_grid``) or the grid is
    unknown; None when it records no patches."""
    return _bounds_at(space, "patch_by_grid", grid, "patch")


def _beyond(space: Mapping[str, Any], graph: ArchGraph) -> Iterator[tuple[str, int, int, int]]:
    """Each extent of ``graph`` outside the bounds ``space`` records: (extent, value, low, high)."""
    for name, value in extent(graph).items():
        bounds = trained_bounds(space, name)
        if value is not None and bounds and not bounds[0] <= value <= bounds[1]:
            yield name, value, bounds[0], bounds[1]


def _between_trained_grids(space: Mapping[str, Any], graph: ArchGraph) -> str | None:
    """A phrase for a token grid inside the trained grids' bounds that none of them is (3 x 3 where
    2 x 2 and 4 x 4 trained: the bundled ViT checkpoint's prediction, made at 2 x 2 and resized,
    started at 2.87 on digits against its own init's 2.36, and stayed behind after 100 steps), else None."""
    grid, trained = extent(graph)["grid"], _trained_grids(space)
    if grid is None or not trained or grid in trained or not trained[0] < grid < trained[-1]:
        return None
    listed = ", ".join(map(str, trained[:-1])) + f" and {trained[-1]}"
    return f"token grid {grid} tokens a side lies between the trained ones ({listed} tokens a side), {GRID_CAVEAT}"


def outside_training_space(info: Mapping[str, Any], graph: ArchGraph) -> str | None:
    """How far ``graph`` lies outside the training space a checkpoint's config.json records
    (``info``, as ``ghn.info``), in one phrase per extent: "width 768 is 1.5x the widest trained
    (512)", "its family convit is not the one it trained on (vit)" for a family the space records
    none of (:func:`family_phrase`), and "its input and output embeddings are tied, and it trained
    on untied models only" for a tied model unless the space records tied ones; None when it lies
    inside, or the checkpoint records no space. A token grid outside the trained ones, and a
    resolution above them where no patch embedding gives a grid, add :data:`GRID_CAVEAT`."""
    space = info.get("space")
    if not isinstance(space, Mapping):
        return None
    stem = extent(graph)["grid"] is None  # no patch embedding reads the image: no token grid tells
    beyond = []
    for name, value, low, high in _beyond(space, graph):
        label, unit = EXTENTS[name]
        if value > high:
            ratio = value / high
            beyond.append(
                f"{label} {value:,}{unit} is {ratio:.1f}x the largest trained ({high:,}{unit})"
                if ratio < 10
                else f"{label} {value:,}{unit} is {ratio:.0f}x the largest trained ({high:,}{unit})"
            )
        else:
            beyond.append(f"{label} {value:,}{unit} is below the smallest trained ({low:,}{unit})")
        if name == "grid" or (name == "resolution" and value > high and stem):
            beyond[-1] += f", {GRID_CAVEAT}"
    between = _between_trained_grids(space, graph)
    if between is not None:
        beyond.append(between)
    unseen = family_phrase(space, graph)
    if unseen is not None:
        beyond.append(unseen)
    if space.get("tied") is not True and tied_embeddings(graph):  # not recorded: trained before tying was
        beyond.append("its input and output embeddings are tied, and it trained on untied models only")
    return ", ".join(beyond) or None


def family_phrase(space: Mapping[str, Any], graph: ArchGraph) -> str | None:
    """A phrase for a model whose family (:func:`model_family`) is none of those ``space``
    records: "its family convit is not the one it trained on (vit)", or "none of the 35 it
    trained on" beyond three; None inside, for a model of no known family, or for a space that
    records no families (a checkpoint from before they were)."""
    families, family = space.get("families"), model_family(graph)
    if not isinstance(families, list) or not families or family is None or family in families:
        return None
    if len(families) == 1:
        trained = f"is not the one it trained on ({families[0]})"
    elif len(families) <= 3:
        trained = f"is none of the {len(families)} it trained on ({', '.join(families)})"
    else:
        trained = f"is none of the {len(families)} it trained on"
    return f"its family {family} {trained}"


def space_distance(info: Mapping[str, Any], graph: ArchGraph) -> float:
    """How far ``graph`` lies outside the training space ``info`` records, as one number to rank
    checkpoints by: the sum over extents of |log(value / nearest bound)|, 0 inside (or when no
    space is recorded). Twice the widest trained width counts as much as half the narrowest."""
    space = info.get("space")
    if not isinstance(space, Mapping):
        return 0.0
    return sum(abs(math.log(value / (high if value > high else low))) for _, value, low, high in _beyond(space, graph))


__all__ = [
    "EXTENTS",
    "GRID_CAVEAT",
    "TASK_READERS",
    "extent",
    "input_task",
    "tied_embeddings",
    "training_space",
    "trained_bounds",
    "outside_training_space",
    "space_distance",
    "widest_at_depth",
    "patches_at_grid",
    "grid_to_predict",
]

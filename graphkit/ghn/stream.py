"""The residual stream's scale: which parameters scale it, read off an architecture's graph.

A pre-norm transformer reads its residual stream only through norms, which do not see the
stream's scale, and writes into it through the last affine layer of each branch (``o_proj``,
``down_proj``, an MoE's experts' ``down_proj``, a post-norm's gain). Multiply the token and
position tables and every such writer by ``c`` and the stream is ``c`` times what it was at every
depth, while every norm, and so the logits, give what they gave: the same function, up to the
norms' epsilon. A tied head reads the table as well; its final norm's gain times ``1 / c`` undoes
that on the logits.

The hypernetwork uses this to decode its token tables at ``LoGAHConfig.table_gain`` times the
weights' RMS (the stream's input loud against what the branches write, which is what took 16 of
20 held-out decoder families below the unigram loss with the shipped checkpoint) while writing
the model in its own init's terms: tables at the weights' RMS and the writers ``table_gain``
times smaller. Fine-tuning from the first form spends its steps shrinking a loud table; from the
second it does not (docs/experiments.md, "The stream's input").

:func:`stream_writers` proves the rewrite exact on the graph or refuses it: a node whose output is
not either the trained form's or ``c`` times it (an activation, attention, a head or the output
reading the scaled stream, as in post-norm and post-LN models) returns None, and those models
keep the trained form.
"""

from __future__ import annotations

import re
from collections import defaultdict

from graphkit.graph import ArchGraph, Node, without_block_indices

#: the ops whose tables start a language model's residual stream: tokens and learned positions
#: (:attr:`~graphkit.ghn.config.LoGAHConfig.table_gain` scales them)
TABLE_OPS = frozenset({"embedding", "pos_embedding"})
#: norms whose output does not depend on their input's scale (up to epsilon)
SCALE_FREE = frozenset({"layer_norm", "rms_norm"})
#: ops whose output is c times theirs when their one scaled input is (the others unscaled)
HOMOGENEOUS = frozenset({"mul", "matmul", "scale", "roll", "mean_pool", "sum_pool", "unfold", "fold"})
#: ops whose output is c times theirs when every input is
ADDITIVE = frozenset({"add", "sub", "concat"})
#: ops that add a parameter to their inputs: c times theirs when every input and the parameter are
ADDS_PARAMETER = frozenset({"bias", "pos_embedding"})
#: the parameters of an opaque node (a mixture of experts, a recurrent mixer) that its output is
#: linear in: the experts' down projections, the mixer's output projection
OPAQUE_WRITERS = {
    "moe": re.compile(r"(^|\.)experts\.down_proj(_bias|\.weight|\.bias)?$"),
    "ssm": re.compile(r"(^|\.)(out_proj|o_proj|output)\.(weight|bias)$"),
}


def table_params(graph: ArchGraph) -> set[str]:
    """The parameters of ``graph``'s token and position tables (:data:`TABLE_OPS`)."""
    return {name for node in graph.nodes if node.op in TABLE_OPS for name in node.params}


def tied_params(graph: ArchGraph) -> set[str]:
    """The parameters ``graph``'s heads read as their weight (their ``tied`` attribute): a tied token table's."""
    return {name for node in graph.nodes if node.op == "head" for name in node.attrs.get("tied") or ()}


def scalable_norm(graph: ArchGraph, node: Node) -> bool:
    """Whether a factor on ``node``'s parameters scales its output: a norm with a gain that its
    model starts at 1 (not Gemma's ``1 + w``, started at 0, which a factor would not scale)."""
    constants = graph.meta.get("init", {})
    gains = [name for name in node.params if name.endswith("weight")]
    return (
        node.op in SCALE_FREE
        and bool(gains)
        and all(constants.get(without_block_indices(name)) != 0.0 for name in gains)
    )


def stream_writers(graph: ArchGraph) -> frozenset[str] | None:
    """The parameters that, times any ``c`` along with the token and position tables, make
    ``graph``'s residual stream ``c`` times what it was while the rest of the model computes what
    it did (up to the norms' epsilon; see the module docstring): the tables, each branch's writers,
    and the biases of affine layers that read the scaled stream. None where no such set exists in
    the graph's terms (a node reads the stream other than through a norm, an add, a product with
    an unscaled factor or an affine map) or where the stream reaches the head or the output."""
    inputs: defaultdict[int, list[int]] = defaultdict(list)
    consumers: defaultdict[int, set[int]] = defaultdict(set)
    for source, dest in graph.edges:
        inputs[dest].append(source)
        consumers[source].add(dest)
    scaled: set[int] = set()
    names: set[str] = set()

    def writer(index: int, reader: int) -> set[str] | None:
        """The parameters that scale node ``index``'s (unscaled) output, read by ``reader`` alone;
        None where none do."""
        node = graph.nodes[index]
        if consumers[index] != {reader}:
            return None
        if node.op in ("linear", "conv", "scale") or (node.op in SCALE_FREE and scalable_norm(graph, node)):
            return set(node.params) or None
        if node.op in OPAQUE_WRITERS:
            return {name for name in node.params if OPAQUE_WRITERS[node.op].search(name)} or None
        if node.op in HOMOGENEOUS:  # one factor scaled is enough: the first that can be
            for j in inputs[index]:
                part = writer(j, index)
                if part is not None:
                    return part
            return None
        if node.op in ADDITIVE or node.op in ADDS_PARAMETER:
            summands = writers_of(inputs[index], index)
            return None if summands is None else summands | (set(node.params) if node.op in ADDS_PARAMETER else set())
        return None

    def writers_of(indices: list[int], reader: int) -> set[str] | None:
        """The parameters that scale every one of the nodes ``indices``; None where one has none."""
        found: set[str] = set()
        for j in indices:
            part = writer(j, reader)
            if part is None:
                return None
            found |= part
        return found

    def reads_scaled(index: int, node: Node) -> bool:
        """Make node ``index``'s output scaled, given that an input is; False where it cannot be."""
        if node.op in SCALE_FREE:  # reads the stream: unscaled again
            return True
        unscaled = [j for j in inputs[index] if j not in scaled]
        if node.op in HOMOGENEOUS and len(unscaled) == len(inputs[index]) - 1:
            scaled.add(index)
            return True
        if node.op in ADDITIVE or node.op in ADDS_PARAMETER:  # the unscaled summands' writers, and b or P
            found = writers_of(unscaled, index)
            if found is None:
                return False
            names.update(found, node.params if node.op in ADDS_PARAMETER else ())
            scaled.add(index)
            return True
        if node.op in ("linear", "conv") and not unscaled:  # x W^T + b: b scaled too
            names.update(name for name, shape in node.params.items() if len(shape) == 1)
            scaled.add(index)
            return True
        return False

    for index, node in enumerate(graph.nodes):
        if node.op in TABLE_OPS and not any(j in scaled for j in inputs[index]):
            if any(graph.nodes[j].op != "input" for j in inputs[index]):  # x + P with x unscaled
                return None
            names.update(node.params)
            scaled.add(index)
        elif any(j in scaled for j in inputs[index]) and not reads_scaled(index, node):
            return None
    return frozenset(names) if scaled else None

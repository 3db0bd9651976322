"""Folding repeated blocks: export two blocks of a stack, replicate the second for the rest.

Export costs about 1.5 ms per ATen op, and transformer stacks repeat one block. When the
children of an ``nn.ModuleList`` or ``nn.Sequential`` end in a run of three or more with the same
:func:`signature` (module types, parameter and buffer shapes, scalar attributes other than a
layer index), the blocks before the run and its first two are exported (:func:`truncated`): a
whole stack of identical blocks, or one that opens with a few others (DeepSeek's dense layers
before its mixture-of-experts ones). :func:`unfold`
accepts the result only if block 1 equals block 0 up to its index and the wiring is a chain
(prefix -> block 0 -> block 1 -> suffix), then replicates block 1; otherwise, or when the
shortened model cannot run (a forward that zips the stack with another list of its own length),
the caller exports everything. docs/tracer.md says what folding cannot see.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from torch import nn

from graphkit.graph import ArchGraph, Node
from graphkit.tracing.moe import is_moe_block

# attributes that legitimately differ between otherwise identical blocks
_INDEX_ATTRS = re.compile(r"^(layer_idx|layer_id|layer_index|layer_number|block_idx|block_id|idx|index)$")


def repeated_blocks(model: nn.Module) -> list[tuple[str, int, int]]:
    """ModuleLists / Sequentials ending in >= 3 structurally identical blocks, outermost only:
    (path, length, start), the run being blocks ``start`` to ``length - 1``. An MoE block's
    experts are one node whatever their number, and truncating them would change what the block
    computes, so they are never folded."""
    found: list[tuple[str, int, int]] = []
    moe_blocks = [path for path, module in model.named_modules() if is_moe_block(module)]
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 3 or not path:
            continue
        if any(path.startswith(p + ".") for p, _, _ in found):
            continue
        if any(not p or path.startswith(p + ".") for p in moe_blocks):
            continue
        signatures = [signature(child) for child in module]
        start = len(signatures) - 1
        while start > 0 and signatures[start - 1] == signatures[-1]:
            start -= 1
        if len(signatures) - start >= 3:
            found.append((path, len(module), start))
    return found


def signature(block: nn.Module) -> tuple:
    """Everything about a module tree that shapes its exported graph, as a hashable tuple."""
    simple = (int, float, str, bool, type(None))
    items = []
    for name, m in block.named_modules():
        attrs = tuple(
            sorted(
                (k, v)
                for k, v in vars(m).items()
                if not k.startswith("_")
                and not _INDEX_ATTRS.match(k)
                and (isinstance(v, simple) or (isinstance(v, tuple) and all(isinstance(x, simple) for x in v)))
            )
        )
        params = tuple((n, tuple(p.shape), p.dtype) for n, p in m.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers(recurse=False))
        items.append((name, type(m), attrs, params, buffers))
    return tuple(items)


@contextlib.contextmanager
def truncated(model: nn.Module, folds: Sequence[tuple[str, int, int]]) -> Iterator[None]:
    """Temporarily keep only the blocks before each folded run and the run's first two."""
    saved = []
    try:
        for path, _, start in folds:
            blocks = model.get_submodule(path)
            saved.append((blocks, blocks._modules))
            blocks._modules = OrderedDict(list(blocks._modules.items())[: start + 2])
        yield
    finally:
        for blocks, modules in saved:
            blocks._modules = modules


def unfold(graph: ArchGraph, path: str, length: int, start: int = 0) -> ArchGraph | None:
    """Replicate block ``path.{start + 1}`` of a graph traced with the run's first two blocks
    (``start`` and ``start + 1``) so that the run fills blocks up to ``length - 1``.

    Returns None (the caller then traces everything) unless the two traced blocks are
    identical up to their index and wired as a chain: prefix (with the blocks before the run) ->
    block ``start`` -> block ``start + 1`` -> suffix. Below, "block 0" and "block 1" are the
    run's first two and indices count from ``start``.
    """
    nodes, n = graph.nodes, len(graph.nodes)
    block = [_run_index(node.module, path, start) for node in nodes]
    b0 = [i for i in range(n) if block[i] == 0]
    b1 = [i for i in range(n) if block[i] == 1]
    if not b0 or len(b0) != len(b1) or max(b0) > min(b1):
        return None
    if any(block[i] is None for i in range(min(b0), max(b1) + 1)):
        return None
    for i, j in zip(b0, b1):
        if _renamed(nodes[i], path, start, start + 1) != nodes[j]:
            return None
    pos0 = {i: k for k, i in enumerate(b0)}
    pos1 = {j: k for k, j in enumerate(b1)}
    prefix = list(range(min(b0)))
    suffix = list(range(max(b1) + 1, n))
    size = len(b1)
    # new layout: prefix, block 0, block 1, blocks 2..length-1, suffix
    base = len(prefix)

    def at(k: int, pos: int) -> int:
        return base + k * size + pos

    def shift(i: int) -> int:  # prefix and suffix indices in the new layout
        return i if i < base else i + (length - 2) * size

    length -= start  # blocks in the run
    new_nodes = [nodes[i] for i in prefix] + [nodes[i] for i in b0] + [nodes[j] for j in b1]
    for k in range(2, length):
        new_nodes += [_renamed(nodes[j], path, start + 1, start + k) for j in b1]
    new_nodes += [nodes[i] for i in suffix]
    meta = dict(graph.meta)
    if meta.get("discarded"):  # parameters a block reads only into values it discards: in every block
        block1 = _block_pattern(path, start + 1)
        in_block1 = [p for p in meta["discarded"] if block1.match(p)]
        copies = {block1.sub(f"{path}.{start + k}", p) for k in range(2, length) for p in in_block1}
        meta["discarded"] = sorted({*meta["discarded"], *copies})
    edges: set[tuple[int, int]] = set()
    for s, d in graph.edges:
        bs, bd = block[s], block[d]
        if bs is None and bd is None:
            edges.add((shift(s), shift(d)))
        elif bs is None and bd == 0:
            edges.add((s, at(0, pos0[d])))
        elif bs is None and bd == 1:  # prefix feeds every block after the first alike
            if s > max(b1):
                return None
            edges.update((s, at(k, pos1[d])) for k in range(1, length))
        elif bs == 0 and bd == 0:
            edges.add((at(0, pos0[s]), at(0, pos0[d])))
        elif bs == 0 and bd == 1:  # block k-1 feeds block k
            edges.update((at(k - 1, pos0[s]), at(k, pos1[d])) for k in range(1, length))
        elif bs == 1 and bd == 1:
            edges.update((at(k, pos1[s]), at(k, pos1[d])) for k in range(1, length))
        elif bs == 1 and bd is None and d > max(b1):
            edges.add((at(length - 1, pos1[s]), shift(d)))
        else:  # block 0 feeding the suffix, or anything else that is not a chain
            return None
    return ArchGraph(nodes=new_nodes, edges=sorted(edges), meta=meta)


def _run_index(module: str, path: str, start: int) -> int | None:
    """The index in the folded run (from ``start``) of the block of ``path`` that ``module``
    lies in; None outside the stack or in a block before the run (those are prefix)."""
    if module == path or not module.startswith(path + "."):
        return None
    head = module[len(path) + 1 :].split(".", 1)[0]
    return int(head) - start if head.isdigit() and int(head) >= start else None


def _block_pattern(path: str, index: int) -> re.Pattern[str]:
    """Matches the start of a name inside block ``path.{index}`` (not ``path.{index}0``, a later block)."""
    return re.compile(rf"^{re.escape(path)}\.{index}(?=$|[._])")


def _renamed(node: Node, path: str, old: int, new: int) -> Node:
    pattern = _block_pattern(path, old)
    sub = lambda s: pattern.sub(f"{path}.{new}", s)  # noqa: E731
    attrs = dict(node.attrs)
    if "tied" in attrs:
        attrs["tied"] = [sub(p) for p in attrs["tied"]]
    return Node(
        op=node.op,
        name=sub(node.name),
        module=sub(node.module),
        params={sub(k): v for k, v in node.params.items()},
        attrs=attrs,
    )

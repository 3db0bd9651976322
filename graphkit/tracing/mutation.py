"""Writes through views: which exported values share storage, and which ops write into it.

torch.export (non-strict) keeps in-place ops. ``out[:, :8] = y`` is ``copy_(slice(out), y)``;
DeepSeek-V3 assembles its keys in a ``new_empty`` tensor with two such copies; a KV cache or an
``index_put_`` writes into a buffer. The code after the write reads the base tensor (``out``),
not the ``copy_``, so a graph built from FX edges alone loses the data that came in through the
write: the ``y -> head`` edge, DeepSeek-V3's ``kv_a_proj_with_mqa -> attention`` edge.

:class:`Aliases` follows the ops in program order. Which op returns a view of which argument,
and which op writes into which argument, is read off the ATen schema's alias annotations
(``Tensor(a)`` is a view, ``Tensor(a!)`` a write), not from a list of op names, so every view
and every in-place or ``out=`` op is covered. The graph builder then lets every alias of a
written tensor carry what was written (:meth:`graphkit.tracing.builder._GraphBuilder.build`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

from torch import fx

from graphkit.compat import op_schema


def _written(node: fx.Node) -> Iterator[fx.Node]:
    """The arguments ``node`` writes into (``Tensor(a!)`` in its schema: ``copy_``'s self,
    ``index_put_``'s self, an ``out=`` tensor)."""
    schema = op_schema(node.target)
    if schema is None:
        return
    for i, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write:
            continue
        value = node.args[i] if i < len(node.args) and not argument.kwarg_only else node.kwargs.get(argument.name)
        if isinstance(value, fx.Node):
            yield value


def _viewed(node: fx.Node) -> tuple[fx.Node | None, bool]:
    """The argument whose storage ``node``'s result shares (``Tensor(a)`` on both sides of the
    schema), and whether the result is a list of such views (``split``, ``unbind``); ``(None,
    False)`` for an op that returns new storage."""
    schema = op_schema(node.target)
    if schema is None or not schema.returns:
        return None, False
    returned = schema.returns[0].alias_info
    for i, argument in enumerate(schema.arguments):
        info = argument.alias_info
        source = node.args[i] if i < len(node.args) else None
        if info is None or not isinstance(source, fx.Node):
            continue
        if returned is not None and returned.before_set & info.before_set:
            return source, False
        if "*" in info.after_set:  # Tensor(a -> *): every element of the returned list is a view
            return source, True
    return None, False


class Aliases:
    """Storage shared between the values of one exported program: which value each op's
    result views, and which ops write into each storage, read off the program once."""

    def __init__(self, nodes: list[fx.Node]) -> None:
        self._root: dict[fx.Node, fx.Node] = {}
        self._members: dict[fx.Node, list[fx.Node]] = {}
        self._writers: dict[fx.Node, list[fx.Node]] = {}
        self.written: dict[fx.Node, list[fx.Node]] = {}  # a writing op -> the roots it writes into
        lists: dict[fx.Node, fx.Node] = {}  # an op returning a list of views -> its root
        for node in nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0] in lists:
                self._link(node, lists[node.args[0]])
            else:
                source, many = _viewed(node)
                if source is not None and many:
                    lists[node] = self.root(source)
                elif source is not None:
                    self._link(node, self.root(source))
            roots = list(dict.fromkeys(self.root(target) for target in _written(node)))
            if roots:
                self.written[node] = roots
                for root in roots:
                    self._writers.setdefault(root, []).append(node)

    def root(self, node: fx.Node) -> fx.Node:
        """The value whose storage ``node`` views (``node`` itself for new storage)."""
        return self._root.get(node, node)

    def members(self, root: fx.Node) -> list[fx.Node]:
        """``root`` and every view of it."""
        return [root, *self._members.get(root, ())]

    def writers(self, node: fx.Node, before: fx.Node) -> list[fx.Node]:
        """The ops that write into ``node``'s storage before the op ``before`` runs (positions
        are the builder's ``_gk_pos``)."""
        end = before.meta["_gk_pos"]
        return [w for w in self._writers.get(self.root(node), ()) if w.meta["_gk_pos"] < end]

    def _link(self, node: fx.Node, root: fx.Node) -> None:
        if node is not root:
            self._root[node] = root
            self._members.setdefault(root, []).append(node)

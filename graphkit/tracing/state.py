"""What the graph builder and its attention and mixture-of-experts rules share: the node in the
making (:class:`Group`) and the contract between them (:class:`BuildContext`, what the rules may
read of the graph being built). It has its own module so that the rules (``attention.py``,
``moe.py``), which the builder (``builder.py``) holds, need not import the builder back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torch import fx, nn

if TYPE_CHECKING:
    from graphkit.tracing.masks import ConstantEvaluator
    from graphkit.tracing.mutation import Aliases


@dataclass
class Group:
    """What becomes one node: the FX ops fused into it and what it reads and owns."""

    op: str
    module: str
    fx: list[fx.Node] = field(default_factory=list)
    inputs: set[int] = field(default_factory=set)
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    live: bool = False

    @property
    def order(self) -> int:
        return self.fx[-1].meta["_gk_pos"] if self.fx else -1


class BuildContext(Protocol):
    """What the tracer's rules (:class:`~graphkit.tracing.attention.AttentionRules`,
    :class:`~graphkit.tracing.moe.MoeRules`) read of the graph being built, and nothing more: the
    model and its exported FX graph, the nodes made so far (``groups``, ``INPUT`` the model's
    input) and which of them each FX value comes from (``prod``), the exported parameters' names
    (placeholder -> parameter), the in-place writes (``aliases``), the values computable without
    the input (``constants``), and where an FX op runs: the module calls around it (``calls``,
    ``stack``), the innermost (``scope``), the outermost module graphkit makes one node
    (``leaf``), and whether a value is a parameter (``is_parameter``)."""

    INPUT: ClassVar[int]
    model: nn.Module
    graph: fx.Graph
    groups: list[Group]
    prod: dict[fx.Node, frozenset[int]]
    param_names: dict[str, str]
    aliases: Aliases
    constants: ConstantEvaluator

    def calls(self, node: fx.Node) -> list[str]:
        """The module calls ``node`` runs in, outermost first (``path@k`` for a k-th call)."""
        ...

    def stack(self, node: fx.Node) -> list[str]:
        """The module paths ``node`` runs in, outermost first."""
        ...

    def scope(self, node: fx.Node) -> str:
        """The innermost module ``node`` runs in ("" for the model itself)."""
        ...

    def leaf(self, node: fx.Node) -> tuple[str, str] | None:
        """The outermost module around ``node`` that becomes one node, and its op, or None."""
        ...

    def is_parameter(self, value: fx.Node) -> bool:
        """Whether ``value`` is a parameter or a view of one."""
        ...

"""What the graph builder and its attention and mixture-of-experts rules share: the node in the
making (:class:`Group`). It has its own module so that the rules (``attention.py``, ``moe.py``),
which the builder (``builder.py``) mixes in, need not import the builder back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx


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

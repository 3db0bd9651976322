"""The tracer names only ops of the vocabulary: every op in its tables (module types and class
names, ATen names, grid ops) and every op its code spells out is in :data:`graphkit.ops.OPS`, so
that a new table entry with a typo, or an op added to the tracer and not to the vocabulary, fails
here and not as an unknown op in some user's graph."""

from __future__ import annotations

import ast
from pathlib import Path

from graphkit.ops import OPS
from graphkit.tracing import naming, spatial

TRACING = Path(naming.__file__).parent


def table_ops() -> dict[str, set[str]]:
    """Every op each of the tracer's tables maps to, by table."""
    return {
        "naming._MODULE_TYPES": {op for _, op in naming._MODULE_TYPES},
        "naming._MODULE_NAME_RULES": {op for _, op in naming._MODULE_NAME_RULES},
        "naming._MODULE_EXACT_NAMES": set(naming._MODULE_EXACT_NAMES.values()),
        "naming.ATEN_OPS": set(naming.ATEN_OPS.values()),
        "spatial._WINDOWED": {op for op, _, _ in spatial._WINDOWED.values()},
        "spatial._ADAPTIVE": set(spatial._ADAPTIVE.values()),
        "spatial._REDUCTIONS": set(spatial._REDUCTIONS.values()),
    }


def spelled_ops(source: str) -> set[str]:
    """The ops a tracer module's code spells out: the first argument of ``Group(...)``, a string
    assigned to an ``.op``, and the strings a function named ``*_op`` returns (not inside an
    f-string: ``other:<aten op>`` is built, not spelled)."""
    found: set[str] = set()

    def strings(node: ast.AST) -> set[str]:
        if isinstance(node, ast.JoinedStr):
            return set()
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else set()
        return set().union(*(strings(child) for child in ast.iter_child_nodes(node)))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Group" and node.args:
            found |= strings(node.args[0])
        elif isinstance(node, ast.Assign) and any(getattr(t, "attr", None) == "op" for t in node.targets):
            found |= strings(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("_op"):
            returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
            found |= set().union(*map(strings, returns))
    return found


def test_every_op_in_the_tracer_tables_is_in_the_vocabulary():
    unknown = {table: sorted(ops - set(OPS)) for table, ops in table_ops().items() if ops - set(OPS)}
    assert not unknown, f"ops outside graphkit.ops.OPS: {unknown}"


def test_every_op_the_tracer_spells_out_is_in_the_vocabulary():
    spelled = {path.name: spelled_ops(path.read_text()) for path in sorted(TRACING.glob("*.py"))}
    assert {"attention", "moe", "input", "output", "pos_embedding", "head"} <= spelled["builder.py"] | spelled[
        "attention.py"
    ]
    assert {"roll", "pad", "mean_pool", "interpolate"} <= spelled["spatial.py"]
    unknown = {name: sorted(ops - set(OPS)) for name, ops in spelled.items() if ops - set(OPS)}
    assert not unknown, f"ops outside graphkit.ops.OPS: {unknown}"


def test_a_misspelt_op_is_found():
    assert spelled_ops('def _single_op(x):\n    return "lineer" if x else f"other:{x}"\n') == {"lineer"}
    assert spelled_ops('g = Group("atention", "")\ng.op = "hed"\n') == {"atention", "hed"}

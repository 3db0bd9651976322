"""graphkit's imports point one way: no module imports, even lazily or for a type hint, a module
that imports it back. A cycle is how layers start leaking into each other (a registry that
imports its entries, a data class that imports its drawing), so the test reads every import
statement with ``ast`` instead of trusting what happens to load."""

import ast
from pathlib import Path

import networkx as nx

import graphkit.errors
from graphkit.families import FAMILIES

PACKAGE = Path(__file__).resolve().parent.parent / "graphkit"


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(package: Path) -> nx.DiGraph:
    """Module -> the package's modules it names in any import statement: at the top, inside a
    function, under ``if TYPE_CHECKING`` or relative. ``from a.b import c`` names ``a.b.c`` when
    that is a module, else ``a.b``."""
    found, root = modules(package), package.name
    graph = nx.DiGraph()
    graph.add_nodes_from(found)
    for name, path in found.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(here[: len(here) - node.level + 1] + [node.module or ""]).strip(".")
                    if node.level
                    else node.module or ""
                )
                named = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in found else base for alias in node.names]
            else:
                continue
            for target in named:
                while target and target not in found:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target.split(".")[0] == root and target != name:
                    graph.add_edge(name, target)
    return graph


def test_graphkit_has_no_import_cycle():
    cycles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(import_graph(PACKAGE)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_finds_cycles_in_every_kind_of_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.b import B\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import A\n")
    (package / "c.py").write_text("import pkg.a\nimport os\n")
    graph = import_graph(package)
    assert set(graph.edges) == {
        ("pkg.a", "pkg.sub.b"),
        ("pkg.sub.b", "pkg.a"),
        ("pkg.sub", "pkg.sub.b"),
        ("pkg.c", "pkg.a"),
    }
    assert [sorted(c) for c in nx.simple_cycles(graph)] == [["pkg.a", "pkg.sub.b"]]


def test_the_family_registry_and_attention_import_no_family():
    graph = import_graph(PACKAGE)
    families = {"graphkit.families.gpt2", "graphkit.families.llama", "graphkit.families.vit", "graphkit.families"}
    for module in ["graphkit.families.registry", *(m for m in graph if m.startswith("graphkit.attention"))]:
        assert not families & nx.descendants(graph, module), module


#: graphkit's layers, lowest first, each by the modules it holds (a name, and everything under it
#: where it ends in ".*"): a module imports only from its own layer and those below (issue #46's
#: one-way house). What both training paths share (data sources, run folders, optimizer state,
#: the up-training loop) is ``graphkit.training``, below the hypernetwork and ``finetune``; what
#: reads a dataset and builds its records' models sits below the compiler and the hypernetwork,
#: and what generates datasets (recipes' runs, zoos, which ask the hypernetwork) above them.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["graphkit", "graphkit.errors", "graphkit.compat", "graphkit.validation", "graphkit.ops"]),
    ("files", ["graphkit.fileio", "graphkit.workers", "graphkit.modelfile"]),
    (
        "graphs and weights",
        ["graphkit.draw", "graphkit.graph", "graphkit.params", "graphkit.buffers", "graphkit.sources"],
    ),
    ("tracer", ["graphkit.tracing.*"]),
    ("attention", ["graphkit.attention.*"]),
    ("families", ["graphkit.families.*"]),
    (
        "datasets read",
        ["graphkit.datasets", "graphkit.datasets.store", "graphkit.datasets.dataset", "graphkit.datasets.pyg"]
        + [
            "graphkit.datasets.shrink",
            "graphkit.datasets.runs",
            "graphkit.datasets.recipes",
        ],
    ),
    ("compiler", ["graphkit.compiler.*"]),
    ("training", ["graphkit.training.*"]),
    ("hypernetwork", ["graphkit.ghn.*"]),
    (
        "datasets generated, up-training, conversion",
        ["graphkit.datasets.generate", "graphkit.datasets.zoo", "graphkit.finetune", "graphkit.conversion"],
    ),
    ("command line", ["graphkit.cli.*", "graphkit.__main__"]),
]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer that holds ``module``; a module no layer names fails."""
    held = [
        i
        for i, (_, names) in enumerate(LAYERS)
        for name in names
        if module == name.removesuffix(".*") or (name.endswith(".*") and module.startswith(name[:-1]))
    ]
    assert len(held) == 1, f"{module}: held by {len(held)} layers of LAYERS; name it in exactly one"
    return held[0]


def upward(graph: nx.DiGraph) -> list[str]:
    """Every import from a layer to one above it, as 'module (layer) -> module (layer)'."""
    return sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
        for a, b in graph.edges
        if layer_of(b) > layer_of(a)
    )


def test_imports_run_one_way_down_the_layers():
    graph = import_graph(PACKAGE)
    assert not upward(graph), "imports that run back up:\n" + "\n".join(upward(graph))
    # the arrows issue #46 found running both ways, gone for good
    for a, b in [("graphkit.ghn", "graphkit.finetune"), ("graphkit.compiler", "graphkit.datasets.zoo")]:
        assert not any(x.startswith(a) and y.startswith(b) for x, y in graph.edges), (a, b)


def test_an_import_up_a_layer_is_found():
    graph = nx.DiGraph(
        [("graphkit.ghn.evaluate", "graphkit.finetune"), ("graphkit.finetune", "graphkit.training.loop")]
    )
    assert upward(graph) == [
        "graphkit.ghn.evaluate (hypernetwork) -> graphkit.finetune (datasets generated, up-training, conversion)"
    ]


def raised_classes(path: Path) -> list[str]:
    """The error classes a module defines: classes named ``...Error`` or ``...NotFound``, or
    derived from one. A bare ``Exception`` subclass is a control-flow signal that never leaves
    its module (the tracer's ``Unknown`` and ``Untraced``, a probe's ``_Stop``), not an error."""

    def base_name(node: ast.expr) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    return [
        node.name
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
        and any(name.endswith(("Error", "NotFound")) for name in [node.name, *map(base_name, node.bases)])
    ]


def test_every_error_class_is_in_errors_py_under_the_one_base(tmp_path):

    elsewhere = {name: raised_classes(path) for name, path in modules(PACKAGE).items() if name != "graphkit.errors"}
    assert not {name: found for name, found in elsewhere.items() if found}, "error classes outside errors.py"
    gathered = raised_classes(PACKAGE / "errors.py")
    assert len(gathered) > 30
    assert all(issubclass(getattr(graphkit.errors, name), graphkit.errors.GraphkitError) for name in gathered)
    (tmp_path / "stray.py").write_text("class StrayError(ValueError):\n    pass\n")
    assert raised_classes(tmp_path / "stray.py") == ["StrayError"]  # the check finds one


def family_name_comparisons(source: str, names: set[str]) -> list[int]:
    """The lines of ``source`` that compare a value with one of ``names`` (``x == "vit"``,
    ``family in ("timm", "transformers")``): a caller branching on a family instead of asking it.
    A name looked up in a collection (``"transformers" in sys.modules``) is no such comparison."""

    def literal(node: ast.expr, in_collection: bool) -> set[str]:
        if not in_collection and isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if in_collection and isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            member = isinstance(op, (ast.In, ast.NotIn))
            if (literal(right, member) | (set() if member else literal(left, False))) & names:
                lines.append(node.lineno)
    return lines


def test_no_caller_branches_on_a_family_name():
    """Only a family's own file knows its name; everything else asks the registry (a Family's
    fields, a library family's model_key and task) or a table keyed by it."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "families" not in path.parts
        for line in family_name_comparisons(path.read_text(), set(FAMILIES))
    ]
    assert not found, "comparisons with a family's name: " + ", ".join(found)
    spelled = 'if kind == "timm" or family in ("vit", "gpt2"):\n    pass\nif "vit" in sys.modules:\n    pass\n'
    assert family_name_comparisons(spelled, {"timm", "vit"}) == [1, 1]

"""Drawing an ArchGraph top to bottom, as SVG, PNG or PDF, with no system binary required.

People read an architecture faster from a picture than from a node table. A drawing is made in
three steps:

1. :func:`fold_repeats` collapses consecutive identical blocks of a stack (``blocks.0`` ..
   ``blocks.11`` with the same ops, names up to their index, parameter shapes and attributes)
   into one block drawn inside a frame marked "x N"; a period of two (Swin's alternating
   shifted windows) folds too. ``expand=True`` draws every node.
2. A layered layout places the boxes: Graphviz's ``dot`` when it is on the PATH, otherwise
   grandalf's pure-Python Sugiyama layout (the same family of algorithm), so a fresh machine
   needs nothing beyond pip.
3. One renderer writes the boxes, frames and curved edges: SVG by hand (each node carries a
   ``<title>`` with its parameter shapes, shown on hover), PNG and PDF through matplotlib.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from xml.sax.saxutils import escape

from graphkit.errors import DrawError
from graphkit.fileio import check_output_file, marked_svg, save_figure, write_text_atomic
from graphkit.ops import attention_kind, window_text


class NodeLike(Protocol):
    """What a drawing reads from a node (:class:`graphkit.graph.Node`). ``ArchGraph.draw`` calls
    this module, so it names the graph's parts by what it needs instead of importing them back."""

    @property
    def name(self) -> str: ...

    @property
    def op(self) -> str: ...

    @property
    def module(self) -> str: ...

    @property
    def params(self) -> dict[str, tuple[int, ...]]: ...

    @property
    def attrs(self) -> dict[str, Any]: ...

    @property
    def num_params(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


class GraphLike(Protocol):
    """What a drawing reads from a graph (:class:`graphkit.graph.ArchGraph`)."""

    @property
    def nodes(self) -> Sequence[NodeLike]: ...

    @property
    def edges(self) -> Sequence[tuple[int, int]]: ...

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def num_params(self) -> int: ...


#: file types :func:`draw` writes
SUFFIXES = (".svg", ".png", ".pdf")
#: a PNG's longest side, in pixels (Agg's canvas holds 2^16; a longer picture would be unreadable)
MAX_PNG_SIDE = 32768

Point = tuple[float, float]

# fill and outline colour of each kind of op
_COLOURS = {
    "io": ("#e8e8e8", "#6b6b6b"),
    "attention": ("#f9c98f", "#b86b12"),
    "moe": ("#efb3d9", "#a0357a"),
    "linear": ("#b7d3f2", "#2f6ca8"),
    "norm": ("#c5e6b8", "#3f8a2a"),
    "activation": ("#fbe7a0", "#a88a12"),
    "embedding": ("#dacbf2", "#6a4aa8"),
    "elementwise": ("#eeeeee", "#8c8c8c"),
    "other": ("#f6b7b7", "#b03030"),
}
_KIND_OF_OP = {
    **dict.fromkeys(("input", "output"), "io"),
    **dict.fromkeys(("linear", "head", "conv", "patch_embed"), "linear"),
    **dict.fromkeys(("embedding", "pos_embedding", "class_token", "rotary_embedding", "alibi"), "embedding"),
    **dict.fromkeys(("gelu", "silu", "relu", "tanh", "sigmoid", "softmax", "softcap"), "activation"),
}
_FONT = "Helvetica, Arial, sans-serif"
_SIZES = {"op": 12.0, "name": 10.0, "detail": 10.0}  # font size of each label line, in points
_LINE = 14.0  # label line height
_PAD = 10.0  # box padding
_FRAME_PAD = 12.0  # space between a frame and the boxes it holds
_MARGIN = 24.0
_HEADER = 44.0
_MAX_NAME = 40  # longer node names are shortened in the middle


def op_kind(op: str) -> str:
    """The colour group of an op: io, attention, moe, linear, norm, activation, embedding,
    elementwise or other (``other:`` ATen ops)."""
    if op.startswith("other:"):
        return "other"
    if op in _KIND_OF_OP:
        return _KIND_OF_OP[op]
    for word in ("attention", "moe", "norm"):
        if word in op:
            return word
    return "elementwise"


# -- what is drawn ---------------------------------------------------------------------------
@dataclass
class Box:
    """One drawn node: its label lines (style, text), hover text, colour group, size and centre."""

    node: NodeLike
    lines: list[tuple[str, str]]
    tooltip: str
    kind: str
    w: float = 0.0
    h: float = 0.0
    x: float = 0.0
    y: float = 0.0


@dataclass
class Frame:
    """A folded run of blocks: the boxes of its representative block(s), "x count", and the
    index of the innermost frame it lies in (outer frames come first)."""

    label: str
    count: int
    members: list[int]
    parent: int | None = None
    bounds: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # x0, y0, x1, y1


@dataclass
class Scene:
    """Boxes, edges between box indices, frames, and after layout the edge curves (cubic
    Bezier control points: start, then three points per segment) and the canvas size."""

    title: str
    boxes: list[Box]
    edges: list[tuple[int, int]]
    frames: list[Frame]
    expanded: bool = False
    curves: list[list[Point]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0
    layout: str = ""


@dataclass(frozen=True)
class Drawing:
    """What :func:`draw` wrote: the file, the layout engine used (and why), the numbers of
    boxes and folded runs."""

    path: Path
    layout: str
    boxes: int
    folded: int


# -- folding repeated blocks -----------------------------------------------------------------
_INDEX = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


def _block_of(module: str, stack: str) -> int | None:
    """Index of the block of ``stack`` (a module path, "" for the root) that ``module`` lies in."""
    rest = module[len(stack) + 1 :] if stack else module
    if stack and not module.startswith(stack + "."):
        return None
    head = rest.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _relative(value: Any, stack: str, index: int) -> Any:
    """``value`` with the block path ``stack.index`` replaced by ``stack.#`` in every string."""
    if isinstance(value, str):
        prefix = f"{stack}.{index}" if stack else str(index)
        return re.sub(rf"^{re.escape(prefix)}(?=$|[._])", f"{stack}.#", value)
    if isinstance(value, dict):
        return {
            k if not isinstance(k, str) else _relative(k, stack, index): _relative(v, stack, index)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_relative(v, stack, index) for v in value]
    return value


def _block_signature(
    nodes: Sequence[NodeLike], members: list[int], edges: set[tuple[int, int]], stack: str, index: int
) -> str:
    """What must match for two blocks to fold: their nodes with the block path made relative,
    and the edges among them."""
    local = {n: i for i, n in enumerate(members)}
    body = [_relative(nodes[n].to_dict(), stack, index) for n in members]
    inner = sorted((local[s], local[d]) for s, d in edges if s in local and d in local)
    return json.dumps([body, inner], sort_keys=True)


def _acyclic(alive: set[int], edges: set[tuple[int, int]]) -> bool:
    """Whether the nodes ``alive`` with ``edges`` still form a DAG (Kahn's algorithm)."""
    indegree = dict.fromkeys(alive, 0)
    succ: dict[int, list[int]] = {n: [] for n in alive}
    for s, d in edges:
        succ[s].append(d)
        indegree[d] += 1
    ready = [n for n, k in indegree.items() if k == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for d in succ[n]:
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    return seen == len(alive)


def _runs(signatures: list[str]) -> list[tuple[int, int, int]]:
    """(start, period, repeats) of every run of at least two repeats of one block (period 1)
    or of a pair of blocks (period 2), left to right."""
    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < len(signatures):
        for period in (1, 2):
            unit = signatures[i : i + period]
            repeats = 1
            while signatures[i + repeats * period : i + (repeats + 1) * period] == unit:
                repeats += 1
            if repeats >= 2 and len(unit) == period:
                runs.append((i, period, repeats))
                i += period * repeats
                break
        else:
            i += 1
    return runs


def fold_repeats(graph: GraphLike) -> tuple[list[int], list[tuple[int, int]], list[Frame]]:
    """Collapse runs of identical consecutive blocks to their first block (or first pair).

    Returns the kept node indices (in order), the edges between them (an edge into or out of a
    dropped block is moved to the kept block's matching node; edges from one repeat to the
    next are dropped) and one :class:`Frame` per run, with members as indices into the kept
    list. Stacks are found from module paths (``<stack>.<index>.*``), outermost first; a run
    whose collapse would make a cycle (something outside the run between two repeats) stays
    expanded.
    """
    nodes = graph.nodes
    alive = set(range(len(nodes)))
    edges = set(graph.edges)
    stacks = sorted(
        {node.module[: m.start()] for node in nodes for m in _INDEX.finditer(node.module)},
        key=lambda s: (s.count(".") + bool(s), s),
    )
    runs: list[tuple[str, list[int], int]] = []  # label, nodes of the kept block(s), repeats
    for stack in stacks:
        blocks: dict[int, list[int]] = {}
        for n in sorted(alive):
            index = _block_of(nodes[n].module, stack)
            if index is not None:
                blocks.setdefault(index, []).append(n)
        indices = sorted(blocks)
        if len(indices) < 2 or indices != list(range(indices[0], indices[0] + len(indices))):
            continue
        signatures = [_block_signature(nodes, blocks[i], edges, stack, i) for i in indices]
        for start, period, repeats in _runs(signatures):
            run = indices[start : start + period * repeats]
            position = {n: (k, j) for k, b in enumerate(run) for j, n in enumerate(blocks[b])}
            to_kept = {n: blocks[run[k % period]][j] for n, (k, j) in position.items()}
            folded = set()
            for s, d in edges:
                if s in position and d in position and position[s][0] // period != position[d][0] // period:
                    continue  # one repeat feeding the next
                folded.add((to_kept.get(s, s), to_kept.get(d, d)))
            kept_alive = alive - {n for n, (k, _) in position.items() if k >= period}
            folded = {(s, d) for s, d in folded if s != d}
            if not _acyclic(kept_alive, folded):
                continue
            alive, edges = kept_alive, folded
            members = [n for b in run[:period] for n in blocks[b]]
            name = f"{stack}." if stack else ""
            unit = "" if period == 1 else " (pairs of blocks)"
            runs.append((f"{name}{run[0]}–{run[-1]}{unit}", members, repeats))
    kept = sorted(alive)
    index_of = {n: i for i, n in enumerate(kept)}
    frames: list[Frame] = []
    for label, members, repeats in runs:
        boxes = [index_of[n] for n in members if n in index_of]
        parent = next((j for j in reversed(range(len(frames))) if set(boxes) <= set(frames[j].members)), None)
        frames.append(Frame(label, repeats, boxes, parent))
    return kept, sorted((index_of[s], index_of[d]) for s, d in edges), frames


# -- labels ----------------------------------------------------------------------------------
def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(d) for d in shape) or "scalar"


def _short(name: str) -> str:
    if len(name) <= _MAX_NAME:
        return name
    half = (_MAX_NAME - 1) // 2
    return name[:half] + "…" + name[-half:]


#: boolean attention attrs and how a box shows them
_ATTENTION_FLAGS = (
    ("rope", "rope"),
    ("alibi", "alibi"),
    ("softcap", "softcap"),
    ("talking_heads", "talking-heads"),
    ("class_attention", "class-attn"),
    ("latent_query", "latent query"),
)


def _details(node: NodeLike) -> list[str]:
    """The op-specific facts worth reading without hovering."""
    a = node.attrs
    if node.op == "attention":
        facts = [
            f"{label} {a[key]}"
            for key, label in (("heads", "heads"), ("kv_heads", "kv"), ("head_dim", "d"))
            if a.get(key) is not None
        ]
        window = [f"{'shifted ' * bool(a.get('shifted'))}window {window_text(a['window'])}"] if a.get("window") else []
        flags = ["causal"] * bool(a.get("causal")) + window
        flags += [label for flag, label in _ATTENTION_FLAGS if a.get(flag)]
        return [" · ".join(group) for group in (facts, flags) if group]
    if node.op in ("roll", "pad"):  # shifts, or pad amounts
        return [f"{key} {', '.join(map(str, amounts))}" for key, amounts in a.items()]
    if op_kind(node.op) == "moe":  # the router records k, an MoE node num_experts and top_k
        experts, top_k = a.get("num_experts", a.get("experts")), a.get("top_k", a.get("k"))
        facts = ([f"experts {experts}"] if experts is not None else []) + (
            [f"top-{top_k}"] if top_k is not None else []
        )
        return [" · ".join(facts)] if facts else []
    if "in_features" in a and "out_features" in a:
        return [f"{a['in_features']} → {a['out_features']}"]
    if node.params:
        return [_shape(max(node.params.values(), key=len))]
    return []


def _box(node: NodeLike) -> Box:
    head = node.op
    if node.op == "attention":
        head = f"attention · {attention_kind(node.attrs)}"
    lines = [("op", head)]
    if node.name != node.op:
        lines.append(("name", _short(node.name)))
    lines += [("detail", text) for text in _details(node)]
    tooltip = [f"{node.name} ({node.op}, {node.num_params:,} parameters)"]
    tooltip += [f"{p}: [{', '.join(map(str, s))}]" for p, s in node.params.items()]
    tooltip += [f"{k} = {v}" for k, v in node.attrs.items() if v not in (None, False)]
    width = max(len(text) * _SIZES[style] * (0.62 if style == "op" else 0.58) for style, text in lines) + 2 * _PAD
    return Box(
        node=node,
        lines=lines,
        tooltip="\n".join(tooltip),
        kind=op_kind(node.op),
        w=max(width, 96.0),
        h=len(lines) * _LINE + _PAD,
    )


def build_scene(graph: GraphLike, expand: bool = False) -> Scene:
    """The boxes, edges and frames to draw, before layout."""
    if expand:
        kept, edges, frames = list(range(len(graph.nodes))), list(graph.edges), list[Frame]()
    else:
        kept, edges, frames = fold_repeats(graph)
    boxes = [_box(graph.nodes[n]) for n in kept]
    meta = graph.meta
    model = str(meta.get("model_class", "model")).rsplit(".", 1)[-1]
    title = f"{model} · {graph.num_params:,} parameters · {len(graph.nodes)} nodes"
    return Scene(title=title, boxes=boxes, edges=edges, frames=frames, expanded=expand)


# -- layout ----------------------------------------------------------------------------------
def _through(points: list[Point]) -> list[Point]:
    """Bezier control points of a smooth top-to-bottom curve through ``points``."""
    curve = [points[0]]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        dy = (y1 - y0) / 2
        curve += [(x0, y0 + dy), (x1, y1 - dy), (x1, y1)]
    return curve


def _grandalf_layout(scene: Scene) -> None:
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    class View:
        def __init__(self, w: float = 0.0, h: float = 0.0) -> None:
            self.w, self.h, self.xy = w, h, (0.0, 0.0)
            self.path: list[Point] = []

        def setpath(self, points: list[Point]) -> None:
            self.path = points

    vertices = [Vertex(i) for i in range(len(scene.boxes))]
    for vertex, box in zip(vertices, scene.boxes):
        vertex.view = View(box.w, box.h)
    edges = [Edge(vertices[s], vertices[d]) for s, d in scene.edges]
    for edge in edges:
        edge.view = View()
    offset = 0.0
    for component in Graph(vertices, edges).C:
        sugiyama = SugiyamaLayout(component)
        sugiyama.xspace, sugiyama.yspace = 24, 30
        sugiyama.init_all(roots=[v for v in component.sV if not v.e_in()])
        sugiyama.draw()
        shift = offset - min(v.view.xy[0] - v.view.w / 2 for v in component.sV)
        for v in component.sV:
            v.view.xy = (v.view.xy[0] + shift, v.view.xy[1])
            box = scene.boxes[v.data]
            box.x, box.y = v.view.xy
        offset = max(v.view.xy[0] + v.view.w / 2 for v in component.sV) + 40
        for e in component.sE:  # routed in the component's own coordinates
            e.view.path = [(x + shift, y) for x, y in e.view.path]
    stretch = _room_for_frames(scene)
    for box in scene.boxes:
        box.y += stretch(box.y - box.h / 2)
    for (s, d), edge in zip(scene.edges, edges):
        src, dst = scene.boxes[s], scene.boxes[d]
        bends = [(x, y + stretch(y)) for x, y in edge.view.path[1:-1]]
        scene.curves.append(_through([(src.x, src.y + src.h / 2), *bends, (dst.x, dst.y - dst.h / 2)]))


def _room_for_frames(scene: Scene) -> Callable[[float], float]:
    """How far down to move a point at height y so that every frame gets room for its label
    above its boxes and a margin below them (grandalf knows nothing of frames; dot does)."""
    tops, bottoms = [], []
    for frame in scene.frames:
        tops.append(min(scene.boxes[m].y - scene.boxes[m].h / 2 for m in frame.members))
        bottoms.append(max(scene.boxes[m].y + scene.boxes[m].h / 2 for m in frame.members))

    def stretch(y: float) -> float:
        return (_FRAME_PAD + _LINE) * sum(top <= y for top in tops) + _FRAME_PAD * sum(bottom < y for bottom in bottoms)

    return stretch


def dot_source(scene: Scene) -> str:
    """The scene as Graphviz DOT: fixed-size boxes named ``n<index>``, frames as nested clusters."""
    lines = ["digraph G {", "rankdir=TB; nodesep=0.3; ranksep=0.4;", 'node [shape=box, fixedsize=true, label=""];']
    for i, box in enumerate(scene.boxes):
        lines.append(f"n{i} [width={box.w / 72:.3f}, height={box.h / 72:.3f}];")

    def emit(index: int | None) -> set[int]:
        """Write the frames inside frame ``index`` (None: the top level) as nested clusters."""
        placed: set[int] = set()
        for j, frame in enumerate(scene.frames):
            if frame.parent == index:
                lines.append(f"subgraph cluster_{j} {{ margin={_FRAME_PAD + _LINE:.0f};")
                inner = emit(j)
                lines.extend(f"n{m};" for m in frame.members if m not in inner)
                lines.append("}")
                placed |= inner | set(frame.members)
        return placed

    emit(None)
    lines += [f"n{s} -> n{d};" for s, d in scene.edges]
    return "\n".join(lines + ["}"])


def _dot_layout(scene: Scene, dot: str) -> None:
    """Place boxes and route edges with Graphviz (``dot -Tplain``: inches, y pointing up)."""
    result = subprocess.run(
        [dot, "-Tplain"], input=dot_source(scene), capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        raise DrawError(f"dot failed: {' '.join(result.stderr.split())[:200] or f'exit status {result.returncode}'}")
    height = 0.0
    for line in result.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["graph"]:
            height = float(fields[3])
        elif fields[:1] == ["node"]:
            box = scene.boxes[int(fields[1][1:])]
            box.x, box.y = float(fields[2]) * 72, (height - float(fields[3])) * 72
        elif fields[:1] == ["edge"]:
            count = int(fields[3])
            coords = [float(v) for v in fields[4 : 4 + 2 * count]]
            scene.curves.append([(x * 72, (height - y) * 72) for x, y in zip(coords[::2], coords[1::2])])


def layout(scene: Scene) -> None:
    """Place the scene's boxes and frames, route its edges and size its canvas; records in
    ``scene.layout`` which engine did it and why."""
    dot = shutil.which("dot")
    try:
        if not dot:
            raise DrawError("dot not found")
        _dot_layout(scene, dot)
        scene.layout = f"graphviz dot ({dot})"
    except (DrawError, OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        scene.curves = []
        _grandalf_layout(scene)
        scene.layout = f"grandalf ({e})"
    for i in reversed(range(len(scene.frames))):  # inner frames first: outer ones go around them
        frame = scene.frames[i]
        members = set(frame.members)
        corners = [
            (b.x + sx * b.w / 2, b.y + sy * b.h / 2)
            for b in (scene.boxes[m] for m in members)
            for sx in (-1, 1)
            for sy in (-1, 1)
        ]
        # the bends of the edges into and out of its boxes at the height of its boxes; an edge
        # from far above (a rotary table feeding a run after a different first block) enters it
        top, bottom = min(y for _, y in corners), max(y for _, y in corners)
        corners += [
            p
            for (s, d), curve in zip(scene.edges, scene.curves)
            if s in members or d in members
            for p in curve[3:-1:3]
            if top <= p[1] <= bottom
        ]
        corners += [
            corner for inner in scene.frames if inner.parent == i for corner in (inner.bounds[:2], inner.bounds[2:])
        ]
        xs, ys = [x for x, _ in corners], [y for _, y in corners]
        frame.bounds = (min(xs) - _FRAME_PAD, min(ys) - _FRAME_PAD - _LINE, max(xs) + _FRAME_PAD, max(ys) + _FRAME_PAD)
    bends = [p for curve in scene.curves for p in curve[3:-1:3]]  # an edge may run outside every box and frame
    xs = [b.x - b.w / 2 for b in scene.boxes] + [f.bounds[0] for f in scene.frames] + [x for x, _ in bends]
    ys = [b.y - b.h / 2 for b in scene.boxes] + [f.bounds[1] for f in scene.frames]
    dx, dy = _MARGIN - min(xs), _MARGIN + _HEADER - min(ys)
    for box in scene.boxes:
        box.x, box.y = box.x + dx, box.y + dy
    for frame in scene.frames:
        x0, y0, x1, y1 = frame.bounds
        frame.bounds = (x0 + dx, y0 + dy, x1 + dx, y1 + dy)
    scene.curves = [[(x + dx, y + dy) for x, y in curve] for curve in scene.curves]
    scene.width = (
        max([b.x + b.w / 2 for b in scene.boxes] + [f.bounds[2] for f in scene.frames] + [x + dx for x, _ in bends])
        + _MARGIN
    )
    scene.width = max(scene.width, max(len(scene.title) * 14 * 0.62, len(_subtitle(scene)) * 11 * 0.58) + 2 * _MARGIN)
    scene.height = max([b.y + b.h / 2 for b in scene.boxes] + [f.bounds[3] for f in scene.frames]) + _MARGIN


# -- writers ---------------------------------------------------------------------------------
def _line_offsets(box: Box) -> list[float]:
    """Baseline-centred y of each label line, relative to the box centre."""
    top = -(len(box.lines) - 1) * _LINE / 2
    return [top + k * _LINE for k in range(len(box.lines))]


def _frame_count_width(frame: Frame) -> float:
    """Room for a frame's bold "x N" before its label."""
    return len(f"x {frame.count}") * 12 * 0.62 + 6


def _subtitle(scene: Scene) -> str:
    folding = (
        "every block drawn" if scene.expanded or not scene.frames else "repeated blocks folded (--expand to unfold)"
    )
    return f"{folding} · layout: {scene.layout}"


def _svg(scene: Scene) -> str:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width:.0f}" height="{scene.height:.0f}" '
        f'viewBox="0 0 {scene.width:.1f} {scene.height:.1f}" font-family="{_FONT}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{_MARGIN}" y="{_MARGIN + 4}" font-size="14" font-weight="bold">{escape(scene.title)}</text>',
        f'<text x="{_MARGIN}" y="{_MARGIN + 22}" font-size="11" fill="#555">{escape(_subtitle(scene))}</text>',
    ]
    for frame in scene.frames:
        x0, y0, x1, y1 = frame.bounds
        out.append(
            f'<g class="repeat"><title>{escape(frame.label)} x {frame.count}</title>'
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="10" '
            'fill="#f5f6fb" stroke="#7a7fa8" stroke-width="1.5" stroke-dasharray="6 3"/>'
            f'<text x="{x0 + 8:.1f}" y="{y0 + _LINE:.1f}" font-size="12" font-weight="bold" fill="#3d4270">'
            f"x {frame.count}</text>"
            f'<text x="{x0 + 8 + _frame_count_width(frame):.1f}" y="{y0 + _LINE:.1f}" font-size="10" fill="#3d4270">'
            f"{escape(frame.label)}</text></g>"
        )
    for curve in scene.curves:
        d = f"M{curve[0][0]:.1f},{curve[0][1]:.1f} " + " ".join(
            f"C{a[0]:.1f},{a[1]:.1f} {b[0]:.1f},{b[1]:.1f} {c[0]:.1f},{c[1]:.1f}"
            for a, b, c in zip(curve[1::3], curve[2::3], curve[3::3])
        )
        out.append(
            f'<path class="edge" d="{d}" fill="none" stroke="#555" stroke-width="1.2" marker-end="url(#arrow)"/>'
        )
    for i, box in enumerate(scene.boxes):
        fill, stroke = _COLOURS[box.kind]
        out.append(
            f'<g class="node" id="node{i}"><title>{escape(box.tooltip)}</title>'
            f'<rect x="{box.x - box.w / 2:.1f}" y="{box.y - box.h / 2:.1f}" width="{box.w:.1f}" '
            f'height="{box.h:.1f}" rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.2"/>'
        )
        for (style, text), dy in zip(box.lines, _line_offsets(box)):
            weight = ' font-weight="bold"' if style == "op" else ""
            colour = "#111" if style == "op" else "#333"
            out.append(
                f'<text x="{box.x:.1f}" y="{box.y + dy:.1f}" dy="0.35em" text-anchor="middle" '
                f'font-size="{_SIZES[style]:g}" fill="{colour}"{weight}>{escape(text)}</text>'
            )
        out.append("</g>")
    return "\n".join(out + ["</svg>"]) + "\n"


def _png_scale(scene: Scene) -> float | None:
    """Pixels per point of the scene's PNG: 2, or less for a large scene, down to 1 (10-point
    labels 10 pixels tall, the smallest that stays readable); None below that."""
    scale = min(2.0, MAX_PNG_SIDE / max(scene.width, scene.height))
    return scale if scale >= 1.0 else None


def _matplotlib(scene: Scene, path: Path, format: str) -> None:
    """Draw the laid-out scene with matplotlib to ``path``, one point per SVG unit (PNG at 1 to 2
    pixels a point), atomically and marked as graphkit's drawing."""
    from matplotlib.figure import Figure  # not pyplot: a notebook's backend stays as it is
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MplPath

    scale = _png_scale(scene) if format == "png" else 1.0
    assert scale is not None, "draw() refuses a PNG too large to read before it gets here"
    fig = Figure(figsize=(scene.width / 72, scene.height / 72), dpi=72 * scale)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, scene.width)
    ax.set_ylim(scene.height, 0)
    ax.axis("off")
    ax.text(_MARGIN, _MARGIN + 4, scene.title, fontsize=14, fontweight="bold", va="baseline")
    ax.text(_MARGIN, _MARGIN + 22, _subtitle(scene), fontsize=11, color="#555", va="baseline")
    for frame in scene.frames:
        x0, y0, x1, y1 = frame.bounds
        ax.add_patch(
            FancyBboxPatch(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                boxstyle="round,pad=0,rounding_size=10",
                facecolor="#f5f6fb",
                edgecolor="#7a7fa8",
                linewidth=1.5,
                linestyle=(0, (6, 3)),
            )
        )
        ax.text(x0 + 8, y0 + _LINE, f"x {frame.count}", fontsize=12, fontweight="bold", color="#3d4270", va="baseline")
        ax.text(
            x0 + 8 + _frame_count_width(frame), y0 + _LINE, frame.label, fontsize=10, color="#3d4270", va="baseline"
        )
    for curve in scene.curves:
        codes = [MplPath.MOVETO] + [MplPath.CURVE4] * (len(curve) - 1)
        ax.add_patch(
            FancyArrowPatch(
                path=MplPath(curve, codes),
                arrowstyle="-|>",
                mutation_scale=10,
                color="#555",
                linewidth=1.2,
                shrinkA=0,
                shrinkB=0,
            )
        )
    for box in scene.boxes:
        fill, stroke = _COLOURS[box.kind]
        ax.add_patch(
            FancyBboxPatch(
                (box.x - box.w / 2, box.y - box.h / 2),
                box.w,
                box.h,
                boxstyle="round,pad=0,rounding_size=6",
                facecolor=fill,
                edgecolor=stroke,
                linewidth=1.2,
                zorder=3,
            )
        )
        for (style, text), dy in zip(box.lines, _line_offsets(box)):
            ax.text(
                box.x,
                box.y + dy,
                text,
                fontsize=_SIZES[style],
                ha="center",
                va="center",
                zorder=4,
                fontweight="bold" if style == "op" else "normal",
                color="#111" if style == "op" else "#333",
            )
    save_figure(fig, path, "drawing", dpi=72 * scale, facecolor="white")


def draw(graph: GraphLike, path: str | Path, *, expand: bool = False) -> Drawing:
    """Draw ``graph`` top to bottom to ``path`` (.svg, .png or .pdf, written atomically).

    Repeated blocks are folded into one frame marked "x N" unless ``expand``. Attention boxes
    show their variant and head counts, mixture-of-experts boxes their experts and top-k; in
    SVG, hovering a box shows its parameters' shapes. Graphviz's ``dot`` lays the graph out
    when installed, grandalf otherwise (``Drawing.layout`` says which).
    """
    path = check_output_file(path, "draw path", SUFFIXES, kind="drawing")
    if not graph.nodes:
        raise DrawError(f"{path}: nothing to draw, the graph has no nodes")
    scene = build_scene(graph, expand)
    layout(scene)
    suffix = path.suffix.lower()
    if suffix == ".png" and _png_scale(scene) is None:
        raise DrawError(
            f"{path}: the drawing is {scene.width:,.0f} x {scene.height:,.0f} points, too large for a PNG "
            f"with readable labels (at most {MAX_PNG_SIDE:,} pixels a side); write it as .svg or .pdf"
            + (", or fold its repeated blocks (without --expand)" if expand else "")
        )
    if suffix == ".svg":
        write_text_atomic(path, marked_svg("drawing", _svg(scene)))
    else:
        _matplotlib(scene, path, suffix[1:])
    return Drawing(path=path, layout=scene.layout, boxes=len(scene.boxes), folded=len(scene.frames))


__all__ = ["SUFFIXES", "DrawError", "Drawing", "draw", "fold_repeats", "build_scene", "layout", "op_kind"]

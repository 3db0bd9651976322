"""`graphkit draw` and `ArchGraph.draw`: folded and expanded drawings, SVG/PNG/PDF, the dot and
grandalf layouts, and every bad input through the CLI."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

import pytest
from helpers import ROOT, gpt2
from typer.testing import CliRunner

import graphkit
from graphkit import ArchGraph, Node
from graphkit.cli import app
from graphkit.datasets.store import graph_to_row, write_dataset
from graphkit.draw import DrawError, build_scene, dot_source, fold_repeats
from graphkit.families import build_model, resolve_config
from graphkit.fileio import OutputError
from graphkit.modelfile import load_model_file

runner = CliRunner()
LLAMA = ROOT / "examples" / "llama_block.py"  # TinyLlama: 4 identical GQA blocks
SVG = "{http://www.w3.org/2000/svg}"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True)
def no_dot(monkeypatch):
    """Lay out with grandalf whatever this machine has installed (the dot test installs a fake)."""
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.fixture(scope="module")
def llama_graph():

    loaded = load_model_file(LLAMA)
    return graphkit.trace(loaded.model, loaded.example_inputs)


def svg_parts(path):
    """(node groups, repeat frame texts) of an SVG drawing; parsing proves it well-formed."""
    root = ET.parse(path).getroot()
    nodes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    frames = [
        " ".join(t.text for t in g.iter(f"{SVG}text")) for g in root.iter(f"{SVG}g") if g.get("class") == "repeat"
    ]
    return nodes, frames


def chain(modules: list[tuple[str, str]]) -> ArchGraph:
    """input -> one node per (op, module) in order -> output."""
    nodes = (
        [Node("input", "input")]
        + [Node(op, f"{module}.{op}", module) for op, module in modules]
        + [Node("output", "output")]
    )
    return ArchGraph(nodes, [(i, i + 1) for i in range(len(nodes) - 1)])


def test_cli_draws_folded_svg_with_attention_and_hover_shapes(tmp_path, llama_graph):
    out = tmp_path / "llama.svg"
    result = run("draw", LLAMA, "--out", out)
    assert result.exit_code == 0, result.output
    assert "layout: grandalf (dot not found)" in result.stdout
    kept, _, frames = fold_repeats(llama_graph)
    block = [n for n in llama_graph.nodes if n.module.startswith("blocks.0")]
    assert len(kept) == len(llama_graph.nodes) - 3 * len(block)
    nodes, frame_texts = svg_parts(out)
    assert len(nodes) == len(kept)
    assert frame_texts == ["x 4 blocks.0–3"]
    titles = [g.find(f"{SVG}title").text for g in nodes]
    assert any("blocks.0.attn.wk.weight: [32, 128]" in t for t in titles)  # parameter shapes on hover
    texts = [t.text for g in nodes for t in g.iter(f"{SVG}text")]
    assert "attention · GQA" in texts and "heads 8 · kv 2 · d 16" in texts and "causal · rope" in texts
    assert f"wrote {out} ({len(kept)} boxes for {len(llama_graph.nodes)} nodes, 1 folded repeat)" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.svg"]


def test_expand_draws_every_node(tmp_path, llama_graph):
    out = tmp_path / "llama.svg"
    assert run("draw", LLAMA, "--out", out, "--expand").exit_code == 0
    nodes, frames = svg_parts(out)
    assert len(nodes) == len(llama_graph.nodes) and frames == []
    assert {g.find(f"{SVG}title").text.split(" (")[0] for g in nodes} == {n.name for n in llama_graph.nodes}


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".pdf", b"%PDF")])
def test_png_and_pdf(tmp_path, llama_graph, suffix, magic):
    import matplotlib

    backend = matplotlib.get_backend()
    drawing = llama_graph.draw(tmp_path / f"g{suffix}")
    assert matplotlib.get_backend() == backend  # a notebook keeps its backend
    data = drawing.path.read_bytes()
    assert data.startswith(magic) and len(data) > 10_000
    assert drawing.layout == "grandalf (dot not found)" and drawing.folded == 1


def test_python_api_on_a_gpt2(tmp_path):
    graph = graphkit.trace(gpt2(layers=3))
    drawing = graph.draw(tmp_path / "gpt2.svg")
    nodes, frames = svg_parts(drawing.path)
    assert frames == ["x 3 transformer.h.0–2"] and len(nodes) == drawing.boxes == len(fold_repeats(graph)[0])
    with pytest.raises(
        OutputError, match=r"^draw path .*g\.jpg: unsupported extension '\.jpg'; accepted: \.svg, \.png, \.pdf$"
    ):
        graph.draw(tmp_path / "g.jpg")
    with pytest.raises(DrawError, match=r"empty\.svg: nothing to draw, the graph has no nodes$"):
        ArchGraph([], []).draw(tmp_path / "empty.svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.svg"]


def test_runs_of_one_block_and_of_pairs_fold_and_a_different_block_stays():
    graph = chain(
        [("gelu", f"s.{i}") for i in range(3)]
        + [("relu", "s.3")]
        + [("gelu" if i % 2 else "relu", f"t.{i}") for i in range(6)]
    )
    kept, edges, frames = fold_repeats(graph)
    assert [(f.label, f.count, len(f.members)) for f in frames] == [("s.0–2", 3, 1), ("t.0–5 (pairs of blocks)", 3, 2)]
    assert [graph.nodes[n].name for n in kept] == ["input", "s.0.gelu", "s.3.relu", "t.0.relu", "t.1.gelu", "output"]
    assert edges == [(i, i + 1) for i in range(5)]


def test_a_run_with_something_between_its_blocks_is_not_folded():
    graph = chain([("gelu", "s.0"), ("gelu", "s.1"), ("relu", "between"), ("gelu", "s.2")])
    kept, _, frames = fold_repeats(graph)
    assert frames == [] and len(kept) == len(graph.nodes)


def test_moe_boxes_show_experts_and_top_k(tmp_path):
    nodes = [
        Node("input", "input"),
        Node("moe_router", "m.router", "m", attrs={"k": 2}),
        Node("moe", "m.moe", "m", attrs={"num_experts": 8, "top_k": 2}),
        Node("output", "output"),
    ]
    drawing = ArchGraph(nodes, [(0, 1), (1, 2), (2, 3)]).draw(tmp_path / "moe.svg")
    texts = [t.text for t in ET.parse(drawing.path).getroot().iter(f"{SVG}text")]
    assert "top-2" in texts and "experts 8 · top-2" in texts


def test_uses_dot_when_installed_and_grandalf_when_it_fails(tmp_path, monkeypatch, llama_graph):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dot = bin_dir / "dot"  # stands in for Graphviz: one node per rank, straight edges, in -Tplain
    dot.write_text(f"""#!{sys.executable}
import re, sys
source = sys.stdin.read()
if "subgraph cluster_0" not in source:
    sys.exit("no cluster")
ids = [int(i) for i in re.findall(r"^n(\\d+) \\[", source, re.M)]
print(f"graph 1 10 {{len(ids) + 1}}")
for i in ids:
    print(f"node n{{i}} 5 {{len(ids) - i}} 2 0.5 \\"\\" solid box black lightgrey")
for s, d in re.findall(r"^n(\\d+) -> n(\\d+);", source, re.M):
    ys = [len(ids) - int(s) - 0.25, len(ids) - int(d) + 0.25]
    print(f"edge n{{s}} n{{d}} 4 5 {{ys[0]}} 5 {{ys[0]}} 5 {{ys[1]}} 5 {{ys[1]}} solid black")
print("stop")
""")
    dot.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    drawing = llama_graph.draw(tmp_path / "dot.svg")
    assert drawing.layout == f"graphviz dot ({dot})"
    nodes, frames = svg_parts(drawing.path)
    assert len(nodes) == drawing.boxes and frames == ["x 4 blocks.0–3"]
    dot.write_text("#!/bin/sh\necho 'syntax error in line 1' >&2\nexit 1\n")
    drawing = llama_graph.draw(tmp_path / "fallback.svg")
    assert drawing.layout == "grandalf (dot failed: syntax error in line 1)"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    config = resolve_config(dict(family="vit", num_layers=3, hidden=64, heads=2, image_size=16, patch_size=4))
    out = tmp_path_factory.mktemp("ds") / "tiny"
    write_dataset(
        [graph_to_row(graphkit.trace(build_model(config)), config, id="tiny-00000", split="train")], out, name="tiny"
    )
    return out


def test_draws_a_dataset_record(tmp_path, dataset):
    out = tmp_path / "rec.svg"
    result = run("draw", dataset, "tiny-00000", "--out", out)
    assert result.exit_code == 0, result.output
    assert svg_parts(out)[1] == ["x 3 blocks.0–2"]


def test_draws_a_graph_json(tmp_path, llama_graph):
    (tmp_path / "g.json").write_text(llama_graph.to_json())
    result = run("draw", tmp_path / "g.json", "--out", tmp_path / "g.svg")
    assert result.exit_code == 0, result.output
    assert svg_parts(tmp_path / "g.svg")[1] == ["x 4 blocks.0–3"]


def error_of(result) -> str:
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py", "--out", "g.svg"], "error: missing.py: no such file"),
        (["{llama}", "--out", "g.txt"], "error: --out g.txt: unsupported extension '.txt'; accepted: .svg, .png, .pdf"),
        (["{llama}", "--out", "g"], "error: --out g: unsupported extension '(none)'; accepted: .svg, .png, .pdf"),
        (["{llama}", "--out", "folder.svg"], "error: --out folder.svg: is a folder; give a file name"),
        (["{llama}", "--out", "file.txt/g.svg"], "error: --out file.txt/g.svg: {cwd}/file.txt is a file, not a folder"),
        (
            ["{dataset}", "--out", "g.svg"],
            "error: {dataset}: is a folder; give a MODEL.py, a Hugging Face model folder (with config.json), "
            "or a dataset folder and a record ID",
        ),
        (["{dataset}", "nope", "--out", "g.svg"], "error: {dataset}: no record 'nope' (see `graphkit ls {dataset}`)"),
        (["missing-ds", "x", "--out", "g.svg"], "error: missing-ds: no such dataset folder"),
        (["missing.json", "--out", "g.svg"], "error: missing.json: cannot read: No such file or directory"),
        (["bad.json", "--out", "g.svg"], "error: bad.json: not JSON: Expecting value: line 1 column 1 (char 0)"),
        (
            ["cyclic.json", "--out", "g.svg"],
            "error: cyclic.json: edge 'output' -> 'input' goes backwards: "
            "the graph has a cycle or its nodes are not in topological order",
        ),
        (
            ["{llama}", "x", "--out", "g.svg"],
            "error: {llama}: is a file; with a record ID, give a dataset folder (or drop the ID to trace a MODEL.py)",
        ),
    ],
)
def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, monkeypatch, dataset, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.svg").mkdir()
    (tmp_path / "file.txt").write_text("mine")
    (tmp_path / "bad.json").write_text("nope")
    (tmp_path / "cyclic.json").write_text(
        '{"nodes": [{"op": "input", "name": "input"}, {"op": "output", "name": "output"}], "edges": [[0, 1], [1, 0]]}'
    )
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    names = dict(llama=LLAMA, dataset=dataset, cwd=tmp_path)
    assert error_of(run("draw", *(a.format(**names) for a in args))) == message.format(**names)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "file.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_png_too_tall_to_read_is_refused_with_a_way_out(tmp_path):
    """An expanded 200-layer model once became a 92 x 30,000 px PNG with unreadable labels."""
    graph = chain([("gelu" if i % 2 else "relu", f"m.{i}") for i in range(700)])
    path = tmp_path / "graph.json"
    path.write_text(graph.to_json())
    result = run("draw", path, "--out", tmp_path / "tall.png", "--expand")
    assert error_of(result).endswith(
        "too large for a PNG with readable labels (at most 32,768 pixels a side); write it as "
        ".svg or .pdf, or fold its repeated blocks (without --expand)"
    )
    assert not (tmp_path / "tall.png").exists()
    assert run("draw", path, "--out", tmp_path / "tall.svg", "--expand").exit_code == 0


def test_nested_repeats_fold_into_nested_frames(tmp_path):
    graph = chain([("gelu", f"s.{i}.b.{j}") for i in range(2) for j in range(3)])
    kept, _, frames = fold_repeats(graph)
    assert [(f.label, f.count, f.parent) for f in frames] == [("s.0–1", 2, None), ("s.0.b.0–2", 3, 0)]
    assert [graph.nodes[n].name for n in kept] == ["input", "s.0.b.0.gelu", "output"]
    scene = build_scene(graph)
    assert re.search(r"subgraph cluster_0 \{[^}]*subgraph cluster_1 \{[^}]*n1;\s*\}\s*\}", dot_source(scene))
    root = ET.parse(graph.draw(tmp_path / "nested.svg").path).getroot()
    outer, inner = [
        [float(r.get(k)) for k in ("x", "y", "width", "height")]
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "repeat"
        for r in g.iter(f"{SVG}rect")
    ]
    assert outer[0] < inner[0] and outer[1] < inner[1]
    assert outer[0] + outer[2] > inner[0] + inner[2] and outer[1] + outer[3] > inner[1] + inner[3]

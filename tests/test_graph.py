"""ArchGraph: serialisation, fingerprint, validation and the networkx / PyG views."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
import torch

from graphkit import GHN3_PRIMITIVES, OPS, ArchGraph, GraphError, Node, op_id
from graphkit.ops import OPS_VERSION, VOCABULARY_SIZES


def chain(*ops: str, params=None) -> ArchGraph:
    nodes = [Node(op=op, name=f"n{i}", params=(params or {}).get(i, {})) for i, op in enumerate(ops)]
    return ArchGraph(nodes=nodes, edges=[(i, i + 1) for i in range(len(ops) - 1)])


def test_round_trip_dict_and_json(gpt2_graph, exotic_graph):
    for graph in (gpt2_graph, exotic_graph):
        assert ArchGraph.from_dict(graph.to_dict()) == graph
        restored = ArchGraph.from_json(graph.to_json())
        assert restored == graph and restored.fingerprint() == graph.fingerprint()


def test_dict_shape_is_readable_without_graphkit(vit_graph):
    data = json.loads(vit_graph.to_json())
    assert set(data) == {"nodes", "edges", "meta"}
    node = next(n for n in data["nodes"] if n["op"] == "patch_embed")
    assert {"op", "name", "params", "attrs"} <= set(node)
    assert node["params"]["patch_embed.proj.weight"] == [192, 3, 16, 16]
    assert all(len(e) == 2 for e in data["edges"])
    assert data["meta"]["ops_version"] >= 1 and data["meta"]["num_params"] == vit_graph.num_params


@pytest.mark.slow
def test_fingerprint_is_stable_across_processes(vit_graph):
    code = (
        "import warnings; warnings.filterwarnings('ignore');"
        "import torch, timm, graphkit\n"
        "with torch.device('meta'): m = timm.create_model('vit_tiny_patch16_224', depth=3)\n"
        "print(graphkit.trace(m).fingerprint())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert out.stdout.strip() == vit_graph.fingerprint()


def test_fingerprint_sees_structure_not_meta(gpt2_graph):
    other = ArchGraph.from_dict(gpt2_graph.to_dict())
    other.meta["note"] = "meta is not hashed"
    assert other.fingerprint() == gpt2_graph.fingerprint()
    other.edges = other.edges[:-1]
    assert other.fingerprint() != gpt2_graph.fingerprint()


def test_validate_accepts_a_traced_graph(vit_graph):
    vit_graph.validate()


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda g: g.edges.append((3, 1)), "goes backwards"),
        (lambda g: g.nodes.__setitem__(1, Node(op="frobnicate", name="n1")), "unknown op 'frobnicate'"),
        (lambda g: g.nodes.__setitem__(2, Node(op="linear", name="n1")), "node name 'n1' appears twice"),
        (lambda g: g.edges.remove((1, 2)), "node 'n0' is not connected to the output \\(2 such nodes\\)"),
        (lambda g: g.edges.__setitem__(2, (1, 3)), "not connected to the output"),
        (lambda g: g.edges.append((0, 9)), "points outside"),
        (lambda g: g.nodes.__setitem__(2, Node(op="linear", name="n2", params={"w": (2, 2)})), "owned by both"),
    ],
)
def test_validate_catches_broken_graphs(mutate, message):
    graph = chain("input", "linear", "gelu", "output", params={1: {"w": (2, 2)}})
    graph.validate()
    mutate(graph)
    with pytest.raises(GraphError, match=message):
        graph.validate()


def test_validate_against_model_parameters():
    graph = chain("input", "linear", "output", params={1: {"w": (2, 3)}})
    graph.validate({"w": (2, 3)})
    with pytest.raises(GraphError, match="'b' of the model is owned by no node"):
        graph.validate({"w": (2, 3), "b": (2,)})
    with pytest.raises(GraphError, match=r"has shape \[2, 3\] in the graph but \[3, 2\]"):
        graph.validate({"w": (3, 2)})


def test_from_dict_rejects_garbage():
    with pytest.raises(GraphError, match="not a graphkit graph"):
        ArchGraph.from_dict({"nodes": [{"name": "x"}], "edges": []})
    with pytest.raises(GraphError, match="not JSON"):
        ArchGraph.from_json("{nope")


def test_shortest_paths():
    graph = ArchGraph(
        nodes=[Node(op=o, name=str(i)) for i, o in enumerate(["input", "linear", "gelu", "add", "output"])],
        edges=[(0, 1), (1, 2), (2, 3), (0, 3), (3, 4)],
    )
    d = graph.shortest_paths()
    assert d[0, 3] == 1 and d[0, 4] == 2 and d[1, 4] == 3 and d[4, 0] == -1 and np.all(np.diag(d) == 0)


def test_to_networkx(gpt2_graph):
    g = gpt2_graph.to_networkx()
    assert g.number_of_nodes() == len(gpt2_graph) and g.number_of_edges() == len(gpt2_graph.edges)
    assert g.nodes[1]["op"] == "embedding" and g.graph["family"] == "gpt2"

    assert nx.is_directed_acyclic_graph(g)


def test_to_pyg(vit_graph):
    data = vit_graph.to_pyg()
    n = len(vit_graph)
    assert data.num_nodes == n and data.x.tolist() == [op_id(node.op) for node in vit_graph.nodes]
    assert data.edge_index.shape == (2, len(vit_graph.edges))
    assert data.in_degree.sum() == data.out_degree.sum() == len(vit_graph.edges)
    dense = torch.from_numpy(vit_graph.shortest_paths()).long().clamp(min=0)
    from torch_geometric.utils import to_dense_adj

    assert torch.equal(to_dense_adj(data.spd_index, edge_attr=data.spd_value, max_num_nodes=n)[0], dense)
    assert data.spd_value.min() >= 1 and (data.spd_index[0] < data.spd_index[1]).all()  # a DAG in topological order
    patch = next(i for i, node in enumerate(vit_graph.nodes) if node.op == "patch_embed")
    assert data.param_shape[patch].tolist() == [192, 3, 16, 16]


def test_vocabulary_ids_and_ghn3_mapping():
    assert len(set(OPS)) == len(OPS)
    assert OPS[:3] == ("input", "output", "linear")  # ids are append-only
    assert VOCABULARY_SIZES[OPS_VERSION] == len(OPS) and OPS[VOCABULARY_SIZES[1] - 1] == "other"  # v1 ended with other
    assert list(VOCABULARY_SIZES) == list(range(1, OPS_VERSION + 1)) and sorted(VOCABULARY_SIZES.values()) == list(
        VOCABULARY_SIZES.values()
    )
    assert op_id("other:aten.cumsum") == op_id("other")
    assert set(GHN3_PRIMITIVES) == set(OPS)
    ghn3 = {
        "max_pool",
        "avg_pool",
        "sep_conv",
        "dil_conv",
        "conv",
        "msa",
        "cse",
        "sum",
        "concat",
        "input",
        "bias",
        "bn",
        "ln",
        "pos_enc",
        "glob_avg",
    }
    assert {p for p in GHN3_PRIMITIVES.values() if p} <= ghn3
    with pytest.raises(ValueError, match="unknown op 'frob'"):
        op_id("frob")


def test_pyg_batches_graphs_of_different_sizes(vit_graph, gpt2_graph, exotic_graph):
    from torch_geometric.loader import DataLoader
    from torch_geometric.utils import to_dense_adj

    graphs = [vit_graph, gpt2_graph, exotic_graph]
    batch = next(iter(DataLoader([g.to_pyg() for g in graphs], batch_size=3)))
    assert batch.num_graphs == 3 and batch.x.shape[0] == sum(len(g) for g in graphs)
    dense = to_dense_adj(batch.spd_index, batch.batch, batch.spd_value)
    for k, graph in enumerate(graphs):
        n = len(graph)
        expected = torch.from_numpy(graph.shortest_paths()).long().clamp(min=0)
        assert torch.equal(dense[k, :n, :n], expected)

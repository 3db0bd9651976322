"""Tracer speed and memory, against the GHN-3 way of building graphs, in one run.

    .venv/bin/python benchmarks/trace_speed.py            # print the table
    .venv/bin/python benchmarks/trace_speed.py --write    # also update the section in BENCHMARKS.md

Each method runs in a fresh process: its first call is reported as "cold", the median of the
next --repeat calls as "warm"; peak RSS is that process's, imports included. Every time counts
building the model from its config (on meta for graphkit) and making its graph. The GHN-3 way is
described in ghn3_way() below.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODELS = {
    "gpt2-xl": "GPT-2-XL (1.56B)",
    "vit-l16": "ViT-L/16 (304M)",
    "vit-b16": "ViT-B/16 (86M)",
    "gpt2": "GPT-2 small (124M)",
}


def build(name: str, device: str):
    import timm
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device(device):
        if name == "gpt2-xl":
            return GPT2LMHeadModel(GPT2Config(n_layer=48, n_embd=1600, n_head=25))
        if name == "gpt2":
            return GPT2LMHeadModel(GPT2Config())
        if name == "vit-l16":
            return timm.create_model("vit_large_patch16_224", pretrained=False)
        return timm.create_model("vit_base_patch16_224", pretrained=False)


def ghn3_way(name: str) -> int:
    """The GHN-3 way (ghn3/graph.py, Graph.__init__): real weights, a forward pass on a batch of
    two, a recursive walk of the grad_fn graph that records each node's ``_saved_*`` attributes,
    a dense adjacency matrix, a networkx topological sort and all-pairs shortest paths with
    cutoff 50 (GHN-3's virtual edges). Its filter and edge-fixing passes are left out, which
    flatters it. Returns the number of graph nodes."""
    import networkx as nx
    import numpy as np
    import torch

    model = build(name, "cpu")
    if name.startswith("gpt2"):
        out = model(torch.zeros(2, 8, dtype=torch.long), use_cache=False).logits
    else:
        out = model(torch.randn(2, 3, 224, 224))
    params = {id(p): n for n, p in model.named_parameters()}
    nodes: dict = {}
    edges = []

    def saved(fn) -> dict:
        return {
            a[7:]: "[tensor]" if torch.is_tensor(getattr(fn, a)) else str(getattr(fn, a))
            for a in dir(fn)
            if a.startswith("_saved_")
        }

    stack = [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn in nodes:
            continue
        var = getattr(fn, "variable", None)
        nodes[fn] = (params.get(id(var), type(fn).__name__), saved(fn))
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                edges.append((nxt, fn))
                stack.append(nxt)
    index = {fn: i for i, fn in enumerate(nodes)}
    adj = np.zeros((len(index), len(index)))
    for s, d in edges:
        adj[index[s], index[d]] = 1
    graph = nx.DiGraph(adj)
    order = list(nx.topological_sort(graph))
    dist = dict(nx.all_pairs_shortest_path_length(graph, cutoff=50))
    return len(order) + 0 * len(dist)


METHODS = {
    "graphkit": "trace (blocks folded)",
    "graphkit+spd": "trace + to_pyg() with the SPD matrix",
    "export": "plain torch.export of every block",
    "ghn3": "GHN-3 way",
}


def trace_row(name: str, method: str, repeat: int) -> dict:
    """In this (fresh) process: the first call (cold), then the median of ``repeat`` more (warm)."""
    import resource
    import warnings

    warnings.filterwarnings("ignore")
    import timm  # noqa: F401  (imports are not timed)
    import torch  # noqa: F401
    import torch_geometric  # noqa: F401
    import transformers  # noqa: F401

    import graphkit

    def run() -> int:
        if method == "ghn3":
            return ghn3_way(name)
        graph = graphkit.trace(build(name, "meta"), fold_repeats=(method != "export"))
        if method == "graphkit+spd":
            graph.to_pyg()
        return len(graph)

    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        size = run()
        times.append(time.perf_counter() - start)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"cold": times[0], "warm": statistics.median(times[1:]), "peak_rss_mb": rss_mb, "nodes": size}


def measure(name: str, method: str, repeat: int) -> dict:
    return common.run_fresh(__file__, name, method, "--repeat", str(repeat))


def table(repeat: int) -> str:
    rows = [
        "| model | method | warm (median) | cold (first call in a new "
        "process) | peak RSS | graph nodes | GHN-3 way / this, warm |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in MODELS.items():
        # GPT-2-XL's 6 GB of fp32 weights and forward pass are left to the GHN-3 way's users
        methods = [m for m in METHODS if not (m == "ghn3" and name == "gpt2-xl")]
        results = {m: measure(name, m, repeat) for m in methods}
        base = results.get("ghn3", {}).get("warm")
        for method, r in results.items():
            ratio = f"**{base / r['warm']:.1f}x**" if base and method != "ghn3" else ""
            rows.append(
                f"| {label} | {METHODS[method]} | {r['warm']:.2f} s | {r['cold']:.2f} s | "
                f"{r['peak_rss_mb']:.0f} MB | {r['nodes']} | {ratio} |"
            )
            print(rows[-1], flush=True)
    import torch

    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {common.cores()} cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}. Each method runs in a fresh process: "
        f"'cold' is its first call (torch.export initialises lazily), 'warm' the median of the next {repeat}. "
        "Times include building the model from its config (on meta for graphkit, with real weights for "
        "the GHN-3 way); imports are not timed. Command: `.venv/bin/python benchmarks/trace_speed.py --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:
    if "--one" in sys.argv:  # a measurement in a fresh process, started by measure()
        i = sys.argv.index("--one")
        repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
        print(json.dumps(trace_row(sys.argv[i + 1], sys.argv[i + 2], repeat)))
        return
    common.main(
        __doc__,
        "trace_speed",
        lambda args: table(args.repeat),
        lambda parser: parser.add_argument("--repeat", type=int, default=3),
    )


if __name__ == "__main__":
    main()

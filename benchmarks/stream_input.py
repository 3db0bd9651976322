"""The stream's input (issue #45 items 1 and 3; item 3's target: decoder predictions below the
unigram loss at step 0 on 80% of the held-out families): the zoo-decoders checkpoints by their
table gain, and the probe that chose it.

    .venv/bin/python benchmarks/stream_input.py                     # the bundled checkpoint (about 2 min on 2 cores)
    .venv/bin/python benchmarks/stream_input.py --ghn G=1=runs/zoo-decoders-layer-1500 \\
        --ghn G=8=logah-tiny-zoo-decoders --times 1 2 4 8 --write   # and update BENCHMARKS.md

One architecture of each held-out family of zoo-decoders-mini (the first of the eval split;
`graphkit generate zoo-decoders-mini` into out/), then of a few training families, built from
seed 0: its held-out loss at step 0 (4 batches of 8 sequences of 64 bytes of stdlib-text) from
its own init and from each checkpoint's prediction alone. The first checkpoint is also scored with
its token and position tables times each of ``--times`` at predict time, a tied table's logits
divided by the same again, so that only the stream's input changes: the probe behind
``train-ghn --table-gain`` (docs/experiments.md, "The stream's input"). A checkpoint is a
bundled name or a run folder (the Makefile's zoo-decoders stages with ``--table-gain G``).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from init_conventions import first_of_each  # noqa: E402

from graphkit.families import build_model  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.evaluate import initialise  # noqa: E402
from graphkit.ghn.pool import graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.ghn.stream import table_params, tied_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

ZOO = common.ROOT / "out" / "zoo-decoders-mini"
TRAINING = ("mistral", "deepseek_v3", "glm4", "olmo2", "gemma2")  # LLaMA-like, MoE, post-norms, Gemma's tables


def step0(record: Any, source: Any, ghn: Any = None, times: float = 1.0) -> float:
    """Held-out loss of ``record``'s model (seed 0) from ``ghn``'s prediction with its tables
    times ``times`` (a tied table's logits divided by it again), or from its own init (no ``ghn``)."""
    generator = torch.Generator().manual_seed(0)
    batches = [source.batch(record.config, 8, generator, split="eval") for _ in range(4)]
    torch.manual_seed(0)
    model = build_model(record.config, "cpu")
    if ghn is None:
        return score(model, batches, source.task)[0]
    graph = graph_for(record, ghn.config)
    initialise(model, "predicted", predicted_params(ghn, graph))
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = tied_params(graph)
    hooks = []
    with torch.no_grad():
        for name in table_params(graph):
            params[name].mul_(times)
            if name in tied:
                head = next(node.module for node in graph.nodes if node.op == "head")
                hooks.append(model.get_submodule(head).register_forward_hook(lambda m, a, out: out / times))
    try:
        return score(model, batches, source.task)[0]
    finally:
        for hook in hooks:
            hook.remove()


def table(args) -> str:
    source = load_source("stdlib-text", seq_len=64)
    unigram = source.unigram_loss()
    ghns = [(label, load_checkpoint(path)) for label, path in common.checkpoints(args)]
    times = [t for t in args.times if t != 1.0]
    chosen = first_of_each(ZOO)
    held = [(r.config["zoo_family"], r) for split, r in chosen if split == "eval"]
    train = {r.config["zoo_family"]: r for split, r in chosen if split == "train"}
    rows = held + [(f"{f} (training)", train[f]) for f in TRAINING if f in train]
    columns = ["own init", *(label for label, _ in ghns), *(f"{ghns[0][0]}, tables x {t:g}" for t in times)]
    scores: dict[str, list[float]] = {column: [] for column in columns}
    lines = []
    for family, record in rows:
        values = [step0(record, source)]
        values += [step0(record, source, ghn) for _, ghn in ghns]
        values += [step0(record, source, ghns[0][1], t) for t in times]
        if not family.endswith("(training)"):
            for column, value in zip(columns, values):
                scores[column].append(value)
        lines.append(f"| {family} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    below = [f"{sum(v < unigram for v in scores[c])} / {len(scores[c])}" for c in columns]
    means = [f"{statistics.mean(scores[c]):.3f}" for c in columns]
    return "\n".join(
        [
            "The held-out families of zoo-decoders-mini (one architecture each), then five training families:",
            f"loss at step 0 (unigram loss {unigram:.3f}), each checkpoint's prediction alone"
            + (
                f"; the first's also with its tables times k at predict time (`--times {_listed(times)}`)"
                if times
                else ""
            )
            + ".",
            "",
            "| family | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns),
            *lines,
            "| **held out below the unigram loss** | " + " | ".join(below) + " |",
            "| **mean of the held out** | " + " | ".join(means) + " |",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}. "
            f"Command: `.venv/bin/python benchmarks/stream_input.py {' '.join(f'--ghn {s}' for s in args.ghn)}"
            + (f" --times {_listed(args.times)}" if times else "")
            + " --write`.",
            "",
        ]
    )


def _listed(values: list[float]) -> str:
    return " ".join(f"{v:g}" for v in values)


def options(parser) -> None:
    common.ghn_option(parser, "shipped=logah-tiny-zoo-decoders")
    parser.add_argument(
        "--times", nargs="*", type=float, default=[1.0], help="the first checkpoint's tables times these"
    )


if __name__ == "__main__":
    torch.set_num_threads(common.cores())
    common.main(__doc__, "stream_input", table, options)

"""Models that scale their logits by a constant (issue #45 items 1 and 3): which mini-zoo decoder
families do, and what undoing the scale in the final norm does to a prediction at step 0.

    .venv/bin/python benchmarks/logit_scales.py          # print the table (about a minute on 2 cores)
    .venv/bin/python benchmarks/logit_scales.py --write  # and update BENCHMARKS.md

The tracer folds constants, so Cohere's `logits * logit_scale` (1/16) or Inkling's
`hidden / logits_mup_width_multiplier` (24) is no node of the graph: a hypernetwork that learned
the logits of models at scale 1 predicts theirs too small or too large. `graphkit.tracing.tracer.logit_scale`
measures the constant on one forward pass; with init anchors the final norm's gain is decoded
times its inverse (`graphkit.ghn.encoding.head_input_factors`).

One architecture of each family of zoo-decoders-mini (`graphkit generate zoo-decoders-mini` into
out/; the first of the train split, then of the held-out split) built from seed 0. Families whose
scale is not 1, and those where none is measured (a softcap, a head that reads no layer of its
own), are listed. For the first: the held-out loss at step 0 (4 batches of 8 sequences of 64 bytes
of stdlib-text) of the model's own init and of the bundled `logah-tiny-zoo-decoders` checkpoint's
prediction alone, decoded without the factor (the graph's `logit_scale` removed: what `predict`
gave before 2026-11-29) and with it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from init_conventions import first_of_each  # noqa: E402

from graphkit.families import build_model  # noqa: E402
from graphkit.ghn.evaluate import initialise  # noqa: E402
from graphkit.ghn.pool import with_init_constants  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predicted_params  # noqa: E402
from graphkit.graph import ArchGraph  # noqa: E402
from graphkit.tracing.tracer import logit_scale  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

CHECKPOINT = "logah-tiny-zoo-decoders"


def step0(record: Any, params: dict[str, torch.Tensor] | None, batches: list, task: str) -> float:
    """Held-out loss of ``record``'s model (seed 0) with ``params`` (None: its own init)."""
    torch.manual_seed(0)
    model = build_model(record.config, "cpu")
    if params is not None:
        initialise(model, "predicted", params)
    return score(model, batches, task)[0]


def rows(zoo: Path) -> tuple[list[str], list[str]]:
    """The table's rows for the families with a scale, and the names of those without one measured."""
    source = load_source("stdlib-text", seq_len=64)
    ghn = bundled_hypernetwork(CHECKPOINT)
    scaled, unmeasured = [], []
    for split, record in first_of_each(zoo):
        graph = with_init_constants(record.graph, record.config)
        family = record.config["zoo_family"] + (" (held out)" if split == "eval" else "")
        scale = graph.meta.get("logit_scale")
        if scale is None:
            if "init" in graph.meta and not _measured(record):
                unmeasured.append(family)
            continue
        generator = torch.Generator().manual_seed(0)
        batches = [source.batch(record.config, 8, generator, split="eval") for _ in range(4)]
        plain = ArchGraph(graph.nodes, graph.edges, {k: v for k, v in graph.meta.items() if k != "logit_scale"})
        own, before, after = (
            step0(record, params, batches, source.task)
            for params in (None, predicted_params(ghn, plain), predicted_params(ghn, graph))
        )
        scaled.append(f"| {family} | {scale:.4g} | {own:.3f} | {before:.3f} | **{after:.3f}** |")
    return scaled, unmeasured


def _measured(record: Any) -> bool:
    """Whether a scale (1 included) is measured on ``record``'s model: one constant."""
    torch.manual_seed(0)
    return logit_scale(build_model(record.config, "cpu"), record.graph) is not None


def table(args) -> str:
    scaled, unmeasured = rows(common.ROOT / "out" / "zoo-decoders-mini")
    unigram = load_source("stdlib-text", seq_len=64).unigram_loss()
    lines = [
        "zoo-decoders-mini families whose logits are scaled by a constant (`benchmarks/logit_scales.py`),",
        f"one architecture each; held-out loss at step 0 (unigram loss {unigram:.3f}), the bundled",
        f"`{CHECKPOINT}`'s prediction alone decoded without and with the final norm's factor:",
        "",
        "| family | logit scale | own init | predicted, scale ignored | predicted, scale undone |",
        "|---|---|---|---|---|",
        *scaled,
        "",
        f"No single constant measured (a softcap, or a head that reads no layer of its own): {', '.join(unmeasured)}.",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    torch.set_num_threads(common.cores())
    common.main(__doc__, "logit_scales", table)

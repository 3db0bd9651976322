"""Where a table gain is written as smaller stream writers (graphkit.ghn.stream), and whether the
two forms are one function on the real zoo: every family of zoo-decoders-mini, train and eval
split (the first architecture of each, built from seed 0).

    .venv/bin/python benchmarks/stream_writers.py --ghn runs/zoo-decoders-table8-1500         # about 4 min on 2 cores
    .venv/bin/python benchmarks/stream_writers.py --ghn logah-tiny-zoo-decoders --write    # and update BENCHMARKS.md

A checkpoint trained with ``--table-gain G`` predicts each family in one of two forms
(``encoding.targets``): where ``stream_writers`` proves it exact, its tables at the weights' RMS and
its writers G times smaller ("rewritten"); elsewhere its tables at G times ("kept"). For every
rewritten family this scores, at step 0 (4 batches of 8 sequences of 64 bytes of stdlib-text),
both: the prediction as written, and the same prediction with its writers and tables times G and a
tied head's final norm over G, the first form. Up to the norms' epsilon they agree; a family
where they do not has something in its stream that the graph does not show (a constant the tracer
folded, such as CTRL's sinusoidal positions).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from init_conventions import first_of_each  # noqa: E402

from graphkit.families import build_model  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.encoding import applied_table_gain, scalable_head_norm  # noqa: E402
from graphkit.ghn.evaluate import initialise  # noqa: E402
from graphkit.ghn.pool import graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.ghn.stream import stream_writers, table_params, tied_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

ZOO = common.ROOT / "out" / "zoo-decoders-mini"
AGREE = 2e-3  # nats: the forms count as one function within this


def table(args) -> str:
    source = load_source("stdlib-text", seq_len=64)
    ghn = load_checkpoint(args.ghn)
    gain = ghn.config.table_gain
    if gain == 1.0:
        raise SystemExit(f"{args.ghn}: trained with table gain 1; nothing is written in two forms")
    counts = {"rewritten": 0, "kept": 0, "no gain": 0}
    differences: list[tuple[float, str]] = []
    kept: list[str] = []
    for split, record in first_of_each(ZOO):
        family = record.config["zoo_family"] + (" (held out)" if split == "eval" else "")
        graph = graph_for(record, ghn.config)
        writers = stream_writers(graph)
        if applied_table_gain(graph, gain) == 1.0:
            counts["no gain"] += 1  # a tied head no norm can undo the gain for: G = 1
            continue
        if writers is None:
            counts["kept"] += 1
            kept.append(family)
            continue
        counts["rewritten"] += 1
        generator = torch.Generator().manual_seed(0)
        batches = [source.batch(record.config, 8, generator, split="eval") for _ in range(4)]
        torch.manual_seed(0)
        model = build_model(record.config, "cpu")
        initialise(model, "predicted", predicted_params(ghn, graph))
        written = score(model, batches, source.task)[0]
        params = dict(model.named_parameters(remove_duplicate=False))
        norm = scalable_head_norm(graph) if table_params(graph) & tied_params(graph) else None
        with torch.no_grad():
            for name in writers:
                params[name].mul_(gain)
            for name in norm.params if norm is not None else ():
                params[name].div_(gain)
        first = score(model, batches, source.task)[0]
        differences.append((abs(written - first), family))
        print(f"{family}: written {written:.4f}, first form {first:.4f}", file=sys.stderr, flush=True)
    differences.sort(reverse=True)
    apart = [f"{family} ({d:.3f})" for d, family in differences if d > AGREE]
    agree = [d for d, _ in differences if d <= AGREE]
    return "\n".join(
        [
            f"`{args.ghn}` (table gain {gain:g}) on the {sum(counts.values())} families of zoo-decoders-mini "
            "(train and held out, one architecture each), step-0 loss of the prediction as written and in the "
            "first form (tables times G):",
            "",
            "| families | count | step-0 loss, written against the first form |",
            "|---|---|---|",
            f"| rewritten: tables at the weights' RMS, writers / G | {counts['rewritten']} | "
            f"{len(agree)} within {AGREE} nats (mean difference {statistics.mean(agree or [0.0]):.5f}); "
            f"apart: {', '.join(apart) or 'none'} |",
            f"| kept: tables times G (the graph does not prove the rewrite) | {counts['kept']} | "
            f"one form: {', '.join(kept) or 'none'} |",
            f"| no gain: a tied head whose norm cannot undo it (Gemma's 1 + w) | {counts['no gain']} | - |",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores, torch {torch.__version__}. "
            f"Command: `.venv/bin/python benchmarks/stream_writers.py --ghn {args.ghn} --write`.",
            "",
        ]
    )


def options(parser) -> None:
    parser.add_argument("--ghn", default="logah-tiny-zoo-decoders", help="a checkpoint trained with --table-gain")


if __name__ == "__main__":
    torch.set_num_threads(common.cores())
    common.main(__doc__, "stream_writers", table, options)

"""How many of transformers' image classifiers `graphkit trace`, `graphkit predict` and `graphkit
finetune` take: every model type of transformers' image-classification mapping, built at its
reference config as ``hf:MODEL_TYPE`` (on the meta device, and again with weights where the tracer
needs values, as the CLI does), traced, and given to the bundled hypernetwork that ``predict``
would choose; then built with weights and 10 classes (``hf:MODEL_TYPE?num_labels=10``) and
trained one AdamW step on two digits, as ``finetune`` shapes them.

    .venv/bin/python benchmarks/hf_vision_coverage.py           # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/hf_vision_coverage.py --write   # updates BENCHMARKS.md

The table counts the types transformers builds (one that needs a library this machine lacks,
DiNAT's natten, is listed apart), those traced and validated with no ``other:`` op, those
``predict`` accepts and those ``finetune`` trains; below it, every type that failed a stage, with
its one-line reason. A type of more than ``LARGEST`` parameters is not built with weights here.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.cli.app import trace_loaded  # noqa: E402
from graphkit.errors import GraphkitError, ModelSourceError  # noqa: E402
from graphkit.finetune import check_output  # noqa: E402
from graphkit.ghn import bundled_for  # noqa: E402
from graphkit.ghn.predict import prediction_refusal  # noqa: E402
from graphkit.sources import load_model_source  # noqa: E402
from graphkit.training.data import data_config, load_source, model_inputs, source_for  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

#: the most parameters a type may have to be built with weights for the fine-tuning stage (4 GB
#: in float32, with AdamW's state 12 GB: this machine has 24)
LARGEST = 1_000_000_000


def outcome(model_type: str) -> tuple[str, str]:
    """(stage reached, detail) for one model type: ``unbuildable``, ``untraced``, ``other`` (an op
    outside the vocabulary), ``refused`` (by every bundled hypernetwork) or ``predictable``, with
    the reason or the checkpoint."""
    try:
        loaded = load_model_source(f"hf:{model_type}", weights=False)
    except ModelSourceError as e:
        return "unbuildable", str(e)
    try:
        _, graph = trace_loaded(loaded)
    except GraphkitError as e:
        return "untraced", str(e)
    other = sorted(op for op in graph.op_counts() if op.startswith("other:"))
    if other:
        return "other", ", ".join(other)
    refusal = prediction_refusal(graph)  # what the zoo reports count predictable models by
    return ("refused", refusal) if refusal is not None else ("predictable", bundled_for(graph).name)


def fine_tuning_refusal(model_type: str) -> str | None:
    """Why ``graphkit finetune hf:MODEL_TYPE?num_labels=10`` cannot train the type on digits, in
    one line; None when one AdamW step on a batch of two, shaped by its data config, runs with a
    finite loss. A type too large to build here says so."""
    spec = f"hf:{model_type}?num_labels=10"
    try:
        meta = load_model_source(spec, weights=False).model
        size = sum(p.numel() for p in meta.parameters())
        if size > LARGEST:
            return f"not built with weights here: {size / 1e9:.1f}B parameters"
        loaded = load_model_source(spec, weights=True)
        shape = data_config(loaded.model, loaded.example_inputs)
        source = load_source(source_for(shape))
        source.check(shape)
        x, y = source.batch(shape, 2, torch.Generator().manual_seed(0))
        batch = (model_inputs(x, shape), y)
        check_output(loaded.model, batch, source, shape)
        losses, _ = up_train(loaded.model, source.task, lambda step: batch, 1, 3e-4)
    except GraphkitError as e:
        return str(e)
    return None if math.isfinite(losses[0]) else f"the loss is {losses[0]}"


def table(args) -> str:
    import transformers  # noqa: PLC0415 (slow to import)
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    start = time.perf_counter()
    types = sorted(modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)
    results = {}
    tuned: dict[str, str | None] = {}
    for model_type in types:
        results[model_type] = outcome(model_type)
        if results[model_type][0] != "unbuildable":
            tuned[model_type] = fine_tuning_refusal(model_type)
        print(model_type, *results[model_type], tuned.get(model_type, "-"), sep=": ", flush=True)
    stages = [stage for stage, _ in results.values()]
    built = len(types) - stages.count("unbuildable")
    traced = built - stages.count("untraced")
    clean = traced - stages.count("other")
    chosen = sorted({detail for stage, detail in results.values() if stage == "predictable"})
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores with transformers "
        f"{transformers.__version__} ({(time.perf_counter() - start) / 60:.1f} min). Command: "
        "`.venv/bin/python benchmarks/hf_vision_coverage.py --write`.",
        "",
        "| types | built by transformers | traced, validated, no `other:` op | predictable | checkpoints chosen "
        "| fine-tuned on digits (one step) |",
        "|---|---|---|---|---|---|",
        f"| {len(types)} | {built} | {clean} of {built} ({100 * clean / built:.1f}%) | "
        f"{stages.count('predictable')} of {built} | {', '.join(chosen)} | "
        f"{sum(r is None for r in tuned.values())} of {built} |",
        "",
    ]
    failed = [(t, stage, detail) for t, (stage, detail) in results.items() if stage != "predictable"]
    failed += [(t, "not fine-tuned", reason) for t, reason in tuned.items() if reason is not None]
    lines += [f"- `{t}`, {stage}: {detail[:300]}" for t, stage, detail in sorted(failed)] or ["- none failed"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    common.main(__doc__, "hf_vision_coverage", table)

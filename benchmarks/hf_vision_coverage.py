"""How many of transformers' image classifiers `graphkit trace` and `graphkit predict` take: every
model type of transformers' image-classification mapping, built at its reference config as
``hf:MODEL_TYPE`` (on the meta device, and again with weights where the tracer needs values, as
the CLI does), traced, and given to the bundled hypernetwork that ``predict`` would choose.

    .venv/bin/python benchmarks/hf_vision_coverage.py           # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/hf_vision_coverage.py --write   # updates BENCHMARKS.md

The table counts the types transformers builds (one that needs a library this machine lacks,
DiNAT's natten, is listed apart), those traced and validated with no ``other:`` op, and those
``predict`` accepts; below it, every type that failed, with its one-line reason.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.cli.app import trace_loaded  # noqa: E402
from graphkit.errors import GraphkitError, ModelSourceError  # noqa: E402
from graphkit.ghn import bundled_for  # noqa: E402
from graphkit.ghn.predict import prediction_refusal  # noqa: E402
from graphkit.sources import load_model_source  # noqa: E402


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


def table(args) -> str:
    import transformers  # noqa: PLC0415 (slow to import)
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    start = time.perf_counter()
    types = sorted(modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)
    results = {}
    for model_type in types:
        results[model_type] = outcome(model_type)
        print(model_type, *results[model_type], sep=": ", flush=True)
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
        "| types | built by transformers | traced, validated, no `other:` op | predictable | checkpoints chosen |",
        "|---|---|---|---|---|",
        f"| {len(types)} | {built} | {clean} of {built} ({100 * clean / built:.1f}%) | "
        f"{stages.count('predictable')} of {built} | {', '.join(chosen)} |",
        "",
    ]
    failed = [(t, stage, detail) for t, (stage, detail) in results.items() if stage != "predictable"]
    lines += [f"- `{t}`, {stage}: {detail[:300]}" for t, stage, detail in failed] or ["- none failed"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    common.main(__doc__, "hf_vision_coverage", table)

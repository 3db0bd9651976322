"""Hand-written language models whose own initialisation has saturated logits: which start
`graphkit predict` should write. A head tied to an ``nn.Embedding`` left at torch's N(0, 1)
scores tens of nats at step 0; the prediction added onto that init (GPT-2's and LLaMA's default,
``W0 + P`` and ``W0 + 0.5 P``) keeps it, so since 2026-12-03 ``predict`` writes the prediction
alone there (``graphkit.ghn.keep_init.keeps_init``). Each model, tied and untied (the control,
where the default stands), fine-tuned from its own init, from the prediction added onto it and
from the prediction alone, on the same batches of stdlib text (byte tokens).

    .venv/bin/python benchmarks/saturated_starts.py           # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/saturated_starts.py --write   # updates BENCHMARKS.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from graphkit.ghn import load_checkpoint, predict  # noqa: E402
from graphkit.ghn.checkpoint import bundled_for  # noqa: E402
from graphkit.ghn.keep_init import keeps_init, should_keep_init  # noqa: E402
from graphkit.modelfile import load_model_file  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

#: label -> (model file, whether its head is tied to its token table)
CASES = {
    "GPT of nn.TransformerEncoderLayer, 2 x 64, tied": ("tests/model_files/torch_gpt.py", True),
    "the same, untied": ("tests/model_files/torch_gpt.py", False),
    "examples/llama_block.py, tied": ("examples/llama_block.py", True),
    "examples/llama_block.py (untied)": ("examples/llama_block.py", False),
}
#: start -> keep_init passed to predict (None: no prediction, the own init)
STARTS = {"own init": None, "added onto it (the family's default)": True, "prediction alone": False}
STEPS, BATCH = 300, 16


def build(label: str) -> torch.nn.Module:
    """The case's model, its own init drawn from seed 0."""
    path, tied = CASES[label]
    module = load_model_file(common.ROOT / path).model
    torch.manual_seed(0)
    model = type(module)()
    if tied:
        table = model.tok if hasattr(model, "tok") else model.embed
        head = model.head if hasattr(model, "head") else model.lm_head
        head.weight = table.weight
    return model


def run(label: str, start: str) -> dict[int, float]:
    """Held-out loss of ``label`` fine-tuned from ``start`` after 0, 100 and STEPS AdamW steps."""
    torch.set_num_threads(1)
    model = build(label)
    if STARTS[start] is not None:
        predict(model, keep_init=STARTS[start])
    source = load_source("stdlib-text", seq_len=64)
    held_out, batches = common.fixed_batches(source, model, BATCH, 4, STEPS)
    _, scores = up_train(model, source.task, batches.__getitem__, STEPS, 3e-4, held_out=held_out, at=(0, 100, STEPS))
    return {h: scores[h][0] for h in (0, 100, STEPS)}


def written(label: str) -> str:
    """The start `predict` writes by default for the case, and the saturation it read."""
    model = build(label)
    graph = trace(model)
    info = load_checkpoint(bundled_for(graph)).info
    assert should_keep_init(graph, None, info), "the cases are of families that keep the init by default"
    _, saturated = keeps_init(model, graph, None, info)
    return f"alone ({saturated[0]:.1f} nats on a uniform target)" if saturated else "added onto its init"


def table(args) -> str:
    results, measured = common.run_jobs(run, [(label, start) for label in CASES for start in STARTS])
    lines = [
        f"{measured}; held-out loss at 0 / 100 / {STEPS} AdamW steps "
        f"(lr 3e-4, batch {BATCH}, 64 byte tokens of stdlib text, the same batches for every start). Command: "
        "`.venv/bin/python benchmarks/saturated_starts.py --write`.",
        "",
        "| model | " + " | ".join(STARTS) + " | `predict` writes |",
        "|---" * (len(STARTS) + 2) + "|",
    ]
    for label in CASES:
        cells = [" / ".join(f"{results[(label, start)][h]:.2f}" for h in (0, 100, STEPS)) for start in STARTS]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {written(label)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    common.main(__doc__, "saturated_starts", table)

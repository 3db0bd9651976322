"""Are the bundled hypernetworks worth using? `eval-ghn` on held-out architectures for both bundled
LoGAH-tiny checkpoints: predicted parameters against the framework's random initialisation and
orthogonal initialisation, loss and accuracy at step 0 and after fine-tuning.

    .venv/bin/python benchmarks/ghn_eval.py            # print the tables
    .venv/bin/python benchmarks/ghn_eval.py --write    # also update BENCHMARKS.md and docs/img/

The datasets are generated first if out/ lacks them (same recipe and seed: the same records).
The reference approach is random initialisation, in the same run on the same batches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

RUNS = {
    "vit": dict(recipe="vits-digits", label="ViTs (vits-digits eval split, digits)", archs=16, steps=50, batch_size=32),
    "gpt2": dict(recipe="gpts-1k", label="GPT-2s (gpts-1k eval split, stdlib text)", archs=16, steps=30, batch_size=8),
}


def table(args) -> str:
    import warnings

    warnings.filterwarnings("ignore")
    from graphkit.datasets.generate import generate
    from graphkit.ghn.checkpoint import BUNDLED
    from graphkit.ghn.evaluate import INITS, EvalConfig, evaluate, plot, summarize

    parts = [f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores with the bundled checkpoints; AdamW "
             f"lr 3e-4 fine-tuning, the same batches for every initialisation. Command: "
             "`.venv/bin/python benchmarks/ghn_eval.py --write` (or `make eval-bundled`)."]
    for family, run in RUNS.items():
        dataset = common.ROOT / "out" / run["recipe"]
        if not dataset.exists():
            generate(run["recipe"], dataset, workers=2)
        config = EvalConfig(dataset=str(dataset), archs=run["archs"], steps=run["steps"], batch_size=run["batch_size"])
        rows = evaluate(config, progress=False)
        summary = summarize(rows)
        steps = run["steps"]
        lines = [f"**{run['label']}**, {BUNDLED[family]}: {summary['archs']} held-out architectures, {steps} fine-tuning "
                 f"steps. Predicted beats random after {steps} steps on **{100 * summary['predicted_beats_random']:.0f}%** "
                 "of them (lower eval loss).", "",
                 f"| init | eval loss @0 | accuracy @0 | eval loss @{steps} | accuracy @{steps} |", "|---|---|---|---|---|"]
        for init in INITS:
            s = summary[init]
            lines.append(f"| {init} | {s['loss_0']:.3f} | {s['accuracy_0']:.3f} | {s['loss']:.3f} | {s['accuracy']:.3f} |")
        png = Path("docs/img") / f"eval-{family}.png"
        if args.write:
            (common.ROOT / png).parent.mkdir(parents=True, exist_ok=True)
            plot(rows, str(common.ROOT / png), run["label"])
            lines += ["", f"![fine-tuning curves]({png})"]
        parts.append("\n".join(lines))
        print(parts[-1], flush=True)
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    common.main(__doc__, "ghn_eval", table)

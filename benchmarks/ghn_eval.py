"""Are the bundled hypernetworks worth using? `eval-ghn` on held-out architectures for both bundled
LoGAH-tiny checkpoints: predicted parameters against the framework's random initialisation and
orthogonal initialisation, loss and accuracy at step 0 and after fine-tuning.

    .venv/bin/python benchmarks/ghn_eval.py                     # print the tables
    .venv/bin/python benchmarks/ghn_eval.py --write             # also update BENCHMARKS.md and docs/img/
    .venv/bin/python benchmarks/ghn_eval.py --family vit --write   # one family (its own section)

The datasets are generated first if out/ lacks them (same recipe and seed: the same records).
The reference approach is random initialisation, in the same run on the same batches.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

RUNS = {
    "vit": dict(recipe="vits-digits", label="ViTs (vits-digits eval split, digits)", archs=16, steps=50, batch_size=32),
    "gpt2": dict(recipe="gpts-1k", label="GPT-2s (gpts-1k eval split, stdlib text)", archs=16, steps=30, batch_size=8),
}


def table(family: str, write: bool) -> str:
    """The evaluation of one family's bundled checkpoint, as a BENCHMARKS.md section."""
    import warnings

    warnings.filterwarnings("ignore")
    from graphkit.datasets.generate import generate
    from graphkit.ghn.checkpoint import BUNDLED
    from graphkit.ghn.evaluate import INITS, EvalConfig, evaluate, plot, summarize

    run = RUNS[family]
    dataset = common.ROOT / "out" / run["recipe"]
    if not dataset.exists():
        generate(run["recipe"], dataset, workers=2)
    config = EvalConfig(dataset=str(dataset), archs=run["archs"], steps=run["steps"], batch_size=run["batch_size"])
    rows = evaluate(config, progress=False)
    summary = summarize(rows)
    steps = run["steps"]
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores; AdamW lr 3e-4 fine-tuning, the same "
             f"batches for every initialisation. Command: `.venv/bin/python benchmarks/ghn_eval.py --family {family} "
             "--write` (or `make eval-bundled` for both).", "",
             f"**{run['label']}**, {BUNDLED[family]}: {summary['archs']} held-out architectures, {steps} fine-tuning "
             f"steps. Predicted beats random after {steps} steps on **{100 * summary['predicted_beats_random']:.0f}%** "
             "of them (lower eval loss).", "",
             f"| init | eval loss @0 | accuracy @0 | eval loss @{steps} | accuracy @{steps} |", "|---|---|---|---|---|"]
    for init in INITS:
        s = summary[init]
        lines.append(f"| {init} | {s['loss_0']:.3f} | {s['accuracy_0']:.3f} | {s['loss']:.3f} | {s['accuracy']:.3f} |")
    if write:
        png = Path("docs/img") / f"eval-{family}.png"
        (common.ROOT / png).parent.mkdir(parents=True, exist_ok=True)
        plot(rows, str(common.ROOT / png), run["label"])
        lines += ["", f"![fine-tuning curves]({png})"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md (one section per family)")
    parser.add_argument("--family", choices=sorted(RUNS), action="append", help="only this family (repeatable)")
    args = parser.parse_args()
    for family in args.family or RUNS:
        text = table(family, args.write)
        print(text, flush=True)
        if args.write:
            common.write_section(text, f"ghn_eval_{family}")


if __name__ == "__main__":
    main()

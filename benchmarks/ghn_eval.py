"""Are the bundled hypernetworks worth using? `eval-ghn` on held-out architectures for the three
bundled LoGAH-tiny checkpoints of a family (ViTs, GPT-2s, LLaMAs) and the two trained across a
mini zoo's families (zoo-vision, zoo-decoders: the held-out zoo families of zoo-vits-mini and
zoo-decoders-mini, issue #45's targets): predicted parameters against the model's own
initialisation (random: its constructor's) and orthogonal initialisation, and the prediction
added onto the own init (keep_init, times ``--shrink``) where `predict` writes that or for a zoo;
held-out loss and accuracy at steps 0, 100 and 300 of fine-tuning; the verdicts are taken at step
300, where random initialisation has learned.

    .venv/bin/python benchmarks/ghn_eval.py                     # print the tables
    .venv/bin/python benchmarks/ghn_eval.py --write             # also update BENCHMARKS.md, docs/img/ and the
                                                                # evaluation recorded in each bundled config.json
    .venv/bin/python benchmarks/ghn_eval.py --family vit --write   # one family (its own section)
    python benchmarks/ghn_eval.py --device cuda --write         # on a GPU: sections ghn_eval_<family>_gpu only
    .venv/bin/python benchmarks/ghn_eval.py --family vit --selected --write   # with weight selection: own section
    .venv/bin/python benchmarks/ghn_eval.py --family zoo-decoders --shrink 0.5 --write   # hours on 2 cores

The datasets are generated first if out/ lacks them (same recipe or zoo, and seed: the same records;
a mini zoo's split follows the library's version, which its manifest records).
The reference approach is random initialisation, in the same run on the same batches.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warnings

import common  # noqa: E402
import torch

from graphkit.datasets.generate import generate
from graphkit.datasets.zoo import ZOOS, generate_zoo
from graphkit.families import get_family
from graphkit.ghn.checkpoint import BUNDLED, record_evaluation
from graphkit.ghn.evaluate import DEFAULT_INITS, EvalConfig, evaluate, plot, summarize
from graphkit.training.data import default_source

#: per bundled checkpoint's family (its config.json's): the dataset whose eval split it is measured
#: on (a recipe, or a mini zoo), the label, the batch; a zoo's also its records' graphkit family
#: (the library) and data source. Every run: 8 architectures, 300 steps
RUNS = {
    "vit": dict(recipe="vits-digits", label="ViTs (vits-digits eval split, digits)", batch_size=32),
    "gpt2": dict(recipe="gpts-1k", label="GPT-2s (gpts-1k eval split, stdlib text)", batch_size=8),
    "llama": dict(recipe="llamas-1k", label="LLaMAs (llamas-1k eval split, stdlib text)", batch_size=8),
    "zoo-vision": dict(
        recipe="zoo-vits-mini",
        label="timm's ViTs (zoo-vits-mini eval split, digits)",
        batch_size=32,
        family="timm",
        data="digits",
    ),
    "zoo-decoders": dict(
        recipe="zoo-decoders-mini",
        label="transformers' decoders (zoo-decoders-mini eval split, stdlib text)",
        batch_size=8,
        family="transformers",
        data="stdlib-text",
    ),
}
ARCHS, STEPS = 8, 300


def table(
    family: str,
    write: bool,
    device: str | None = None,
    selected: bool = False,
    archs: int | None = None,
    shrink: float | None = None,
) -> str:
    """The evaluation of the bundled checkpoint of ``family`` (its config.json's), as a BENCHMARKS.md section."""

    warnings.filterwarnings("ignore")

    run = RUNS[family]
    checkpoint, dataset = BUNDLED.get(family, f"logah-tiny-{family}"), common.ROOT / "out" / run["recipe"]
    if not dataset.exists():
        if run["recipe"] in ZOOS:
            generate_zoo(run["recipe"], dataset, workers=2)
        else:
            generate(run["recipe"], dataset, workers=2)
    data = run.get("data") or default_source(family)
    # keep_init where predict writes it by default (GPT-2, LLaMA), so the record holds what predict
    # gives, and on a zoo, where it is the lead issue #45 measures
    written = get_family(run.get("family", family)).keep_init  # what predict writes for this family
    keep_init = ("keep_init",) * (written or "family" in run or shrink is not None)
    config = EvalConfig(
        dataset=str(dataset),
        ghn=checkpoint,
        data=data,
        archs=archs or ARCHS,
        steps=STEPS,
        batch_size=run["batch_size"],
        device=device,
        inits=DEFAULT_INITS + ("selected",) * selected + keep_init,
        shrink=shrink,
    )
    tic = time.perf_counter()
    rows = evaluate(config)  # a progress bar: the slower families take an hour on 2 cores
    minutes = (time.perf_counter() - tic) / 60
    summary = summarize(rows)
    steps, at = STEPS, summary["horizons"]
    scaled = (
        ", residual branches scaled as the family's init does (`predict`'s default)"
        if summary["residual_scale"]
        else ""
    )
    where = f"a GPU ({torch.cuda.get_device_name()})" if on_gpu(config.device) else f"{common.cores()} CPU cores"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {where} ({minutes:.1f} min); AdamW lr 3e-4 fine-tuning, the same "
        f"batches for every initialisation. Command: `.venv/bin/python benchmarks/ghn_eval.py --family {family} "
        + (f"--shrink {shrink:g} " if shrink is not None else "")
        + (f"--archs {archs} " if archs else "")
        + ("--selected " if selected else "")
        + "--write`"
        + (" (or `make eval-bundled` for all three)." if family in BUNDLED and not (selected or archs) else "."),
        "",
        f"**{run['label']}**, {checkpoint}: {summary['archs']} "
        f"held-out architectures{scaled}. After {steps} fine-tuning "
        f"steps predicted beats random on **{100 * summary['predicted_beats_random']:.0f}%** of them and orthogonal "
        f"on **{100 * summary['predicted_beats_orthogonal']:.0f}%** (lower held-out loss)"
        + (
            f"; keep_init (the model's init plus the prediction"
            f"{'' if summary.get('shrink', 1) == 1 else ' x ' + format(summary['shrink'], 'g')}, "
            + (
                "what `predict --keep-init --shrink` writes"
                if shrink is not None
                else "what `predict` writes for this family"
                if written
                else "`predict --keep-init`; for this family `predict` writes the prediction alone"
            )
            + ") beats "
            f"random on **{100 * summary['keep_init_beats_random']:.0f}%**."
            if "keep_init" in summary
            else "."
        ),
        "",
        "| init | " + " | ".join(f"loss / accuracy @{h}" for h in at) + " |",
        "|---" * (len(at) + 1) + "|",
    ]
    others = [init for init in config.inits if init != "predicted"]
    for init in config.inits:
        s = summary[init]
        lines.append(f"| {init} | " + " | ".join(f"{s[f'loss_{h}']:.3f} / {s[f'accuracy_{h}']:.3f}" for h in at) + " |")
    lines.append(
        f"| predicted wins vs {' / '.join(others)} | "
        + " | ".join(" / ".join(f"{100 * summary['wins'][str(h)][o]:.0f}%" for o in others) for h in at)
        + " |"
    )
    if selected:
        lines.insert(
            3,
            f"`selected`: weight selection from the train split's smallest architecture, trained directly for "
            f"{steps} steps on the same data (the budget: as many steps as the evaluation fine-tunes); after "
            f"{steps} steps predicted beats it on **{100 * summary['predicted_beats_selected']:.0f}%**.\n",
        )
    if write and selected and not on_gpu(device):  # its own section and picture; the checkpoint's record stays
        png = Path("docs/img") / f"eval-{family}-selected.png"
        plot(rows, str(common.ROOT / png), f"{run['label']}, with weight selection")
        lines += ["", f"![fine-tuning curves]({png})"]
    elif write and not on_gpu(device):  # the CPU run is the record; a GPU's is a section of its own (speed, agreement)
        record_evaluation(checkpoint, summary, dataset=f"out/{run['recipe']}", split="eval", data=data)
        png = Path("docs/img") / f"eval-{family}.png"
        (common.ROOT / png).parent.mkdir(parents=True, exist_ok=True)
        plot(rows, str(common.ROOT / png), run["label"])
        lines += ["", f"![fine-tuning curves]({png})"]
    return "\n".join(lines) + "\n"


def on_gpu(device: str | None) -> bool:
    """Whether a run given ``device`` evaluates on a GPU (None: the GPU if there is one)."""

    return device != "cpu" and torch.cuda.is_available()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md (one section per family)")
    parser.add_argument(
        "--family",
        choices=sorted(RUNS),
        action="append",
        help="only the bundled checkpoint of this family (its config.json's; repeatable); default: the three "
        "families' own (the zoo ones fine-tune hybrids on reference kernels: hours on 2 CPU cores)",
    )
    parser.add_argument(
        "--shrink",
        type=float,
        help="the keep_init row adds the prediction times this (W0 + S P; default: as predict does for the family)",
    )
    parser.add_argument("--device", help="cpu or cuda (default: the GPU if there is one)")
    parser.add_argument(
        "--selected",
        action="store_true",
        help="add weight selection (eval-ghn's selected) beside the others, in a section of its own "
        "(ghn_eval_<family>_selected; the checkpoint's recorded evaluation is left as it is)",
    )
    parser.add_argument("--archs", type=int, help="held-out architectures (default: the family's, 8)")
    args = parser.parse_args()
    for family in args.family or BUNDLED:
        text = table(family, args.write, args.device, args.selected, args.archs, args.shrink)
        print(text, flush=True)
        if args.write:
            suffix = ("_selected" if args.selected else "") + ("_gpu" if on_gpu(args.device) else "")
            common.write_section(text, f"ghn_eval_{family}{suffix}")


if __name__ == "__main__":
    main()

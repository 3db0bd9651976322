"""Models wider than a checkpoint trained at their depth, predicted through a narrow twin and grown
(``graphkit.ghn.grow``), fine-tuned from each start ``predict`` can write, against the model's own init.

Two changes meet here. A model is grown whenever it is wider than the widest width trained at its
depth (before: only when wider than the widest of all, so a 12 x 512 LLaMA was decoded directly
although the bundled LLaMA checkpoint trained 12-layer models no wider than 256). And every weight
that reads a grown width is fine-tuned at lr times the widths' ratio (``graphkit.ghn.grow.lr_scale``):
growing splits each of the twin's values among its copies, so each copy is a fraction of a
trained weight, and AdamW moves every weight by about lr a step whatever its size.

For each case (a checkpoint and a shape, built from seed 0 with its family's or transformers' own
init), the held-out loss (4 batches) at steps 0, 100 and 300 (``--steps``) of AdamW at lr 3e-4,
the same batches for every start:

- own init, the reference;
- ``predict``'s default start, grown (``W0 + 0.5 P`` for a LLaMA or a transformers decoder, the
  prediction alone for a ViT) at one lr, and, where it is the prediction alone, at its lr factors
  as ``finetune --params`` applies them;
- the prediction alone (``predict --no-keep-init``) at the lr factors ``predict --out`` records;
- the default start decoded directly (``predict --no-grow``), what ``predict`` wrote before for the
  shapes inside the widest width trained.

With ``--warmup N`` every start is fine-tuned with a linear warm-up of the rate over the first N
steps, as timm's and transformers' recipes do (``finetune --warmup``), and the own init is also
fine-tuned without one (the control: a warm-up can slow the own init, so the prediction must beat
its better recipe); the legacy ``--no-grow`` start is left out.

    .venv/bin/python benchmarks/grown_starts.py                  # the ViTs 90 minutes on 2 cores, the decoders 40
    .venv/bin/python benchmarks/grown_starts.py --cases vit-s --steps 100
    .venv/bin/python benchmarks/grown_starts.py --cases llama-12x512 mistral-12x512 --warmup 25

``--write`` records the decoders' cases and the ViTs' in sections of their own (``SECTIONS``): a
checkpoint retrained for one kind is remeasured without rerunning the other.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from zoo_decoder_shapes import TEXT, mistral  # noqa: E402

import graphkit  # noqa: E402
from graphkit.families import build_model, resolve_config  # noqa: E402
from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.grow import lr_scale, twin_of  # noqa: E402
from graphkit.ghn.keep_init import add_prediction, default_shrink, should_keep_init, shrunk  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.modelfile import load_model_file  # noqa: E402
from graphkit.params import load_params  # noqa: E402
from graphkit.training.data import data_config, load_source  # noqa: E402
from graphkit.training.loop import up_train  # noqa: E402

VIT = {"family": "vit", "image_size": 8, "patch_size": 2, "num_classes": 10}
#: name: (checkpoint, data source, batch size, what builds the model from seed 0)
CASES = {
    "vit-s": ("logah-tiny-vits", "digits", 32, dict(VIT, num_layers=12, hidden=384, heads=6)),
    "vit-b": ("logah-tiny-vits", "digits", 32, dict(VIT, num_layers=12, hidden=768, heads=12)),
    "llama-12x512": ("logah-tiny-llamas", "stdlib-text", 8, dict(family="llama", num_layers=12, hidden=512, heads=8)),
    "mistral-12x512": ("logah-tiny-zoo-decoders", "stdlib-text", 8, (12, 512)),
    # written by hand (tests/model_files/nano_gpt.py at N_LAYER, N_HEAD, N_EMBD, VOCAB, BLOCK): no config
    # names its widths, so its twin is a narrowed copy of itself (graphkit.ghn.grow.copied_twin)
    "nanogpt-6x384": ("logah-tiny-gpts", "stdlib-text", 8, "6, 6, 384, 256, 64"),
    # its controls: graphkit's GPT-2 (transformers' GPT2LMHeadModel) of the same shape, a family twin,
    # its head tied as nanoGPT's is, and untied
    "gpt2-tied-6x384": (
        "logah-tiny-gpts",
        "stdlib-text",
        8,
        dict(family="gpt2", num_layers=6, hidden=384, heads=6, vocab_size=256, context=64, tied=True),
    ),
    "gpt2-6x384": (
        "logah-tiny-gpts",
        "stdlib-text",
        8,
        dict(family="gpt2", num_layers=6, hidden=384, heads=6, vocab_size=256, context=64),
    ),
}

#: BENCHMARKS.md section: its cases
SECTIONS = {
    "grown_starts": ("llama-12x512", "mistral-12x512"),
    "grown_starts_vit": ("vit-b", "vit-s"),
    "grown_starts_hand_written": ("nanogpt-6x384", "gpt2-tied-6x384", "gpt2-6x384"),
}


def build(spec) -> torch.nn.Module:
    """The case's model, built from seed 0 with its own init: a Mistral of (layers, width), nanoGPT
    of the sizes a string gives, or a graphkit family's config."""
    torch.manual_seed(0)
    if isinstance(spec, tuple):
        return mistral(*spec)
    if isinstance(spec, str):
        source = (common.ROOT / "tests" / "model_files" / "nano_gpt.py").read_text()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "nano_gpt.py"
            path.write_text(source.replace("= 2, 8, 512, 256, 64", f"= {spec}"))
            return load_model_file(path).model
    return build_model(resolve_config(spec), "cpu")


def starts(name: str, warmup: int = 0) -> list[tuple[str, str, int]]:
    """The starts measured for the case ``name``, (key, label, warm-up steps) (see the module
    docstring)."""
    checkpoint, _, _, spec = CASES[name]
    ghn = load_checkpoint(checkpoint)
    graph = graphkit.trace(build(spec))
    if should_keep_init(graph, None, ghn.info):
        factor = f"W0 + {default_shrink(graph, ghn.info):g} P"
        labels = [
            ("own", "own init"),
            ("default", f"{factor} (`predict`), one lr"),
            ("alone", "P (`--no-keep-init`), lr factors"),
            ("direct", f"{factor} decoded directly (`--no-grow`), one lr"),
        ]
    else:
        labels = [
            ("own", "own init"),
            ("alone", "P (`predict`), lr factors"),
            ("default", "P, one lr (`--no-lr-scale`)"),
            ("direct", "P decoded directly (`--no-grow`), one lr"),
        ]
    if not warmup:
        return [(key, label, 0) for key, label in labels]
    control = ("own", "own init, no warm-up", 0)
    return [control] + [(key, f"{label}, {warmup}-step warm-up", warmup) for key, label in labels if key != "direct"]


def run(name: str, start: str, steps: int, warmup: int = 0) -> tuple[dict[int, float], str]:
    """Fine-tune the case ``name`` from the start keyed ``start`` (:func:`starts`), the rate
    warmed up over ``warmup`` steps; the held-out loss by step and the twin's width."""
    torch.set_num_threads(1)
    checkpoint, data, batch_size, spec = CASES[name]
    ghn = load_checkpoint(checkpoint)
    model = build(spec)
    graph = graphkit.trace(model)
    shape = TEXT if isinstance(spec, tuple) else data_config(model)
    source = load_source(data, seq_len=64)
    generator = torch.Generator().manual_seed(0)
    held_out = [source.batch(shape, batch_size, generator, split="eval") for _ in range(4)]
    batches = [source.batch(shape, batch_size, generator) for _ in range(steps)]
    twin = twin_of(ghn, graph, model)  # the model gives a hand-written one its twin
    if start != "own":
        predicted = predicted_params(ghn, graph, grow=(twin or False) if start != "direct" else False)
        if start != "alone" and should_keep_init(graph, None, ghn.info):
            add_prediction(model, shrunk(predicted, default_shrink(graph, ghn.info)))
        else:
            load_params(model, predicted)
    scales = lr_scale(graph, twin) if start == "alone" else {}
    at = sorted({0, min(100, steps), steps})
    _, scores = up_train(
        model, source.task, batches.__getitem__, steps, 3e-4, held_out=held_out, at=at, lr_scale=scales, warmup=warmup
    )
    return {h: scores[h][0] for h in at}, "-" if twin is None else str(twin.config["hidden"])


def table(args, cases: list[str]) -> str:
    """The table of ``cases``, each fine-tuned from every start of :func:`starts`."""
    jobs = [(name, *start) for name in cases for start in starts(name, args.warmup)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(
            pool.map(run, [j[0] for j in jobs], [j[1] for j in jobs], [args.steps] * len(jobs), [j[3] for j in jobs])
        )
    at = sorted(results[0][0])
    lines = [
        "| case | twin width | start | " + " | ".join(f"loss @{h}" for h in at) + " |",
        "|---" * (3 + len(at)) + "|",
    ]
    # the reference at each step: the own init's lower loss over the recipes measured
    own: dict[str, dict[int, float]] = {}
    for (name, key, *_), (losses, _) in zip(jobs, results):
        if key == "own":
            own[name] = {h: min(v, own.get(name, {}).get(h, v)) for h, v in losses.items()}
    for (name, key, label, _), (losses, twin) in zip(jobs, results):
        cells = [f"**{v:.3f}**" if key != "own" and v < own[name][h] else f"{v:.3f}" for h, v in losses.items()]
        lines.append(f"| {name} | {twin} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(
        [
            *lines,
            "",
            "Bold: below the own init's loss at that step (with a warm-up, the lower of its two). "
            f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} "
            f"CPU cores, torch {torch.__version__}, one thread a run. Command: `.venv/bin/python "
            f"benchmarks/grown_starts.py --cases {' '.join(cases)} --steps {args.steps}"
            + (f" --warmup {args.warmup}`." if args.warmup else " --write`."),
            "",
        ]
    )


def main() -> None:
    """Print the table of the cases asked for; with ``--write``, each kind's cases (``SECTIONS``)
    replace their own section of BENCHMARKS.md, so that rerunning the ViTs leaves the decoders'
    recorded rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--cases", nargs="*", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=common.cores(), help="runs side by side, one thread each")
    parser.add_argument(
        "--warmup", type=int, default=0, help="steps of linear lr warm-up for every start (and a control)"
    )
    args = parser.parse_args()
    if args.warmup and args.write:
        raise SystemExit("--write records the table without a warm-up; --warmup's table is printed only")
    for key, kind in SECTIONS.items():
        cases = [name for name in args.cases if name in kind]
        if cases:
            text = table(args, cases)
            print(text, flush=True)
            if args.write:
                common.write_section(text, key)


if __name__ == "__main__":
    main()

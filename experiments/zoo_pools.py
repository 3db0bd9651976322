"""Where training across families stops (issue #45, item 1), and whether a curriculum gets past
it, on the mini zoo of timm's vision models or (``--kind decoders``) of transformers' decoders.

The bundled ``logah-tiny-zoo-vision`` (43 families, 1,500 steps) ends near chance (training CE
2.23, chance 2.30), while one ViT family (``logah-tiny-vits``) reaches 1.04 and predicts 0.67
accuracy. Between the two lie the pools:

- ``--pools 1 2 4 8 16``: the zoo checkpoint's recipe (Makefile, ``bundled``) for ``--steps`` steps
  on the train-split architectures of the first K families, ordered by how many architectures
  each has (most first, then by name; ``--first`` names families to put ahead, the decoder zoo
  having about one architecture a model type). Every pool keeps the role maps of the whole train split's 32
  most shared roles, so that every run's hypernetwork has one shape and any can start the next
  stage.
- ``--curriculum K``: the whole train split for ``--steps`` steps, from the weights of pool K's
  run of ``--start-steps`` steps (the lead that took LLaMA off its plateau: BENCHMARKS.md,
  "Where learning stops"); ``--whole``, its control: the whole train split for ``--steps`` steps
  from a fresh LoGAH. ``--spread W`` trains both with ``train-ghn --spread W`` (the penalty that
  made the LLaMA curriculum's blocks fine-tune: docs/experiments.md). ``--mix-families`` trains
  every run with ``train-ghn --mix-families`` (each step's architectures from different families,
  every family alike), its runs named ``...-mixed-...``.

Probe, per run: training CE and accuracy over the last 100 steps, and the predicted parameters
alone, at step 0, on one architecture of each of the first 16 families (in the pool or not) and
of each of the zoo's held-out families (the eval split), each beside its own init (its
constructor's), on 4 held-out batches of 32 digits (of 8 windows of 64 bytes for decoders, with
the unigram loss to get below); for images also how much the classifier's input varies across
images (``image_share``: near 0, every image gets the same guess). ``--tempered CKPT ...`` probes
only the held-out families: each prediction's loss, the least its logits reach scaled by one
factor, and the same with their mean over images taken out (``tempered``): at chance after both,
the prediction's features carry nothing about the class, whatever the logits' size.

    .venv/bin/python experiments/zoo_pools.py --pools 1 2 4 8 16            # about 15 min a pool on 2 cores
    .venv/bin/python experiments/zoo_pools.py --pools 4 --curriculum 4      # the whole zoo from pool 4's weights
    .venv/bin/python experiments/zoo_pools.py --probe-only --pools 1 2 4    # the runs already in runs/
    # the LLaMA curriculum on the decoder zoo: 4 LLaMA-like families, then the whole train split
    .venv/bin/python experiments/zoo_pools.py --kind decoders --first llama mistral qwen2 qwen3 --pools 4 --steps 600
    .venv/bin/python experiments/zoo_pools.py --kind decoders --first llama mistral qwen2 qwen3 --pools \
        --curriculum 4 --start-steps 600 --steps 1500 --spread 1

A pool trains on the zoo itself with ``train-ghn --zoo-families`` (``TrainConfig.zoo_families``),
which keeps the role maps of the whole train split.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphkit.datasets.store import read_rows  # noqa: E402
from graphkit.families import build_model  # noqa: E402
from graphkit.fileio import save_figure  # noqa: E402
from graphkit.ghn import load_checkpoint, training  # noqa: E402
from graphkit.ghn.evaluate import initialise  # noqa: E402
from graphkit.ghn.pool import ArchPool, graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.data.text import TextSource  # noqa: E402
from graphkit.training.loop import estimate_batch_norm, score  # noqa: E402

#: each kind's zoo and its checkpoint's recipe (Makefile, ``bundled``), less the dataset and the steps
KINDS: dict[str, tuple[Path, dict[str, Any]]] = {
    "vision": (
        ROOT / "out" / "zoo-vits-mini",
        dict(data="digits", meta_batch=4, batch_size=32, lr_fan_in=8.0, role_maps=True, role_key="leaf", max_roles=32),
    ),
    "decoders": (
        ROOT / "out" / "zoo-decoders-mini",
        dict(data="stdlib-text", meta_batch=2, batch_size=8, seq_len=64, lr_fan_in=32.0, role_maps=True,
             role_key="layer", max_roles=32, role_rows=1024),
    ),
}  # fmt: skip
PROBED_FAMILIES = 16
BATCHES = 4
#: the factors :func:`tempered` scales logits by
TEMPERATURES = (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)


def family_of(row: dict[str, Any]) -> str:
    return json.loads(row["config"])["zoo_family"]


def zoo_rows(zoo: Path, split: str) -> list[dict[str, Any]]:
    return [row for shard in sorted((zoo / "data").glob(f"{split}-*.parquet")) for row in read_rows(shard)]


def families(zoo: Path, first: Sequence[str] = ()) -> list[str]:
    """The train split's families: those in ``first``, in its order, then the rest, most
    architectures first (then by name)."""
    counts = Counter(family_of(r) for r in zoo_rows(zoo, "train"))
    missing = [f for f in first if f not in counts]
    if missing:
        raise SystemExit(f"--first: {zoo} has no train family {missing[0]!r}; it has {', '.join(sorted(counts))}")
    return [*first, *sorted(set(counts) - set(first), key=lambda f: (-counts[f], f))]


def pool_name(k: int, first: Sequence[str]) -> str:
    """``pool4``, or ``pool4-llama-mistral`` when ``--first`` put those families ahead."""
    return "-".join([f"pool{k}", *first[:k]])


def train_run(
    recipe: dict[str, Any],
    zoo: Path,
    out: Path,
    steps: int,
    initial: Path | None = None,
    spread: float = 0.0,
    pool: Sequence[str] | None = None,
    mix_families: bool = False,
) -> None:
    """``train-ghn`` with ``recipe`` on ``zoo``'s train split, or on its families ``pool`` only
    (``--zoo-families``: the role maps stay the whole split's, so that any run can start the next stage)."""
    config = training.TrainConfig(
        **recipe,
        dataset=str(zoo),
        out=str(out),
        steps=steps,
        initial_checkpoint=None if initial is None else str(initial),
        spread=spread,
        zoo_families=None if pool is None else list(pool),
        mix_families=mix_families,
    )
    training.train(config, progress=True)


def first_of_each(records: list[Any]) -> dict[str, Any]:
    """The first record of each zoo family, by family."""
    firsts: dict[str, Any] = {}
    for record in records:
        firsts.setdefault(record.config["zoo_family"], record)
    return firsts


def probe_records(zoo: Path, first: Sequence[str]) -> list[tuple[str, Any]]:
    """(what, record): the first train architecture of each of the first families, then the first
    of each held-out family."""
    train = first_of_each(ArchPool(zoo, "train").records)
    probed = [(f"train: {f}", train[f]) for f in families(zoo, first)[:PROBED_FAMILIES]]
    return probed + [(f"held out: {f} ({r.id})", r) for f, r in first_of_each(ArchPool(zoo, "eval").records).items()]


def image_share(model: Any, images: torch.Tensor) -> float:
    """How much a timm model's classifier input varies across ``images``: its standard deviation
    over the batch over its RMS. Near 0 the model gives every image the same features, so its
    output is one guess whatever it sees (chance, ln 10 at best)."""
    head = model.get_classifier()
    head = head[0] if isinstance(head, tuple) else head  # a distilled model's (head, head_dist)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    try:
        with torch.no_grad():
            model.eval()(images)
    finally:
        handle.remove()
    features = captured[0].flatten(1)
    return (features.std(0).pow(2).mean().sqrt() / features.pow(2).mean().sqrt()).item()


def step0(ghn, record, source, batch_size: int) -> list[float]:
    """:func:`scored` of ``record``'s model from ``ghn``'s prediction, or from its own init when
    ``ghn`` is None."""
    return scored(
        record, source, batch_size, None if ghn is None else predicted_params(ghn, graph_for(record, ghn.config))
    )


def scored_model(
    record, source, batch_size: int, params: dict[str, torch.Tensor] | None = None, init: str = "predicted"
) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``record``'s model with ``params`` (by state-dict name; ``init="keep_init"``: added onto its
    own init, ``W0 + P``, as ``eval-ghn`` does), or with its own init when None, its BatchNorms'
    statistics estimated on training inputs as ``eval-ghn`` does, and the :data:`BATCHES` held-out
    batches it is scored on."""
    generator = torch.Generator().manual_seed(0)
    held_out = [source.batch(record.config, batch_size, generator, split="eval") for _ in range(BATCHES)]
    torch.manual_seed(0)
    model = build_model(record.config, "cpu")
    if params is not None:
        initialise(model, init, params)
    estimate_batch_norm(model, [source.batch(record.config, batch_size, generator)[0] for _ in range(BATCHES)])
    return model, held_out


def scored(record, source, batch_size: int, params: dict[str, torch.Tensor] | None = None) -> list[float]:
    """Held-out loss and accuracy of :func:`scored_model`; for images also its
    :func:`image_share` on the first held-out batch (rounded)."""
    model, held_out = scored_model(record, source, batch_size, params)
    figures = list(score(model, held_out, source.task))
    if source.task != "text":
        figures.append(image_share(model, held_out[0][0]))
    return [round(v, 3) for v in figures]


def tempered(record, source, batch_size: int, params: dict[str, torch.Tensor]) -> list[float]:
    """Whether a prediction's held-out loss is a matter of scale: its image model's loss, the
    least loss its logits reach times one of :data:`TEMPERATURES`, and the same with their mean
    over the held-out images taken out first (a bias shared by every image). At chance (ln 10)
    after both, the logits carry no class information, whatever their size."""
    model, held_out = scored_model(record, source, batch_size, params)
    with torch.no_grad():
        logits = torch.cat([model.eval()(images) for images, _ in held_out])
    labels = torch.cat([labels for _, labels in held_out])
    centred = logits - logits.mean(0)
    return [
        round(F.cross_entropy(logits, labels).item(), 3),
        round(min(F.cross_entropy(logits * t, labels).item() for t in TEMPERATURES), 3),
        round(min(F.cross_entropy(centred * t, labels).item() for t in TEMPERATURES), 3),
    ]


def probe(run: Path | str, records: list[tuple[str, Any]], source, batch_size: int) -> dict[str, Any]:
    """The run's (or a bundled checkpoint's, by name) training figures, when it has a log, and its
    predictions' step-0 scores on ``records``."""
    ghn = load_checkpoint(run)
    log = Path(run) / "metrics.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    figures: dict[str, Any] = {"run": Path(run).name}
    if lines:
        figures["training CE, last 100 steps"] = round(statistics.mean(line["ce"] for line in lines[-10:]), 3)
        figures["training accuracy, last 100 steps"] = round(statistics.mean(line["metric"] for line in lines[-10:]), 3)
    figures["predicted @0"] = {what: step0(ghn, record, source, batch_size) for what, record in records}
    return figures


def windows(run: Path, width: int = 10) -> tuple[list[int], list[float]]:
    """The run's training CE, the mean over windows of ``width`` logged steps (100 steps), by the window's last step."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    chunks = [lines[i : i + width] for i in range(0, len(lines) - width + 1, width)]
    return [c[-1]["step"] for c in chunks], [statistics.mean(m["ce"] for m in c) for c in chunks]


def plot(runs: list[Path], png: Path, floor: tuple[float, str], zoo: str) -> None:
    """The runs' training CE by step (means over 100 steps), ``floor`` (chance or the unigram
    loss, and its label) marked, as ``png``."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axis = plt.subplots(figsize=(7, 4))
    for run in runs:
        axis.plot(*windows(run), marker=".", label=run.name)
    axis.axhline(floor[0], color="grey", linestyle="--", label=floor[1])
    axis.set(xlabel="step", ylabel="training cross-entropy (mean over 100 steps)", title=f"{zoo} pools")
    axis.legend(fontsize=7)
    save_figure(figure, png, "training-figure", dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="vision", help="which mini zoo, and its recipe")
    parser.add_argument("--zoo", type=Path, default=None, help="the zoo dataset (default: the kind's, in out/)")
    parser.add_argument("--first", nargs="*", default=[], help="families the pools take first, in this order")
    parser.add_argument("--spread", type=float, default=0.0, help="train-ghn --spread for --whole and --curriculum")
    parser.add_argument("--mix-families", action="store_true", help="train every run with train-ghn --mix-families")
    parser.add_argument("--pools", nargs="*", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--curriculum", type=int, default=None, help="train the whole zoo from this pool's weights")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--whole", action="store_true", help="the whole train split from a fresh LoGAH (control)")
    parser.add_argument("--start-steps", type=int, default=None, help="the curriculum's first stage (default: --steps)")
    parser.add_argument("--probe-only", action="store_true", help="probe the runs already in runs/")
    parser.add_argument("--plot", type=Path, default=None, help="draw the runs' (and logged references') curves as PNG")
    parser.add_argument("--reference", nargs="*", default=[], help="checkpoints (bundled names) probed beside the runs")
    parser.add_argument("--tempered", nargs="*", default=[], help="checkpoints: the held-out losses' scale (only this)")
    args = parser.parse_args()
    default_zoo, recipe = KINDS[args.kind]
    zoo = args.zoo or default_zoo
    print("families, the pools' order:", families(zoo, args.first)[:PROBED_FAMILIES], flush=True)
    source = load_source(recipe["data"], seq_len=recipe.get("seq_len", 64))
    text = isinstance(source, TextSource)
    batch_size = 8 if text else 32
    floor = (
        (source.unigram_loss(), "the unigram loss")
        if isinstance(source, TextSource)
        else (math.log(10), "chance (ln 10)")
    )
    print(f"{floor[1]}: {floor[0]:.3f}", flush=True)
    records = probe_records(zoo, args.first)
    if args.tempered:
        held_out = [(what, record) for what, record in records if what.startswith("held out")]
        for checkpoint in args.tempered:
            ghn = load_checkpoint(checkpoint)
            figures = {
                what: tempered(record, source, batch_size, predicted_params(ghn, graph_for(record, ghn.config)))
                for what, record in held_out
            }
            print(json.dumps({f"{checkpoint}: loss, best tempered, best centred and tempered": figures}, indent=1))
        return
    own = {what: step0(None, record, source, batch_size) for what, record in records}
    print(json.dumps({"own init @0": own}, indent=1), flush=True)
    for reference in args.reference:
        print(json.dumps(probe(reference, records, source, batch_size), indent=1), flush=True)
    spread = f"-spread{args.spread:g}" if args.spread else ""
    mixed = "-mixed" if args.mix_families else ""
    order = families(zoo, args.first)
    runs: list[tuple[Path, Path | None, float, list[str] | None]] = [
        (ROOT / "runs" / f"{zoo.name}-{pool_name(k, args.first)}{mixed}-{args.steps}", None, 0.0, order[:k])
        for k in args.pools
    ]
    if args.whole:
        runs.append((ROOT / "runs" / f"{zoo.name}-whole{spread}{mixed}-{args.steps}", None, args.spread, None))
    if args.curriculum is not None:
        stage = f"{pool_name(args.curriculum, args.first)}{mixed}-{args.start_steps or args.steps}"
        start = ROOT / "runs" / f"{zoo.name}-{stage}"
        run = ROOT / "runs" / f"{zoo.name}-curriculum{args.curriculum}{spread}{mixed}-{args.steps}"
        runs.append((run, start, args.spread, None))
    for run, initial, weight, pool in runs:
        if not args.probe_only:
            train_run(recipe, zoo, run, args.steps, initial, weight, pool, args.mix_families)
        print(json.dumps(probe(run, records, source, batch_size), indent=1), flush=True)
    if args.plot is not None:  # the runs, and the references that are runs with a log
        logged = [Path(r) for r in args.reference if (Path(r) / "metrics.jsonl").exists()]
        plot([*logged, *(run for run, *_ in runs)], args.plot, floor, zoo.name)


if __name__ == "__main__":
    main()

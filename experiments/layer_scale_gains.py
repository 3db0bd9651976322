"""Layer-scale gains in the vision zoo's predictions (issue #45, items 1 and 3).

timm's LayerScale (``ls1.gamma``, ``ls2.gamma``), EVA's and BEiT's ``gamma_1`` / ``gamma_2`` and
XCiT's ``gamma1`` to ``gamma3`` multiply each residual branch by a learned vector that the
constructors start at 1e-6 to 1e-5 (BEiT 0.1). graphkit decodes them as GHN-3 decodes every 1-D
parameter that is not a norm's scale, ``tanh(p / 5)``, near 0 from a fresh LoGAH, so a predicted
block behind one is silent and the gradient that reaches its weights is scaled by the gain.

- ``--probe CKPT ...``: for one architecture of each zoo family with such gains (train and eval
  splits), the step-0 held-out loss / accuracy / image share (``zoo_pools.image_share``) of its
  own init and of each checkpoint's prediction, with the gains as predicted, set to 0.1 and to 1.
- ``--train OUT``: the zoo-vision recipe (Makefile, ``bundled``) for ``--steps`` steps with these
  gains decoded around ``--gain-offset`` (``tanh(p / 5) + offset``) instead of 0, the lever the
  probe suggests; ``--gain-offset`` applies to ``--probe`` too, as a checkpoint must be read the
  way it trained (checkpoints trained otherwise are probed with 0). ``--family`` trains on one
  family's architectures only, ``--initial`` from a checkpoint's weights: whether the gains move
  when no other family shares the step. ``--level-head`` trains with ``train-ghn --level-head``
  (a learned level per 1-D parameter, ``LoGAHConfig.level_head``).
- ``--moments RUN``: per role map, the RMS gradient Adam has seen (its second moments, first 256
  rows) in the run's training checkpoint: how much smaller the 1-D roles' gradients are.
- ``--gain-gradient CKPT ...``: per architecture with gains (``--per-family`` of each family), the
  loss's gradient with respect to one level for all its gains (the sum of their gradients) on 4
  batches, and how many are positive: whether the gains have a direction to follow. ``fresh`` is
  a fresh LoGAH of the zoo-vision recipe with a level head.

    .venv/bin/python experiments/layer_scale_gains.py --probe graphkit/ghn/pretrained/logah-tiny-zoo-vision
    .venv/bin/python experiments/layer_scale_gains.py --train runs/zoo-vits-mini-gains0.1-1500 \
        --gain-offset 0.1 --steps 1500
    .venv/bin/python experiments/layer_scale_gains.py --train runs/zoo-vits-mini-deit-200 --steps 200 \
        --family deit --initial graphkit/ghn/pretrained/logah-tiny-zoo-vision \
        --probe graphkit/ghn/pretrained/logah-tiny-zoo-vision
    .venv/bin/python experiments/layer_scale_gains.py --moments runs/zoo-vits-mini-whole-4000
    .venv/bin/python experiments/layer_scale_gains.py --gain-gradient fresh runs/zoo-vits-mini-level-1500
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import zoo_pools  # noqa: E402

from graphkit.ghn import LoGAH, encoding, grow, load_checkpoint, predict, training  # noqa: E402
from graphkit.ghn.pool import ArchPool, graph_for  # noqa: E402
from graphkit.ghn.predict import predicted_params  # noqa: E402
from graphkit.graph import ArchGraph  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.state import load_optimizer_state  # noqa: E402

#: a layer scale's parameter, by its module or leaf name
LAYER_SCALE = re.compile(r"(^|\.)(ls\d?|layer_scale\w*|gamma\w*)(\.|$)")


def layer_scale_gains(graph: ArchGraph) -> set[str]:
    """The 1-D parameters of ``graph``'s ``scale`` nodes named as layer scales."""
    return {
        name
        for node in graph.nodes
        if node.op == "scale"
        for name, shape in node.params.items()
        if len(shape) == 1 and LAYER_SCALE.search(name)
    }


def decode_gains_around(offset: float) -> None:
    """Make every reader of ``encoding.targets`` (encoding, training, predict, grow) decode the
    layer-scale gains as ``tanh(p / 5) + offset``."""
    original = encoding.targets

    def targets(graph: ArchGraph, *args, **kwargs) -> list[encoding.Target]:
        gains = layer_scale_gains(graph)
        plan = original(graph, *args, **kwargs)
        return [dataclasses.replace(t, offset=t.offset + offset) if t.name in gains else t for t in plan]

    for module in (encoding, predict, grow):
        module.targets = targets


def gain_records(zoo: Path, ghn) -> list[tuple[str, object, ArchGraph, set[str]]]:
    """(what, record, graph, gains): the first architecture of each family with layer-scale
    gains, train split first."""
    picked: dict[str, tuple[str, object, ArchGraph, set[str]]] = {}
    for split in ("train", "eval"):
        for record in ArchPool(zoo, split).records:
            family = record.config["zoo_family"]
            if family in picked:
                continue
            graph = graph_for(record, ghn.config)
            if gains := layer_scale_gains(graph):
                picked[family] = (f"{split}: {family} ({record.id})", record, graph, gains)
    return list(picked.values())


def probe(checkpoints: list[Path], zoo: Path) -> None:
    """Print the step-0 table of ``--probe`` for each checkpoint (``zoo_pools.scored``)."""
    source = load_source("digits")
    for checkpoint in checkpoints:
        ghn = load_checkpoint(checkpoint)
        print(f"{checkpoint}: loss / accuracy / image share at step 0", flush=True)
        for what, record, graph, gains in gain_records(zoo, ghn):
            predicted = predicted_params(ghn, graph)
            rms = torch.cat([predicted[name].flatten() for name in gains]).pow(2).mean().sqrt().item()
            starts = {"own": None, "predicted": predicted}
            starts.update(
                (str(value), {**predicted, **{name: torch.full_like(predicted[name], value) for name in gains}})
                for value in (0.1, 1.0)
            )
            row = [what, f"predicted gains' RMS {rms:.3g}"]
            for name, params in starts.items():
                loss, accuracy, share = zoo_pools.scored(record, source, 32, params)
                row.append(f"{name}: {loss:.2f} / {accuracy:.2f} / {share:.2f}")
            print(" | ".join(row), flush=True)


def moments(run: Path) -> None:
    """Print, per role map, the RMS of the gradient Adam has seen (``sqrt(exp_avg_sq)``, the map's
    first 256 rows) in ``run``'s training checkpoint."""
    ghn = load_checkpoint(run / "checkpoint")
    config = training.TrainConfig(**json.loads((run / "checkpoint" / "trainer_state.json").read_text())["config"])
    optimizer = training.make_optimizer(ghn, config)
    load_optimizer_state(run / "checkpoint", optimizer)
    maps = ghn.decoder.role_maps
    seen = optimizer.state[maps]["exp_avg_sq"][:, :256].mean((1, 2)).sqrt()
    for role, rms, now in zip(ghn.config.roles, seen.tolist(), maps.detach()[:, :256].pow(2).mean((1, 2)).sqrt()):
        print(f"{role:24s} gradient RMS {rms:.2g}   map RMS {now:.3f}")


def gain_gradients(checkpoint: str, zoo: Path, per_family: int, batches: int = 4) -> None:
    """Print, per architecture with gains (``per_family`` of each train family), the gradient of
    the loss with respect to one level shared by all its gains on each of ``batches`` batches:
    their mean and how many are positive (opening the gains raises the loss)."""
    pool = ArchPool(zoo, "train")
    recipe = zoo_pools.KINDS["vision"][1]
    if checkpoint == "fresh":
        torch.manual_seed(0)
        ghn = LoGAH.from_variant(
            "tiny",
            roles=pool.roles(recipe["role_key"], recipe["max_roles"]),
            role_key=recipe["role_key"],
            init_anchors=True,
            level_head=True,
        )
    else:
        ghn = load_checkpoint(checkpoint)
    config = training.TrainConfig(dataset=str(zoo), out="-", batch_size=32)
    source = load_source("digits")
    taken: dict[str, int] = {}
    print(f"{checkpoint}: d loss / d (one level of all gains), mean over {batches} batches (positive ones)")
    for index, record in enumerate(pool.records):
        family = record.config["zoo_family"]
        encoded = pool.encoded(index, ghn.config)
        gains = {t.name for t in encoded.targets if len(t.shape) == 1 and LAYER_SCALE.search(t.name)}
        if not gains or taken.get(family, 0) >= per_family:
            continue
        taken[family] = taken.get(family, 0) + 1
        generator = torch.Generator().manual_seed(0)
        sums = []
        for _ in range(batches):
            params = {name: value.detach().requires_grad_() for name, value in ghn([encoded])[0].items()}
            loss, _, _ = training.run_models(pool, [index], [params], source, config, generator)
            grads = torch.autograd.grad(loss, [params[name] for name in sorted(gains)])
            sums.append(sum(g.sum().item() for g in grads))
        positive = sum(v > 0 for v in sums)
        print(f"{family} ({record.id}): {sum(sums) / batches:+.3f} ({positive} of {batches})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", nargs="*", type=Path, default=[], help="checkpoints to probe")
    parser.add_argument("--train", type=Path, default=None, help="train the zoo-vision recipe into this folder")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--gain-offset", type=float, default=0.0, help="decode layer-scale gains around this")
    parser.add_argument("--family", default=None, help="--train on this zoo family's architectures only (a,b: these)")
    parser.add_argument("--initial", type=Path, default=None, help="--train from this checkpoint's weights")
    parser.add_argument("--level-head", action="store_true", help="--train with train-ghn --level-head")
    parser.add_argument("--moments", type=Path, default=None, help="a run folder: its role maps' Adam moments")
    parser.add_argument("--gain-gradient", nargs="*", default=[], help="checkpoints (or fresh): the gains' gradient")
    parser.add_argument("--per-family", type=int, default=2, help="--gain-gradient's architectures a family")
    args = parser.parse_args()
    zoo, recipe = zoo_pools.KINDS["vision"]
    if args.moments is not None:
        moments(args.moments)
    for checkpoint in args.gain_gradient:
        gain_gradients(checkpoint, zoo, args.per_family)
    if args.gain_offset:
        decode_gains_around(args.gain_offset)
    if args.train is not None:
        pool = None if args.family is None else args.family.split(",")
        zoo_pools.train_run(
            {**recipe, "level_head": args.level_head}, zoo, args.train, args.steps, args.initial, pool=pool
        )
        figures = zoo_pools.probe(args.train, zoo_pools.probe_records(zoo, []), load_source("digits"), 32)
        print(json.dumps(figures, indent=1), flush=True)
    probe([*args.probe, *([args.train] if args.train else [])], zoo)


if __name__ == "__main__":
    main()

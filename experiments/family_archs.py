"""Where learning stops inside one family (issue #45, item 1): the zoo-vision recipe on 1, 2, 4,
... architectures of one zoo family, against the pools of whole families.

On a lent H200 (docs/experiments.md, "The vision pools at 1,500 steps") the pools of 1, 4, 16 and
36 families of zoo-vits-mini ended within 0.1 nats of each other at 1,500 steps (training CE
2.10-2.18, chance 2.30), the one family (``vision_transformer``, 89 architectures) included, while
one architecture alone leaves chance within a few hundred steps (issue #40). So the count that
matters is the architectures', not the families'. This script finds where inside one family:

- ``--counts 1 2 4 ...``: nested random subsets of the family's train architectures (a seeded
  shuffle, each count the first N of it; a count past the family's size takes all of it),
  each written as a dataset of its own under ``out/`` (the zoo's files, its train split cut down to
  the subset: the role maps are the subset's own) and trained with the zoo-vision recipe of
  ``zoo_pools.KINDS`` for ``--steps`` steps into ``runs/``;
- probe, per run: training CE and accuracy over the last 100 steps; the prediction alone at step 0
  (``zoo_pools.step0``: loss, accuracy, image share) on the shuffle's first 4 architectures
  (trained by every count from 4 up), on the shuffle's last ``--unseen`` architectures of the
  family (no subset smaller than the family holds them: the same ones for every count), and on one
  architecture of each held-out family;
- ``--variant small``: the same with a larger LoGAH, the control that tells capacity from conflict;
  ``--level-head``: with ``train-ghn --level-head`` (a learned level for 1-D outputs, the layer-scale
  gains among them), the lead for the architecture no pool fits; ``--depth-buckets N``: with the
  encoder's relative-depth embedding, which tells one architecture's blocks apart (without it the
  zoo recipe predicts its blocks alike: ``family_share.py``); ``--role-factors``: with ``train-ghn
  --role-factors`` (a pair of factors per role map beside the decoder's MLP, the lever
  ``free_path.py`` points to); ``--role-vectors``: with ``train-ghn --role-vectors`` (a vector per
  role map for its 1-D parameters, what ``shared_weights.py --own-rest 1-d`` shows the direct
  control's transfer rests on); ``--initial CHECKPOINT``: from that checkpoint
  (``train-ghn --initial-checkpoint``; ``factor_start.py`` writes one); ``--lr`` and ``--role-key``:
  the recipe's base lr and role key replaced (what separates a run from the direct control);
  ``--correction W``: with ``train-ghn --correction W`` (the MLP's share of the factors penalised,
  so that the role factors carry what the roles share); ``--lr-fan-in C``: the recipe's 8 replaced
  (at 32 the role maps, 32 wide, train at the base lr, and every other Linear at most that);
  ``--role-maps-at-lr``: the role maps alone at the base lr (``parameter_groups`` otherwise trains
  them as an r-in Linear's rows), the lever ``shared_weights.py --recipe-lrs maps`` points to;
  ``--gain-head-frozen``: the decoder's gain head kept at its start (lr 0; zero in a fresh or
  ``factor_start.py`` start: every weight at gain 1, the decoder's RMS for its fan-in), as the
  direct control's gains stay near one per role; ``--mlp-frozen``: the decoder MLP's last layer
  kept at its start (zero after ``factor_start.py``: every weight is its role's factors, the direct
  control's model class in the hypernetwork's trainer; a frozen part takes no gradient);
  ``--scale-anchor W``: the loss plus W times the predicted 1-D scales' mean square distance from
  each model's own init (the direct control's stay near it); ``--train-seed S``: ``train-ghn --seed S``,
  the same architectures drawn and batched another way (a run's spread over seeds);
- ``--plot PNG``: the runs' training curves;
- ``--with FAMILY:N``: every subset with FAMILY's first N architectures (its own seeded shuffle)
  added, and FAMILY's last ``--unseen`` probed: whether what one family's architectures share
  survives a second family in the pool; ``--subsets-only``: only write the subsets' datasets (for
  ``factor_start.py``, whose start is per dataset);
- ``--probe-with FAMILY``: FAMILY's last ``--unseen`` probed too, no subset training on them: what
  one family's hypernetwork gives another's (``shared_weights.py --probe-with`` is its direct control);
- ``--unseen-dataset DIR``: only write the zoo with the unseen architectures as its eval split, for
  ``eval-ghn --dataset DIR`` (their 100- and 300-step horizons).

    .venv/bin/python experiments/family_archs.py --counts 1 2 4 8 16 32 89 --plot docs/img/family-archs.png
    .venv/bin/python experiments/family_archs.py --counts 1 2 4 --probe-only     # the runs already in runs/
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from zoo_pools import KINDS, first_of_each, plot, probe, step0, train_run  # noqa: E402

from graphkit.ghn import training  # noqa: E402
from graphkit.ghn.config import ROLE_KEYS  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402

PROBED_TRAINED = 4  # the shuffle's first architectures, probed in every run
PARTS = ("trained", "unseen", "held out")  # the probe's three parts, by the prefix of their entries


def regrouped(maps_at_lr: bool, gain_frozen: bool, mlp_frozen: bool = False) -> None:
    """``train-ghn``'s optimiser from here on with the decoder's role maps at the base lr
    (``maps_at_lr``), its gain head at lr 0 (``gain_frozen``: every gain stays at its start, 1
    where the head starts at zero) and its MLP's last layer at lr 0 (``mlp_frozen``: the MLP's
    output stays at its start, nothing after ``factor_start.py``, so that every weight of a role is
    its role factors' and every architecture reads the same), the rest of
    :func:`graphkit.ghn.training.parameter_groups` as it is. A frozen part takes no gradient, so
    that it stays out of the clip's norm (at lr 0 alone its gradient, the MLP's last layer's the
    largest of all, filled the norm and throttled the rest: docs/experiments.md, "The tables, the
    1-D values and the clip")."""
    groups_of = training.parameter_groups

    def groups(ghn, lr, fan_in=training.LR_FAN_IN):
        decoder = ghn.decoder
        parts = [getattr(decoder, "gain", None) if gain_frozen else None, decoder.mlp[-1] if mlp_frozen else None]
        frozen = {id(p) for part in parts if part is not None for p in part.parameters()}
        maps = getattr(decoder, "role_maps", None)
        out = []
        for group in groups_of(ghn, lr, fan_in):
            at_lr = maps_at_lr and any(p is maps for p in group["params"])
            kept = [p for p in group["params"] if id(p) not in frozen]
            held = [p.requires_grad_(False) for p in group["params"] if id(p) in frozen]
            out += [{**group, "params": kept, "lr": lr if at_lr else group["lr"]}] if kept else []
            out += [{**group, "params": held, "lr": 0.0}] if held else []
        return out

    training.parameter_groups = groups


def is_scale(name: str, value: torch.Tensor) -> bool:
    """Whether the parameter ``name`` is a 1-D scale (a norm's gain, a layer scale): a 1-D
    parameter that is no bias."""
    return value.dim() == 1 and not name.endswith("bias")


def anchored_scales(weight: float) -> None:
    """``train-ghn``'s loss from here on plus ``weight`` times, per model, the mean square distance
    of its predicted 1-D scales (norm gains, layer scales: the 1-D parameters that are no bias)
    from its own init, averaged over the meta-batch: a pull that holds them near their init
    constants, where the direct control's stay (docs/experiments.md, "The tables, the 1-D values
    and the clip"). The cross-entropy logged is the models' alone."""
    run_models, meta_batch_loss = training.run_models, training.meta_batch_loss
    own: dict[int, dict[str, torch.Tensor]] = {}
    pulls: list[torch.Tensor] = []

    def scales_of(pool: ArchPool, index: int) -> dict[str, torch.Tensor]:
        if index not in own:
            with torch.random.fork_rng():  # the training step's draws stay as they were
                params = pool.initialised(index)
            own[index] = {n: p for n, p in params.items() if is_scale(n, p)}
        return own[index]

    def runs(pool, indices, predicted, *args, **kwargs):
        distances = [
            (params[name].float() - value).square().mean()
            for index, params in zip(indices, predicted)
            for name, value in scales_of(pool, index).items()
            if name in params
        ]
        pulls.append(torch.stack(distances).mean() if distances else torch.zeros((), device=pool.device))
        return run_models(pool, indices, predicted, *args, **kwargs)

    def loss(*args, **kwargs):
        out = meta_batch_loss(*args, **kwargs)
        return (out[0] + weight * pulls.pop(), *out[1:])

    training.run_models, training.meta_batch_loss = runs, loss


def mean_of(scores: dict[str, list[float]], part: str) -> str:
    """The mean loss / accuracy of the entries of ``scores`` in ``part``, as ``2.30 / 0.10``."""
    chosen = [v for what, v in scores.items() if what.startswith(part)]
    return f"{statistics.mean(v[0] for v in chosen):.2f} / {statistics.mean(v[1] for v in chosen):.2f}"


def shuffled_ids(zoo: Path, family: str | None, seed: int) -> list[str]:
    """The ids of ``family``'s train architectures in ``zoo`` (in the dataset's order; None: every
    family's, the whole train split), shuffled by ``seed``."""
    records = ArchPool(zoo, "train").records
    ids = [record.id for record in records if family is None or record.config["zoo_family"] == family]
    if not ids:
        raise SystemExit(f"{zoo}: no train architectures of family {family!r}")
    return random.Random(seed).sample(ids, len(ids))


def rows_of(shard: Path, ids: list[str]) -> pa.Table:
    """The rows of the Parquet ``shard`` whose id is one of ``ids``, in the shard's order."""
    table, wanted = pq.read_table(shard), set(ids)
    return table.take([i for i, row_id in enumerate(table.column("id").to_pylist()) if row_id in wanted])


def subset_zoo(zoo: Path, ids: list[str], out: Path) -> Path:
    """A copy of ``zoo`` as ``out`` whose train split holds only the rows of ``ids`` (the eval split whole)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(zoo, out)
    for shard in sorted((out / "data").glob("train-*.parquet")):
        pq.write_table(rows_of(shard, ids), shard)
    return out


def unseen_zoo(zoo: Path, ids: list[str], out: Path) -> Path:
    """A copy of ``zoo`` as ``out`` whose eval split holds the train rows of ``ids`` instead of the
    held-out families (the train split whole): what ``eval-ghn`` reads to fine-tune the unseen
    architectures of the family at 0, 100 and 300 steps."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(zoo, out)
    rows = pa.concat_tables(rows_of(shard, ids) for shard in sorted((out / "data").glob("train-*.parquet")))
    for shard in (out / "data").glob("eval-*.parquet"):
        shard.unlink()
    split = rows.column_names.index("split")
    rows = rows.set_column(split, "split", pa.array(["eval"] * rows.num_rows))
    pq.write_table(rows, out / "data" / "eval-00000-of-00001.parquet")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="vision_transformer", help="the zoo family whose architectures are cut")
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--variant", default="tiny", help="LoGAH size (train-ghn --variant): small is the capacity control"
    )
    parser.add_argument("--level-head", action="store_true", help="train with train-ghn --level-head")
    parser.add_argument("--role-factors", action="store_true", help="train with train-ghn --role-factors")
    parser.add_argument("--role-vectors", action="store_true", help="train with train-ghn --role-vectors")
    parser.add_argument("--initial", type=Path, default=None, help="train-ghn --initial-checkpoint (its own roles)")
    parser.add_argument("--lr", type=float, default=None, help="train-ghn --lr (default: the recipe's)")
    parser.add_argument(
        "--role-maps-at-lr", action="store_true", help="the role maps alone at the base lr (not lr * lr_fan_in / r)"
    )
    parser.add_argument(
        "--gain-head-frozen",
        action="store_true",
        help="the decoder's gain head at lr 0 (every gain stays at its start: 1 from a fresh start)",
    )
    parser.add_argument(
        "--mlp-frozen",
        action="store_true",
        help="the decoder MLP's last layer at lr 0 (its output stays at its start: nothing after factor_start.py)",
    )
    parser.add_argument("--correction", type=float, default=None, help="train-ghn --correction (with --role-factors)")
    parser.add_argument("--lr-fan-in", type=float, default=None, help="train-ghn --lr-fan-in (default: the recipe's)")
    parser.add_argument(
        "--clip", type=float, default=None, help="train-ghn --clip: the gradient norm's clip (default: the recipe's)"
    )
    parser.add_argument(
        "--role-key", choices=ROLE_KEYS, default=None, help="train-ghn --role-key (default: the recipe's)"
    )
    parser.add_argument(
        "--depth-buckets", type=int, default=0, help="train with train-ghn --depth-buckets N (0: the recipe's none)"
    )
    parser.add_argument(
        "--scale-anchor",
        type=float,
        default=0.0,
        metavar="W",
        help="add W times the predicted 1-D scales' mean square distance from each model's own init to the loss",
    )
    parser.add_argument("--seed", type=int, default=0, help="the shuffle's seed")
    parser.add_argument(
        "--train-seed",
        dest="train_seed",
        type=int,
        default=None,
        help="train-ghn --seed: the hypernetwork's draws (architectures, batches) for the same architectures",
    )
    parser.add_argument("--unseen", type=int, default=8, help="architectures of the family no subset holds, probed")
    parser.add_argument("--probe-only", action="store_true", help="probe the runs already in runs/")
    parser.add_argument(
        "--with",
        dest="other",
        default=None,
        metavar="FAMILY:N",
        help="add FAMILY's first N train architectures (its shuffle's) to every subset; its last --unseen are probed",
    )
    parser.add_argument(
        "--probe-with",
        default=None,
        metavar="FAMILY",
        help="also probe FAMILY's last --unseen architectures (its shuffle's), which no subset trains on",
    )
    parser.add_argument("--subsets-only", action="store_true", help="only write the subsets' datasets (for --initial)")
    parser.add_argument(
        "--unseen-dataset",
        type=Path,
        default=None,
        help="only write the zoo with the --unseen architectures as its eval split to this folder (for eval-ghn)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="draw the runs' training curves as this PNG")
    args = parser.parse_args()
    if min(args.counts) < 1:
        parser.error("--counts: each at least 1")
    if not (math.isfinite(args.scale_anchor) and args.scale_anchor >= 0):
        parser.error(f"--scale-anchor: a weight of 0 or more, not {args.scale_anchor}")
    if args.mlp_frozen and args.initial is None:
        parser.error("--mlp-frozen needs --initial (a factor_start.py start, whose MLP gives nothing)")
    zoo, recipe = KINDS["vision"]
    recipe = {**recipe, "variant": args.variant, "level_head": args.level_head, "depth_buckets": args.depth_buckets}
    recipe["role_factors"], recipe["role_vectors"] = args.role_factors, args.role_vectors
    given = {k: getattr(args, k) for k in ("lr", "role_key", "correction", "lr_fan_in", "clip")}
    given["seed"] = args.train_seed
    changed = {k: v for k, v in given.items() if v is not None}
    recipe |= changed
    arm = ("" if args.variant == "tiny" else f"-{args.variant}") + ("-level" if args.level_head else "")
    arm += ("-factors" if args.role_factors else "") + ("-vectors" if args.role_vectors else "")
    arm += f"-from-{args.initial.name}" if args.initial else ""
    arm += "".join(f"-{k}-{v}" for k, v in changed.items())
    arm += f"-depth{args.depth_buckets}" if args.depth_buckets else ""
    arm += ("-maps-at-lr" if args.role_maps_at_lr else "") + ("-gain-frozen" if args.gain_head_frozen else "")
    arm += "-mlp-frozen" if args.mlp_frozen else ""
    arm += f"-scale-anchor-{args.scale_anchor:g}" if args.scale_anchor else ""
    if args.scale_anchor:
        anchored_scales(args.scale_anchor)
    if args.role_maps_at_lr or args.gain_head_frozen or args.mlp_frozen:
        regrouped(args.role_maps_at_lr, args.gain_head_frozen, args.mlp_frozen)
    ids = shuffled_ids(zoo, args.family, args.seed)
    below = max([n for n in args.counts if n < len(ids)], default=0)
    if below > len(ids) - args.unseen:
        parser.error(f"--counts: {below} of {len(ids)} architectures leave fewer than --unseen {args.unseen} unseen")
    if args.unseen_dataset is not None:
        print(unseen_zoo(zoo, ids[len(ids) - args.unseen :], args.unseen_dataset))
        return
    extra: list[str] = []
    parts = PARTS
    suffix = ""  # the folder's and the run's mark of --with
    if args.other is not None:
        other, _, count = args.other.partition(":")
        other_ids = shuffled_ids(zoo, other, args.seed)
        if not count.isdigit() or not 1 <= int(count) <= len(other_ids) - args.unseen:
            parser.error(f"--with {args.other}: N must be 1 to {len(other_ids) - args.unseen} ({other} less --unseen)")
        extra = other_ids[: int(count)]
        suffix = f"-with-{other}-{count}"
        arm += suffix
        parts = (*PARTS, f"{other} unseen")
    records = {record.id: record for record in ArchPool(zoo, "train").records}
    probed = [(f"trained: {i}", records[i]) for i in ids[:PROBED_TRAINED]]
    probed += [(f"unseen: {i}", records[i]) for i in ids[len(ids) - args.unseen :]]
    if extra:
        probed += [(f"{parts[-1]}: {i}", records[i]) for i in other_ids[len(other_ids) - args.unseen :]]
    if args.probe_with is not None:
        probe_ids = shuffled_ids(zoo, args.probe_with, args.seed)
        parts = (*parts, f"{args.probe_with} unseen")
        probed += [(f"{parts[-1]}: {i}", records[i]) for i in probe_ids[len(probe_ids) - args.unseen :]]
    probed += [(f"held out: {f}", r) for f, r in first_of_each(ArchPool(zoo, "eval").records).items()]
    counts = sorted(set(min(n, len(ids)) for n in args.counts))
    if args.subsets_only:
        for n in counts:
            print(subset_zoo(zoo, ids[:n] + extra, ROOT / "out" / f"{zoo.name}-{args.family}-{n}{suffix}"))
        return
    source = load_source(recipe["data"])
    own = {what: step0(None, record, source, 32) for what, record in probed}
    print(json.dumps({"chance (ln 10)": round(math.log(10), 3), "own init @0": own}, indent=1), flush=True)
    header = ["architectures", "training CE (acc.), last 100 steps", "@0: 4 trained", "8 unseen", "held-out families"]
    header += parts[len(PARTS) :]
    table = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    table += ["| own init | - | " + " | ".join(mean_of(own, part) for part in parts) + " |"]
    runs = []
    for n in counts:
        name = f"{zoo.name}-{args.family}-{n}"
        run = ROOT / "runs" / f"{name}{arm}-{args.steps}"
        if not args.probe_only:
            train_run(
                recipe,
                subset_zoo(zoo, ids[:n] + extra, ROOT / "out" / f"{name}{suffix}"),
                run,
                args.steps,
                args.initial,
            )
        runs.append(run)
        figures = probe(run, probed, source, 32)
        print(json.dumps(figures, indent=1), flush=True)
        ce, accuracy = figures["training CE, last 100 steps"], figures["training accuracy, last 100 steps"]
        means = " | ".join(mean_of(figures["predicted @0"], part) for part in parts)
        label = f"{n}, LoGAH-{args.variant}" + (", level head" if args.level_head else "")
        label += f", {args.depth_buckets} depth buckets" if args.depth_buckets else ""
        label += ", role factors" if args.role_factors else ""
        label += ", role vectors" if args.role_vectors else ""
        label += f", from {args.initial.name}" if args.initial else ""
        label += "".join(f", {k} {v}" for k, v in changed.items())
        label += ", role maps at the base lr" if args.role_maps_at_lr else ""
        label += ", gain head frozen" if args.gain_head_frozen else ""
        label += ", MLP frozen" if args.mlp_frozen else ""
        label += f", scales anchored ({args.scale_anchor:g})" if args.scale_anchor else ""
        label += f", with {args.other}" if extra else ""
        table.append(f"| {label} | {ce:.2f} ({accuracy:.2f}) | {means} |")
    print("\n".join(table), flush=True)
    if args.plot is not None:
        plot(runs, args.plot, (math.log(10), "chance (ln 10)"), f"{zoo.name}: {args.family}, N architectures")


if __name__ == "__main__":
    main()

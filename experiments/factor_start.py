"""A start for ``train-ghn --role-factors`` whose MLP only corrects the role's factors (issue #45,
item 1): the second half of the lever ``free_path.py`` points to.

With ``--role-factors`` the factors start at zero and the MLP's output is the whole start: every
query's factors are what a fresh MLP gives it, about 0.85 alike and otherwise arbitrary, and the
role's factors must outgrow that per-architecture noise before the role fits. On eight
architectures of ``vision_transformer`` such a run fits to 1.25 where the shared weights trained
directly under the same sharing fit to 0.39 (docs/experiments.md, "Role factors"). This script
writes the other start: each role's factors set to the mean of what the fresh MLP gives that
role's queries over the dataset's train split, and the MLP's last layer zeroed, so that at step 0
every query of a role gets its role's mean and the MLP's correction starts at nothing (its last
layer's gradient does not). Everything else is the fresh LoGAH ``train-ghn`` draws (seed 0).

The start is a checkpoint; ``family_archs.py --initial`` (or ``train-ghn --initial-checkpoint``)
trains from it with the same recipe and ``--role-factors``:

    .venv/bin/python experiments/factor_start.py out/zoo-vits-mini-vision_transformer-8 runs/factor-start-8
    .venv/bin/python experiments/family_archs.py --counts 8 --role-factors --initial runs/factor-start-8

``--level-head`` writes the same start for ``family_archs.py --level-head --role-factors``;
``--kind decoders`` starts the decoder zoo's recipe (``zoo_pools.KINDS``), ``--table-gain G`` one for
``train-ghn --table-gain G``;
``--role-key KEY`` for ``family_archs.py --role-key KEY`` (``--all-roles`` and ``--role-rows N``
for ``train-ghn`` without ``--max-roles`` and with ``--role-rows N``); ``--init-levels`` a start with role
vectors (``family_archs.py --role-vectors``) set so that every 1-D parameter decodes to its init
constant at step 0, where the direct control's 1-D tensors start.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from zoo_pools import KINDS  # noqa: E402

from graphkit.ghn import load_checkpoint, training  # noqa: E402
from graphkit.ghn.checkpoint import save_checkpoint  # noqa: E402
from graphkit.ghn.config import ROLE_KEYS  # noqa: E402
from graphkit.ghn.encoding import AT_ZERO, activate  # noqa: E402
from graphkit.ghn.model import LoGAH, LowRankDecoder, _DecodeBatch  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402


def fresh(
    dataset: Path,
    work: Path,
    level_head: bool = False,
    options: dict | None = None,
    role_vectors: bool = False,
    kind: str = "vision",
) -> LoGAH:
    """The LoGAH ``train-ghn`` draws for ``dataset`` with the recipe of the mini zoo ``kind``
    (``zoo_pools.KINDS``) and ``--role-factors`` (and ``--level-head``; ``options``, such as
    ``role_key`` or ``table_gain`` in place of the recipe's), its checkpoint's info with it: one step at a
    vanishing lr."""
    _, recipe = KINDS[kind]
    config = training.TrainConfig(
        **{**recipe, **(options or {})},
        dataset=str(dataset),
        out=str(work),
        steps=1,
        lr=1e-12,
        role_factors=True,
        role_vectors=role_vectors,
        level_head=level_head,
        checkpoint_every=1,
    )
    training.train(config, progress=False)
    return load_checkpoint(work)


@torch.no_grad()
def init_level_vectors(ghn: LoGAH, pool: ArchPool) -> tuple[torch.Tensor, list[int]]:
    """Per role map the vector (``LowRankDecoder.role_vectors``) that takes what the start decodes
    for the role's 1-D parameters back to their output function's value at 0, so that with init
    anchors each starts at its model's init constant, as the direct control's 1-D tensors start;
    and the role maps left at zero because their 1-D parameters are of two kinds (norm gains and
    biases), which one vector cannot serve both. Exact because the start's MLP gives nothing: every
    1-D query of a role decodes from the role's factors alone, so its value at row i is the same
    in every architecture."""
    decoder = ghn.decoder
    assert isinstance(decoder, LowRankDecoder) and decoder.role_vectors is not None
    vectors = torch.zeros_like(decoder.role_vectors)
    kinds: dict[int, set[bool]] = {}
    for index in range(len(pool)):
        graph = pool.encoded(index, ghn.config)
        batch = _DecodeBatch([graph])
        at = batch.on(torch.device("cpu"))
        products, head, *_ = decoder.products(ghn.encoder([graph]), batch)
        for k, (q, length) in enumerate(zip(batch.vector_queries, batch.vector_lengths)):
            if not at["vector_first"][k]:
                continue
            role, norm = int(at["role"][q]), bool(at["is_norm"][k])
            kinds.setdefault(role, set()).add(norm)
            kind = "norm" if norm else "bias"
            values = activate(kind, (products[q] @ head(role, 1)[0]) @ head(role, length).t())
            n = min(length, vectors.shape[1])
            vectors[role, :n] = AT_ZERO[kind] - values[:n]
    mixed = sorted(role for role, seen in kinds.items() if len(seen) > 1)
    vectors[mixed] = 0
    return vectors, mixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="the dataset whose train split the role means are over")
    parser.add_argument("out", type=Path, help="the start's checkpoint folder (written; must not exist)")
    parser.add_argument("--level-head", action="store_true", help="a start with train-ghn --level-head (zero levels)")
    parser.add_argument(
        "--init-levels",
        action="store_true",
        help="a start with train-ghn --role-vectors whose 1-D parameters decode to their init constants",
    )
    parser.add_argument(
        "--role-key", choices=ROLE_KEYS, default=None, help="a start with train-ghn --role-key (default: the recipe's)"
    )
    parser.add_argument(
        "--all-roles", action="store_true", help="a map for every role of the train split (no --max-roles)"
    )
    parser.add_argument("--role-rows", type=int, default=None, help="a start with train-ghn --role-rows N")
    parser.add_argument("--table-gain", type=float, default=None, help="a start with train-ghn --table-gain G")
    parser.add_argument("--kind", choices=sorted(KINDS), default="vision", help="the mini zoo whose recipe it starts")
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"out: {args.out} exists; name a new folder")
    with tempfile.TemporaryDirectory() as work:
        options = {
            name: value
            for name, value, given in (
                ("role_key", args.role_key, args.role_key is not None),
                ("max_roles", None, args.all_roles),
                ("role_rows", args.role_rows, args.role_rows is not None),
                ("table_gain", args.table_gain, args.table_gain is not None),
            )
            if given
        }
        ghn = fresh(args.dataset, Path(work) / "fresh", args.level_head, options, args.init_levels, args.kind)
    pool = ArchPool(args.dataset, "train")
    counts = ghn.start_at_role_means(pool.split_encoded(ghn.config))
    mixed: list[int] = []
    if args.init_levels:
        levels, mixed = init_level_vectors(ghn, pool)
        with torch.no_grad():
            ghn.decoder.role_vectors.copy_(levels)
    # a start, not a stage: the run trained from it records no steps of it (training.stages)
    info = {**ghn.info, "steps": 0, "stages": [{**stage, "steps": 0} for stage in ghn.info.get("stages", [])]}
    save_checkpoint(args.out, ghn, info)  # atomic: a killed run leaves no folder behind
    print(
        json.dumps(
            {"queries per role": counts.int().tolist(), "role maps of two 1-D kinds": mixed, "out": str(args.out)}
        )
    )


if __name__ == "__main__":
    main()

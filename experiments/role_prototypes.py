"""Role prototypes for a checkpoint trained before ``train-ghn`` fitted them (issue #45).

A checkpoint with a role map for every role of its train split (``train-ghn --role-maps`` without
``--max-roles``) never trained its shared map: a parameter of a role it never saw, such as
efficientvit's ``classifier.weight`` or the hand-written LLaMA block's ``wq.weight``, decodes through
that map alone, and with the role-means start its factors are zero. Since 2026-12-06 ``train-ghn``
fits each role's prototype (the mean encoder embedding of the nodes that hold its parameters) when
such a run ends, and ``predict`` gives an unseen role the nearest trained role of its signature
(``LoGAH.nearest_roles``). This script fits them, over the train split of the dataset the
checkpoint trained on, for a checkpoint from before, rewritten in place; its weights and
config.json are otherwise unchanged (the bundled decoder zoo's got its prototypes so):

    .venv/bin/python experiments/role_prototypes.py CHECKPOINT out/zoo-decoders-mini
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.checkpoint import save_checkpoint  # noqa: E402
from graphkit.ghn.model import LoGAH  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402


def with_prototypes(checkpoint: str, dataset: str) -> tuple[LoGAH, int]:
    """The checkpoint's LoGAH with role prototypes fitted over ``dataset``'s train split, and how
    many of its role maps got one."""
    saved = load_checkpoint(checkpoint)
    if not saved.config.roles:
        raise SystemExit(f"{checkpoint}: has no role maps, so no role is unseen that a prototype could place")
    ghn = LoGAH(replace(saved.config, role_prototypes=True))
    ghn.load_state_dict(ghn.with_own_prototypes(saved.state_dict()))
    ghn.info = saved.info
    pool = ArchPool(dataset, "train")
    counts = ghn.eval().fit_role_prototypes(pool.split_encoded(ghn.config))
    return ghn, int((counts > 0).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint folder, rewritten in place")
    parser.add_argument("dataset", help="the dataset it trained on (its train split)")
    args = parser.parse_args()
    ghn, placed = with_prototypes(args.checkpoint, args.dataset)
    info = {k: v for k, v in ghn.info.items() if k not in ("logah", "ops_version")}  # save_checkpoint writes both
    save_checkpoint(args.checkpoint, ghn, info)
    print(f"{args.checkpoint}: prototypes for {placed} of {len(ghn.config.roles)} role maps")


if __name__ == "__main__":
    main()

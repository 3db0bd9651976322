"""Where the hypernetwork's path costs the fit (issue #45, item 1): the control that
``shared_weights.py``'s results asked for next.

On one architecture of ``vision_transformer`` (the first of ``family_archs.py``'s shuffle), weights
trained directly under every bound of LoGAH's decoder (blocks tied, rank 32, one map for a block's
rows and columns, each weight at the RMS the decoder gives it) fit to a training CE of 0.03 in
1,500 steps; LoGAH-tiny with the zoo-vision recipe reaches 0.50. What lies between is the path:
the encoder's node embeddings, the decoder's MLP from a query to its two r x r factors, and the
learning rates ``parameter_groups`` gives each. Here the same training (``train-ghn``'s step:
``training.meta_batch_loss``, AdamW over ``parameter_groups``, clipping, cosine schedule, the same
per-step seeds) runs three hypernetworks that start from the same predictions:

- ``as is``: LoGAH as ``train-ghn`` builds it (the control: it must land near the 0.50 of
  ``train-ghn`` itself);
- ``MLP bypassed``: the decoder's MLP replaced by one free output per query, started at what the
  MLP gave (the factors trained directly, everything else as is);
- ``encoder bypassed``: the encoder replaced by one free embedding per node, started at what it gave;
- ``as is, base lr``: LoGAH as is, every layer at the base lr (``--lr-fan-in`` past every fan-in),
  as the free tables of the two arms above train: the MLP's form against its learning rate;
- ``role factors``: LoGAH with ``--role-factors`` (a pair of factors per role map, trained at the
  base lr beside the MLP, zero at the start), the lever the arms above point to.

One architecture is fixed, so its queries and nodes are the same at every step and a table of
free outputs in their order stands in for either module.

    .venv/bin/python experiments/free_path.py runs/zoo-vits-mini-vision_transformer-1-1500
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from zoo_pools import KINDS  # noqa: E402

from graphkit.ghn import load_checkpoint, training  # noqa: E402
from graphkit.ghn.model import LoGAH, LowRankDecoder  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import step_seed  # noqa: E402

ARMS = ("as is", "MLP bypassed", "encoder bypassed", "as is, base lr", "role factors")
#: the ``--lr-fan-in`` of ``as is, base lr``: past every fan-in of LoGAH-tiny, so every layer trains at the base lr
BASE_LR_FAN_IN = 4096.0


class Table(nn.Module):
    """A module that returns the same trainable rows for the one architecture's fixed input: the
    output a module gave on it, made free parameters. A meta-batch holds that architecture several
    times, so the rows repeat once per copy: per graph of a list (the encoder's input), or as often
    as they fit the rows of a tensor (the MLP's queries)."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.rows = nn.Parameter(rows.detach().clone())

    def forward(self, given: torch.Tensor | list) -> torch.Tensor:
        copies = len(given) if isinstance(given, list) else len(given) // len(self.rows)
        return self.rows.repeat(copies, 1)


def hypernetwork(config, arm: str, graph) -> LoGAH:
    """A fresh LoGAH of ``config`` (seed 0, as ``train-ghn`` draws it), with ``arm``'s module
    replaced by a :class:`Table` of what it gives on ``graph``."""
    torch.manual_seed(0)
    ghn = LoGAH(replace(config, role_factors=True) if arm == "role factors" else config)
    with torch.no_grad():
        nodes = ghn.encoder([graph])
        if arm == "encoder bypassed":
            ghn.encoder = Table(nodes)  # type: ignore[assignment]
        elif arm == "MLP bypassed":
            decoder = ghn.decoder
            if not isinstance(decoder, LowRankDecoder):
                raise SystemExit(f"the MLP bypass needs the low_rank decoder, not {ghn.config.decoder!r}")
            decoder.mlp = Table(decoder.mlp(decoder.queries(nodes, graph.queries)))  # type: ignore[assignment]
    return ghn


def train_arm(ghn: LoGAH, pool: ArchPool, index: int, source, config: training.TrainConfig) -> list[float]:
    """``train-ghn``'s step, ``config.steps`` times, on architecture ``index`` alone; the training CE per step."""
    optimizer = training.make_optimizer(ghn, config)
    steps = config.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    graph = pool.encoded(index, ghn.config)
    curve = []
    for step in range(steps):
        seed = step_seed(config.seed, step, 0)
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        indices = [index] * config.meta_batch
        loss, ce, *_ = training.meta_batch_loss(
            ghn, [graph] * len(indices), pool, indices, source, config, generator, False
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(ghn.parameters(), config.clip)
        optimizer.step()
        schedule.step()
        curve.append(ce.item())
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="family_archs.py's run on the one architecture (its config)")
    parser.add_argument("--dataset", type=Path, default=ROOT / "out" / "zoo-vits-mini-vision_transformer-1")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS[:3]))
    parser.add_argument("--out", type=Path, default=None, help="write the curves as this JSON")
    args = parser.parse_args()
    _, recipe = KINDS["vision"]
    pool = ArchPool(args.dataset, "train")
    if len(pool) != 1:
        parser.error(f"--dataset: {args.dataset} holds {len(pool)} architectures; this control takes one")
    source = load_source(recipe["data"])
    config = training.TrainConfig(
        **recipe, dataset=str(args.dataset), out=str(ROOT / "runs" / "unused"), steps=args.steps
    )
    ghn_config = load_checkpoint(args.run).config
    results = {}
    for arm in args.arms:
        ghn = hypernetwork(ghn_config, arm, pool.encoded(0, ghn_config))
        arm_config = replace(config, lr_fan_in=BASE_LR_FAN_IN) if arm == "as is, base lr" else config
        curve = train_arm(ghn, pool, 0, source, arm_config)
        windows = [round(statistics.mean(curve[i : i + 100]), 3) for i in range(0, len(curve), 100)]
        results[arm] = {"training CE, last 100 steps": windows[-1], "by 100 steps": windows}
        print(json.dumps({arm: results[arm]}), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()

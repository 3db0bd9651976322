"""Does a run's role-factor part carry the shared solution? (issue #45, item 1)

A hypernetwork trained with ``train-ghn --role-factors`` decodes each weight from its role's
factors plus the MLP's correction for its query. If the role's factors held what the
architectures share (as one tensor per name trained directly does: ``shared_weights.py`` on 32
architectures of ``vision_transformer`` predicts 8 unseen ones at 1.72 / 0.49), they would
predict alone, the MLP's correction dropped (its last layer zeroed). This probes each run's
predictions alone at step 0 (``zoo_pools.step0``: loss and accuracy, BatchNorm statistics
estimated) on ``family_archs.py``'s shuffle: its first 4 architectures (trained by every subset of
4 or more) and its last 8 (unseen by every subset smaller than the family), as trained and with
the role factors alone.

    .venv/bin/python experiments/factors_alone.py runs/zoo-vits-mini-vision_transformer-8-factors-lr-0.001-1500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from family_archs import PROBED_TRAINED, shuffled_ids  # noqa: E402
from zoo_pools import KINDS, step0  # noqa: E402

from graphkit.ghn import load_checkpoint  # noqa: E402
from graphkit.ghn.model import LowRankDecoder  # noqa: E402
from graphkit.ghn.pool import ArchPool  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="family_archs.py runs trained with --role-factors")
    parser.add_argument("--family", default="vision_transformer")
    parser.add_argument("--seed", type=int, default=0, help="family_archs.py's shuffle seed")
    parser.add_argument("--unseen", type=int, default=8)
    args = parser.parse_args()
    zoo, recipe = KINDS["vision"]
    ids = shuffled_ids(zoo, args.family, args.seed)
    records = {record.id: record for record in ArchPool(zoo, "train").records}
    parts = {"trained": ids[:PROBED_TRAINED], "unseen": ids[len(ids) - args.unseen :]}
    source = load_source(recipe["data"])
    for run in args.runs:
        ghn = load_checkpoint(run).eval()
        decoder = ghn.decoder
        if not isinstance(decoder, LowRankDecoder) or decoder.role_factors is None:
            parser.error(f"{run}: not trained with --role-factors")
        last = decoder.mlp[-1]
        assert isinstance(last, torch.nn.Linear)
        figures = {}
        for mode in ("as trained", "role factors alone"):
            if mode == "role factors alone":
                with torch.no_grad():
                    last.weight.zero_()
                    last.bias.zero_()
            for part, chosen in parts.items():
                scores = [step0(ghn, records[i], source, 32) for i in chosen]
                loss, accuracy = (round(statistics.mean(s[k] for s in scores), 2) for k in (0, 1))
                figures[f"{mode}, {part}"] = [loss, accuracy]
        print(json.dumps({run.name: figures}), flush=True)


if __name__ == "__main__":
    main()

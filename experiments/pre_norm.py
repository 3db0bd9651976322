"""Whether the bundled ViT hypernetwork learns CLIP's pre-norm by training on it (issue #45,
item 4's CLIP row): a norm on the stream before the blocks, which the checkpoint never saw,
turns a 12 x 256 ViT's prediction at 8 px from 0.99 on held-out digits at step 0 into 3.36 (own
init 2.34; docs/experiments.md, "The ViTs the libraries build").

    .venv/bin/python experiments/pre_norm.py data          # the two datasets below (a minute)
    # then, one at a time (each about 6 minutes on 2 cores):
    .venv/bin/python -m graphkit train-ghn --dataset out/vits-digits-mixed --initial-checkpoint \
        graphkit/ghn/pretrained/logah-tiny-vits --steps 500 --lr-fan-in 8 --out runs/pre-norm-mixed-500
    .venv/bin/python -m graphkit train-ghn --dataset out/vits-digits --initial-checkpoint \
        graphkit/ghn/pretrained/logah-tiny-vits --steps 500 --lr-fan-in 8 --out runs/pre-norm-control-500
    .venv/bin/python experiments/pre_norm.py score logah-tiny-vits runs/pre-norm-mixed-500 runs/pre-norm-control-500

`data` writes `out/vits-digits-pre-norm`, vits-digits' 80 architectures with `pre_norm=True`,
each record in the split its architecture has in `out/vits-digits` (the recipe alone draws
another split over the same space, whose training half holds vits-digits' held-out
architectures), and `out/vits-digits-mixed`, both datasets' records in one folder. The arms:
the bundled checkpoint as shipped; trained 500 steps more on the mixed dataset; and the
control, 500 steps more on vits-digits alone, so that what more training does is not credited
to the pre-norm data.

`data` also writes `out/vits-digits-patch4`, the same architectures at patch 4 (a 2 x 2 token
grid, coarser than the 4 x 4 one the checkpoint trained on), and `out/vits-digits-grids-mixed`,
the three kinds in one folder, all in vits-digits' splits: the data of a third stage across token
grids (docs/experiments.md, "A third stage across token grids"):

    .venv/bin/python -m graphkit train-ghn --dataset out/vits-digits-grids-mixed --initial-checkpoint \
        graphkit/ghn/pretrained/logah-tiny-vits --steps 1500 --lr-fan-in 8 --out runs/grids-mixed-1500

and `out/vits-digits-grid8`, the same architectures at 16 px with patch 2 (an 8 x 8 grid), and
`out/vits-digits-grids-248`, the four kinds in one folder (docs/experiments.md, "Training on the
8 x 8 grid too"; a third stage on it from the two-stage checkpoint, 32 minutes on 2 cores):

    .venv/bin/python -m graphkit train-ghn --dataset out/vits-digits-grids-248 --initial-checkpoint \
        runs/pre-norm-mixed-3000 --steps 1500 --meta-batch 4 --batch-size 32 --lr-fan-in 8 --out runs/grids-248-1500

and `out/vits-digits-grids-248-sparse`, the same with the 8 x 8 records of only a third of the
training architectures, so that a tenth of the draws are 8 x 8, not a quarter (the same stage
with `--dataset out/vits-digits-grids-248-sparse --steps 1400`: 18 minutes; "The 8 x 8 stage
weighted towards the coarser grids").

`score` prints, for each checkpoint, the held-out architectures' step-0 loss / accuracy (the
prediction alone, as `predict` writes it) on digits, the mean over the 8 held-out architectures
of each dataset (plain, pre-norm, patch 4, the 8 x 8 grid), beside their own inits' mean; then CLIP's ViT-B/32
and the plain ViT-B/32 at 224 px, predicted as `predict` does (through their twins), as
`benchmarks/vit_resolution.py` scores them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
import torch  # noqa: E402
from vit_resolution import built  # noqa: E402

from graphkit.datasets import load  # noqa: E402
from graphkit.datasets.store import read_rows, write_shard  # noqa: E402
from graphkit.families import FAMILIES, build_model  # noqa: E402
from graphkit.ghn.predict import bundled_hypernetwork, predict  # noqa: E402
from graphkit.tracing import trace  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.loop import score  # noqa: E402

PLAIN, PRE_NORM, MIXED = ROOT / "out/vits-digits", ROOT / "out/vits-digits-pre-norm", ROOT / "out/vits-digits-mixed"
#: vits-digits' architectures at patch 4 (a 2 x 2 token grid), and the three kinds in one folder
PATCH4, GRIDS_MIXED = ROOT / "out/vits-digits-patch4", ROOT / "out/vits-digits-grids-mixed"
#: vits-digits' architectures at 16 px with patch 2 (an 8 x 8 token grid), and the four kinds in one folder
GRID8, GRIDS_248 = ROOT / "out/vits-digits-grid8", ROOT / "out/vits-digits-grids-248"
#: the 8 x 8 records of a third of the training architectures, and the four kinds with them: a
#: stage whose draws (uniform over architectures) are 10% 8 x 8, not 25%
GRID8_THIRD, GRIDS_248_SPARSE = ROOT / "out/vits-digits-grid8-third", ROOT / "out/vits-digits-grids-248-sparse"
#: the fields a twin changes: an architecture is the same one whatever their values
TWIN_FIELDS = ("pre_norm", "patch_size", "image_size")


def _architecture(config: dict) -> str:
    return json.dumps({k: v for k, v in config.items() if k not in TWIN_FIELDS}, sort_keys=True)


def _twins(folder: Path, fixed: dict, description: str, splits: dict[str, str]) -> None:
    """Write vits-digits' architectures with ``fixed`` changed into ``folder``, each record in the
    split its architecture has in vits-digits (``splits``)."""
    recipe = next(r for r in FAMILIES["vit"].recipes if r["name"] == "vits-digits")
    recipe = {**recipe, "name": folder.name, "fixed": {**recipe["fixed"], **fixed}, "description": description}
    scratch = folder.with_suffix(".json")
    scratch.write_text(json.dumps(recipe))
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "graphkit", "generate", scratch, "--out", folder], check=True)
    scratch.unlink()
    for shard in sorted((folder / "data").glob("*.parquet")):
        rows = read_rows(shard)
        for row in rows:
            row["split"] = splits[_architecture(json.loads(row["config"]))]
        shard.unlink()
        for split in ("train", "eval"):
            write_shard([r for r in rows if r["split"] == split], shard.parent / f"{split}-{shard.name}")


def _merged(folder: Path, parts: dict[str, Path]) -> None:
    """Copy the shards of each of ``parts`` (name -> dataset folder) into one dataset ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "data").mkdir(parents=True)
    for name, part in parts.items():
        for shard in (part / "data").glob("*.parquet"):
            shutil.copy(shard, folder / "data" / f"{name}-{shard.name}")
    manifest = json.loads((PLAIN / "manifest.json").read_text())  # its ops; the name says what the folder is
    (folder / "manifest.json").write_text(json.dumps({**manifest, "name": folder.name}))
    counts = load(folder).metadata().groupby("split").size().to_dict()
    print(f"wrote {folder} ({counts})")


def _thinned(folder: Path, part: Path, every: int) -> None:
    """Copy the dataset ``part`` into ``folder`` with the train records of only every ``every``-th
    training architecture (by fingerprint), its held-out records all kept."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "data").mkdir(parents=True)
    table = load(part).metadata()
    kept = set(sorted(set(table[table.split == "train"].fingerprint))[::every])
    for shard in (part / "data").glob("*.parquet"):
        rows = [r for r in read_rows(shard) if r["split"] == "eval" or r["fingerprint"] in kept]
        write_shard(rows, folder / "data" / shard.name)
    manifest = json.loads((part / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "name": folder.name}))


def data() -> None:
    """Write the pre-norm and patch-4 datasets in vits-digits' splits, then the mixed ones."""
    if not PLAIN.exists():
        subprocess.run([sys.executable, "-m", "graphkit", "generate", "vits-digits", "--out", PLAIN], check=True)
    splits = {_architecture(json.loads(c)): s for c, s in load(PLAIN).metadata()[["config", "split"]].values}
    _twins(PRE_NORM, {"pre_norm": True}, "vits-digits' space with CLIP's pre-norm", splits)
    _twins(PATCH4, {"patch_size": 4}, "vits-digits' space at patch 4: a 2 x 2 token grid", splits)
    _merged(MIXED, {"plain": PLAIN, "pre-norm": PRE_NORM})
    _merged(GRIDS_MIXED, {"plain": PLAIN, "pre-norm": PRE_NORM, "patch4": PATCH4})
    _twins(GRID8, {"image_size": 16}, "vits-digits' space at 16 px: an 8 x 8 token grid", splits)
    _merged(GRIDS_248, {"plain": PLAIN, "pre-norm": PRE_NORM, "patch4": PATCH4, "grid8": GRID8})
    _thinned(GRID8_THIRD, GRID8, 3)
    _merged(GRIDS_248_SPARSE, {"plain": PLAIN, "pre-norm": PRE_NORM, "patch4": PATCH4, "grid8": GRID8_THIRD})


def held_out(folder: Path) -> list[dict]:
    """The configs of the held-out architectures of the dataset ``folder``, once each."""
    table = load(folder).metadata()
    configs = [json.loads(c) for c in table[table.split == "eval"].config]
    return list({_architecture(c): c for c in configs}.values())


def scores(checkpoints: list[str]) -> None:
    """Print the mean step-0 loss / accuracy of each checkpoint's predictions and of the own inits."""
    source = load_source("digits")
    for folder in (PLAIN, PRE_NORM, PATCH4, GRID8):
        configs = held_out(folder)
        rows = {}
        for name in ["own init", *checkpoints]:
            results = []
            for config in configs:
                torch.manual_seed(0)
                model = build_model(config, "cpu")
                batches, _ = common.fixed_batches(source, model, 32, 4, 0)
                if name != "own init":
                    predict(model, bundled_hypernetwork(name), graph=trace(model))
                results.append(score(model, batches, "image"))
            loss = sum(r[0] for r in results) / len(results)
            accuracy = sum(r[1] for r in results) / len(results)
            rows[name] = f"{loss:.2f} / {accuracy:.2f}"
        print(f"{folder.name} ({len(configs)} held-out architectures): {rows}", flush=True)
    for name in ("vit_base_patch32_clip_224", "vit_base_patch32_224"):  # CLIP's ViT-B/32 and its plain control
        rows = {}
        for checkpoint in ["own init", *checkpoints]:
            model = built(name, {})
            batches, _ = common.fixed_batches(source, model, 32, 4, 0)
            if checkpoint != "own init":
                predict(model, bundled_hypernetwork(checkpoint), graph=trace(model))
            loss, accuracy = score(model, batches, "image")
            rows[checkpoint] = f"{loss:.2f} / {accuracy:.2f}"
        print(f"{name} at 224 px: {rows}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("data", "score"))
    parser.add_argument("checkpoints", nargs="*", default=["logah-tiny-vits"])
    args = parser.parse_args()
    data() if args.what == "data" else scores(args.checkpoints)

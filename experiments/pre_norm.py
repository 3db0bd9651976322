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

`score` prints, for each checkpoint, the held-out architectures' step-0 loss / accuracy (the
prediction alone, as `predict` writes it) on digits, the mean over the 8 held-out architectures
of each dataset, beside their own inits' mean; then CLIP's ViT-B/32 and the plain ViT-B/32 at
224 px, predicted as `predict` does (through their twins), as `benchmarks/vit_resolution.py`
scores them.
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


def _architecture(config: dict) -> str:
    return json.dumps({k: v for k, v in config.items() if k != "pre_norm"}, sort_keys=True)


def data() -> None:
    """Write the pre-norm dataset in vits-digits' splits, then the mixed one."""
    recipe = next(r for r in FAMILIES["vit"].recipes if r["name"] == "vits-digits")
    recipe = {**recipe, "name": "vits-digits-pre-norm", "fixed": {**recipe["fixed"], "pre_norm": True}}
    recipe["description"] = "vits-digits' space with CLIP's pre-norm"
    scratch = ROOT / "out/vits-digits-pre-norm.json"
    scratch.write_text(json.dumps(recipe))
    if not PLAIN.exists():
        subprocess.run([sys.executable, "-m", "graphkit", "generate", "vits-digits", "--out", PLAIN], check=True)
    for folder in (PRE_NORM, MIXED):
        shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "graphkit", "generate", scratch, "--out", PRE_NORM], check=True)
    scratch.unlink()
    splits = {_architecture(json.loads(c)): s for c, s in load(PLAIN).metadata()[["config", "split"]].values}
    for shard in sorted((PRE_NORM / "data").glob("*.parquet")):
        rows = read_rows(shard)
        for row in rows:
            row["split"] = splits[_architecture(json.loads(row["config"]))]
        shard.unlink()
        for split in ("train", "eval"):
            write_shard([r for r in rows if r["split"] == split], shard.parent / f"{split}-{shard.name}")
    (MIXED / "data").mkdir(parents=True)
    for name, folder in (("plain", PLAIN), ("pre-norm", PRE_NORM)):
        for shard in (folder / "data").glob("*.parquet"):
            shutil.copy(shard, MIXED / "data" / f"{name}-{shard.name}")
    manifest = json.loads((PLAIN / "manifest.json").read_text())  # its ops; the name says what the folder is
    (MIXED / "manifest.json").write_text(json.dumps({**manifest, "name": MIXED.name}))
    counts = load(MIXED).metadata().groupby("split").size().to_dict()
    print(f"wrote {PRE_NORM} and {MIXED} ({counts})")


def held_out(folder: Path) -> list[dict]:
    """The configs of the held-out architectures of the dataset ``folder``, once each."""
    table = load(folder).metadata()
    configs = [json.loads(c) for c in table[table.split == "eval"].config]
    return list({_architecture(c): c for c in configs}.values())


def scores(checkpoints: list[str]) -> None:
    """Print the mean step-0 loss / accuracy of each checkpoint's predictions and of the own inits."""
    source = load_source("digits")
    for folder in (PLAIN, PRE_NORM):
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

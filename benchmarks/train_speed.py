"""Hypernetwork training throughput: architectures per second for LoGAH-tiny, LoGAH-small and the
GHN-3 decoder (the reference, same encoder as LoGAH-tiny), on ViTs (vits-digits, digits data)
and GPT-2s (gpts-1k, stdlib text).

    .venv/bin/python benchmarks/train_speed.py            # print the table
    .venv/bin/python benchmarks/train_speed.py --write    # also update BENCHMARKS.md

Each row trains for ``--steps`` steps (meta-batch 4 ViTs x 32 images, or 2 GPT-2s x 8 sequences
of 64 bytes) in a fresh process on a 40-record dataset generated on the spot; the first 2 steps
(model building, caches) are not timed: times come from the run's metrics.jsonl.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

RUNS = {
    "vit": ("vits-digits", dict(meta_batch=4, batch_size=32)),
    "gpt2": ("gpts-1k", dict(meta_batch=2, batch_size=8, seq_len=64)),
}
HYPERNETS = {"LoGAH-tiny": ("tiny", "low_rank"), "LoGAH-small": ("small", "low_rank"), "GHN-3-tiny (tiling)": ("tiny", "ghn3")}


def one(family: str, hypernet: str, steps: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from graphkit.datasets.generate import generate
    from graphkit.ghn.training import TrainConfig, train

    recipe, options = RUNS[family]
    variant, decoder = HYPERNETS[hypernet]
    with tempfile.TemporaryDirectory() as tmp:
        generate(recipe, Path(tmp) / "data", num=40)
        common_args = dict(dataset=str(Path(tmp) / "data"), variant=variant, decoder=decoder, log_every=1,
                           checkpoint_every=10_000, **options)
        train(TrainConfig(out=str(Path(tmp) / "run"), steps=int(steps) + 2, **common_args), progress=False)
        lines = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    elapsed = [options["meta_batch"] * m["step"] / m["archs_per_s"] for m in lines]  # seconds since the start
    seconds = elapsed[-1] - elapsed[1]
    return {"archs_per_s": options["meta_batch"] * int(steps) / seconds}


def table(args) -> str:
    rows = ["| hypernetwork | ViTs (vits-digits), architectures/s | GPT-2s (gpts-1k), architectures/s |", "|---|---|---|"]
    results = {}
    for hypernet in HYPERNETS:
        results[hypernet] = {f: common.run_fresh(__file__, f, hypernet, str(args.steps))["archs_per_s"] for f in RUNS}
        rows.append(f"| {hypernet} | {results[hypernet]['vit']:.2f} | {results[hypernet]['gpt2']:.2f} |")
        print(rows[-1], flush=True)
    ref = results["GHN-3-tiny (tiling)"]
    ratio = " and ".join(f"{results['LoGAH-tiny'][f] / ref[f]:.2f}x on {label}" for f, label in (("vit", "ViTs"), ("gpt2", "GPT-2s")))
    head = (f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores (CPU), {args.steps} timed steps per row, "
            f"each row a fresh process. LoGAH-tiny against GHN-3's decoder: {ratio}. Command: "
            "`.venv/bin/python benchmarks/train_speed.py --write`.")
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:
    if "--one" in sys.argv:
        i = sys.argv.index("--one")
        print(json.dumps(one(*sys.argv[i + 1:i + 4])))
        return
    common.main(__doc__, "train_speed", table, lambda p: p.add_argument("--steps", type=int, default=10))


if __name__ == "__main__":
    main()

"""Graph datasets: generation time, size, load speed, against the original pickle format.

    .venv/bin/python benchmarks/dataset_speed.py            # print the table
    .venv/bin/python benchmarks/dataset_speed.py --write    # also update the section in BENCHMARKS.md

For vits-1k and gpts-1k: wall time of ``graphkit generate RECIPE --workers 2`` as a user runs
it (a fresh process, imports included) and its CPU time (user + system, workers included: on a
shared machine the wall time depends on the neighbours, the CPU time much less); the folder's
size; the time to load the dataset and convert all records to PyG ``Data``; the median time to fetch
one record by id and decode its graph. The reference is the original LoGAH release, one pickle per
architecture that embeds the
whole model with its weights: the same figures are measured on --pickles sampled records
(model built with real weights, ``torch.save``d, loaded back) and scaled to 1,000.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import torch

from graphkit.datasets import load
from graphkit.families import build_model

BIN = Path(sys.executable).parent


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def graphkit_figures(recipe: str, root: Path) -> dict:
    out = root / recipe
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [str(BIN / "graphkit"), "generate", recipe, "--out", str(out), "--workers", "2"],
        check=True,
        capture_output=True,
    )
    generate_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    code = f"""
import json, random, statistics, time, warnings
warnings.filterwarnings("ignore")
import torch_geometric
from graphkit.datasets import load
start = time.perf_counter()
ds = load({str(out)!r})
pyg = ds.to_pyg()
load_s = time.perf_counter() - start
ids = random.Random(0).sample(ds.ids, 50)
fetch = []
for i in ids:
    t = time.perf_counter()
    ds[i].graph
    fetch.append(time.perf_counter() - t)
print(json.dumps({{"records": len(pyg), "load_pyg_s": load_s, "fetch_ms": 1000 * statistics.median(fetch)}}))
"""
    result = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    architectures = json.loads((out / "manifest.json").read_text())["architectures"]
    return {
        "generate_s": generate_s,
        "generate_cpu_s": cpu_s,
        "architectures": architectures,
        "size_mb": folder_size(out) / 1e6,
        **result,
    }


def pickle_figures(recipe: str, root: Path, count: int) -> dict:
    """The original format: one torch.save'd model (with weights) per record."""

    records = random.Random(0).sample(list(load(root / recipe)), count)
    sizes, loads = [], []
    for k, record in enumerate(records):
        path = root / f"{recipe}-{k}.pt"
        torch.save({"config": record.config, "net": build_model(record.config, device="cpu")}, path)
        sizes.append(path.stat().st_size)
        start = time.perf_counter()
        torch.load(path, weights_only=False)
        loads.append(time.perf_counter() - start)
        path.unlink()
    return {
        "size_mb_per_1k": statistics.mean(sizes) * 1000 / 1e6,
        "load_all_s": statistics.mean(loads) * 1000,
        "fetch_ms": 1000 * statistics.median(loads),
    }


def table(pickles: int) -> str:

    rows = [
        "| dataset | format | generate (2 workers) | generate CPU time | "
        "size on disk | load + all records to PyG | fetch one record by id |",
        "|---|---|---|---|---|---|---|",
    ]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for recipe in ("vits-1k", "gpts-1k"):
            ours = graphkit_figures(recipe, root)
            rows.append(
                f"| {recipe} ({ours['architectures']} architectures) | "
                f"graphkit Parquet | **{ours['generate_s']:.1f} s** | "
                f"{ours['generate_cpu_s']:.1f} s | **{ours['size_mb']:.1f} MB** | "
                f"**{ours['load_pyg_s']:.2f} s** ({ours['records']:,} records) | **{ours['fetch_ms']:.1f} ms** |"
            )
            print(rows[-1], flush=True)
            ref = pickle_figures(recipe, root, pickles)
            rows.append(
                f"| {recipe} | pickled models (original release), {pickles} measured, scaled to 1,000 | - | - | "
                f"{ref['size_mb_per_1k']:,.0f} MB | {ref['load_all_s']:.0f} "
                f"s (unpickling alone) | {ref['fetch_ms']:.0f} ms |"
            )
            print(rows[-1], flush=True)
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} cores (1-minute load average {load:.1f} when it "
        f"started), torch {torch.__version__}. Command: "
        "`.venv/bin/python benchmarks/dataset_speed.py --write`. Generation is the CLI's wall time, imports "
        "included, and its CPU time, workers included; loading and fetching run in a fresh process, imports excluded."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:
    common.main(
        __doc__,
        "dataset_speed",
        lambda args: table(args.pickles),
        lambda parser: parser.add_argument(
            "--pickles", type=int, default=10, help="records measured in the pickle format"
        ),
    )


if __name__ == "__main__":
    main()

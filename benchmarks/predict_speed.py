"""Parameter prediction with LoGAH-tiny: time and peak memory for ViT-B/16 and GPT-2-Large,
with the model built on the meta device and built with weights.

    .venv/bin/python benchmarks/predict_speed.py            # print the table
    .venv/bin/python benchmarks/predict_speed.py --write    # also update BENCHMARKS.md
    python benchmarks/predict_speed.py --device cuda --write  # on a GPU machine: its own section

Each row is one fresh process, run one after another so that peaks and timings do not mix: the
model is built (on meta, or on the CPU with the library's initialisation), then
``predict(model, ghn)`` is timed: trace, predict with an (untrained) LoGAH-tiny, check, write
into the model (new tensors for a meta model, its own tensors otherwise). Imports and the build
are not timed; peak RSS covers the whole process and is compared with the model's fp32 size.
The reference in the same run is GHN-3's tiling decoder with the same encoder; the original
LoGAH code, which the issue reports at about 14 s for GPT-2-Large on a 2-core machine, is not
run here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODELS = {
    "vit-b16": (
        "ViT-B/16",
        {
            "family": "vit",
            "num_layers": 12,
            "hidden": 768,
            "heads": 12,
            "image_size": 224,
            "patch_size": 16,
            "num_classes": 1000,
        },
    ),
    "gpt2-large": ("GPT-2-Large", {"family": "gpt2", "num_layers": 36, "hidden": 1280, "heads": 20, "tied": True}),
}


BUILDS = {"meta": "on meta", "cpu": "with weights"}


def predict_row(key: str, decoder: str = "low_rank", build: str = "meta", device: str = "cpu") -> dict:
    import resource
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    from graphkit.families import build_model
    from graphkit.ghn import LoGAH, predict

    torch.manual_seed(0)
    ghn = LoGAH.from_variant("tiny", decoder=decoder).eval().to(device)
    model = build_model(MODELS[key][1], device=build if build == "meta" else device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    predict(model, ghn)
    sync()
    seconds = time.perf_counter() - start
    size = sum(p.numel() for p in model.parameters()) * 4
    return {
        "seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_mb": size / 1e6,
        "params": sum(p.numel() for p in model.parameters()),
    }


def table(args) -> str:
    load = os.getloadavg()[0]
    rows = [
        "| model | parameters | built | hypernetwork | predict | peak RSS | model fp32 size | peak / size |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, (label, _) in MODELS.items():
        for build, built in BUILDS.items():
            for decoder, name in (("low_rank", "LoGAH-tiny"), ("ghn3", "GHN-3 decoder, tiny (reference)")):
                r = common.run_fresh(__file__, key, decoder, build, args.device)
                rows.append(
                    f"| {label} | {r['params'] / 1e6:.0f}M | {built} | {name} | {r['seconds']:.1f} s | "
                    f"{r['peak_rss_mb']:,.0f} MB | {r['model_mb']:,.0f} MB | {r['peak_rss_mb'] / r['model_mb']:.2f} |"
                )
                print(rows[-1], flush=True)
    where = (
        f"{common.cores()} cores"
        if args.device == "cpu"
        else f"{args.device} ({gpu_name()}), the model with weights built there"
    )
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} on {where}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load:.1f} at the start (other work shares the "
        "machine: timings are noisy); each row a fresh process, one "
        "at a time. Timed: `predict(model)`, i.e. trace, predict, "
        "check and write into the model; not the imports or the build (peak RSS includes both). The GHN-3 "
        "decoder tiles one d x d block over each parameter, the approach LoGAH replaces. Command: "
        "`.venv/bin/python benchmarks/predict_speed.py --write`."
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def main() -> None:
    if "--one" in sys.argv:
        print(json.dumps(predict_row(*sys.argv[sys.argv.index("--one") + 1 :])))
        return
    key = (
        "predict_speed_gpu" if any("cuda" in a for a in sys.argv) else "predict_speed"
    )  # a GPU's rows get their own section
    common.main(__doc__, key, table, lambda p: p.add_argument("--device", default="cpu", help="cpu or cuda"))


if __name__ == "__main__":
    main()

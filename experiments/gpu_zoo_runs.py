"""Issue #45 item 7: the zoo runs one lent GPU call affords, side by side, each sized to the time.

A lent GPU gives a session about 15 minutes, one command at most 10. ``train-ghn`` there is
launch-bound (the GPU about 5% busy, ``../shared/gpu/``), so several runs in parallel processes
gain that many times over one (on an H200, 2026-11-29: the zoo-decoders recipe 12 steps a second
with three side by side, 7.3 with five; zoo-vision 2.3 with five, against about 1 and 0.83 on 2
CPU cores; docs/experiments.md, "On a lent H200"). This script starts every run of
``RUNS`` at once for ``--probe-steps`` steps, reads each one's speed from its log, sizes each run
to end before ``--budget`` seconds (less the probe's reserve), trains them all again at those
steps, probes each finished run's predictions at step 0 as ``zoo_pools.py`` does (one
architecture of each of the first 16 train families and of each held-out family), and packs the
logs, probes and the chosen checkpoints into ``--out`` (pieces of at most 15 MiB: what the
device tool brings back).

    python3 experiments/gpu_zoo_runs.py --budget 560 --out $OUT          # on the lent GPU
    .venv/bin/python experiments/gpu_zoo_runs.py --budget 240 --device cpu --runs vision-leaf --out /tmp/g
    cat /tmp/g/results.tar.gz.* | tar -xz -C runs/gpu                      # here, afterwards

Runs (the zoo recipes of ``zoo_pools.KINDS``, float32 as on the CPU):

- ``vision-leaf``: the whole zoo-vits-mini train split, the shipped zoo-vision recipe (longer);
- ``vision-layer``: the same with roles keyed by layer (the decoder zoo's key);
- ``vision-mb16``: the same with 16 architectures a step instead of 4;
- ``decoders-g8-curriculum``: the zoo-decoders recipe's second stage at table gain 8, from
  ``runs/zoo-decoders-table8-4`` (its first stage), longer;
- ``decoders-g8-whole``: its control, the same from a fresh LoGAH;
- ``decoders-g8-pool1``: one family (``mistral``), the single-family control at the same horizon;
- ``vision-poolK`` (K = 1, 2, 4, 8, 16): the zoo-vision recipe on the train split's K largest
  families (``zoo_pools.families``), the pool-size curve beside ``vision-leaf`` (all 36);
- ``vision-factors``, ``vision-factors-poolK`` (K = 1, 4, 16): the same with ``--role-factors``
  (a pair of factors per role map beside the decoder's MLP);
- ``vision-lr``, ``vision-factors-lr``: the whole split at lr 1e-3 (the recipe's 3e-4 is too low
  for the fit inside one family), without and with role factors;
- ``vision-correctionW`` (W = 0.3, 1, 3): role factors at lr 1e-3 with ``--correction W`` (the
  MLP's share of the factors penalised, so that the role factors carry what the roles share);
- ``vision-correction1-start``: ``vision-correction1`` from ``factor_start.py``'s start for the
  whole split (``runs/factor-start-vision``: each role's factors at its mean MLP output, the MLP's
  last layer zeroed), which on 32 architectures of one family took the fit from 1.74 to 0.98.

``--steps N`` skips the speed probe and trains every run for N steps. A run still going at the
deadline is stopped; its curve is in its log, and its last checkpoint (every 100 steps) is probed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from zoo_pools import KINDS, families, probe, probe_records  # noqa: E402

from graphkit.ghn import training  # noqa: E402
from graphkit.training.data import load_source  # noqa: E402
from graphkit.training.state import read_trainer_state  # noqa: E402

#: name: (zoo kind, options over the kind's recipe); the order is the order checkpoints are packed in
RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "decoders-g8-curriculum": (
        "decoders",
        dict(table_gain=8.0, spread=1.0, initial_checkpoint=str(ROOT / "runs" / "zoo-decoders-table8-4")),
    ),
    "vision-leaf": ("vision", {}),
    "vision-layer": ("vision", dict(role_key="layer")),
    "vision-mb16": ("vision", dict(meta_batch=16)),
    "decoders-g8-whole": ("decoders", dict(table_gain=8.0, spread=1.0)),
    "decoders-g8-pool1": ("decoders", dict(table_gain=8.0, zoo_families=["mistral"])),
    **{f"vision-pool{k}": ("vision", dict(pool=k)) for k in (1, 2, 4, 8, 16)},
    "vision-factors": ("vision", dict(role_factors=True)),
    **{f"vision-factors-pool{k}": ("vision", dict(pool=k, role_factors=True)) for k in (1, 4, 16)},
    "vision-lr": ("vision", dict(lr=1e-3)),
    "vision-factors-lr": ("vision", dict(role_factors=True, lr=1e-3)),
    **{f"vision-correction{w:g}": ("vision", dict(role_factors=True, lr=1e-3, correction=w)) for w in (0.3, 1.0, 3.0)},
    "vision-correction1-start": (
        "vision",
        dict(role_factors=True, lr=1e-3, correction=1.0, initial_checkpoint=str(ROOT / "runs" / "factor-start-vision")),
    ),
}
PIECE = 15 * 2**20  # bytes a packed piece holds at most
PACKED = 60 * 2**20  # bytes of checkpoints packed at most, logs aside


def train_one(name: str, out: Path, steps: int, device: str, cudnn: bool = True) -> None:
    """Train run ``name`` for ``steps`` steps into ``out`` (without cuDNN's convolutions unless ``cudnn``)."""
    torch.backends.cudnn.enabled = cudnn
    kind, options = RUNS[name]
    zoo, recipe = KINDS[kind]
    if "pool" in options:
        options = {k: v for k, v in options.items() if k != "pool"} | {"zoo_families": families(zoo)[: options["pool"]]}
    config = training.TrainConfig(
        **{**recipe, **options}, dataset=str(zoo), out=str(out), steps=steps, device=device, amp=False
    )
    training.train(config, progress=False)


def last_weights(run: Path) -> Path | None:
    """The run's final hypernetwork, else its last checkpoint (a run stopped at the deadline), else None."""
    return next((d for d in (run, run / "checkpoint") if (d / "model.safetensors").exists()), None)


def probe_one(name: str, run: Path, out: Path) -> None:
    """Write the step-0 probe of ``run``'s last weights (zoo_pools.probe) as ``out``."""
    zoo, recipe = KINDS[RUNS[name][0]]
    source = load_source(recipe["data"], seq_len=recipe.get("seq_len", 64))
    batch_size = 8 if source.task == "text" else 32
    weights = last_weights(run)
    assert weights is not None, f"{run} has no weights"
    figures = probe(weights, probe_records(zoo, ()), source, batch_size)
    if weights != run:
        figures["run"] = run.name
        figures["stopped; probed the checkpoint of step"] = read_trainer_state(weights)["step"]
    out.write_text(json.dumps(figures, indent=1))


def launch(args: list[str], log: Path, threads: int) -> subprocess.Popen[bytes]:
    """This script again, with ``args``, in its own process, its output in ``log``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as stream:
        return subprocess.Popen(
            [sys.executable, __file__, *args], stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )


def wait_all(processes: dict[str, subprocess.Popen[bytes]], deadline: float) -> dict[str, int | None]:
    """Each process's exit status, those still running at ``deadline`` killed (None)."""
    codes: dict[str, int | None] = {}
    for name, process in processes.items():
        try:
            codes[name] = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes[name] = None
    return codes


def steps_per_second(run: Path, meta_batch: int) -> float | None:
    """The run's speed over its last logged window, or None without a log. An underestimate: a
    run's first steps meet most architectures for the first time (on an H200 the zoo-decoders
    recipe logged 2.8 steps/s at step 30 and 12 at step 900)."""
    log = run / "metrics.jsonl"
    if not log.exists():
        return None
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return lines[-1]["archs_per_s"] / meta_batch if lines else None


def pack(results: Path, runs: dict[str, Path], out: Path) -> list[Path]:
    """Logs, probes and (in the runs' order, up to PACKED bytes) each run's last weights (a
    stopped run's last checkpoint, its config.json with them), as one .tar.gz split into pieces
    of at most PIECE bytes in ``out``."""
    buffer = io.BytesIO()
    packed = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(results.iterdir()):
            tar.add(path, arcname=path.name)
        for name, run in runs.items():
            for file in ("metrics.jsonl", "metrics.png"):
                if (run / file).exists():
                    tar.add(run / file, arcname=f"{name}/{file}")
            last = last_weights(run)
            if last is None:
                continue
            tar.add(last / "config.json", arcname=f"{name}/config.json")
            if packed + (last / "model.safetensors").stat().st_size <= PACKED:
                packed += (last / "model.safetensors").stat().st_size
                tar.add(last / "model.safetensors", arcname=f"{name}/model.safetensors")
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    pieces = []
    for index, start in enumerate(range(0, len(data), PIECE)):
        pieces.append(out / f"results.tar.gz.{index}")
        pieces[-1].write_bytes(data[start : start + PIECE])
    return pieces


def sized_steps(
    args: argparse.Namespace, deadline: float, results: Path, device: list[str], threads: int
) -> tuple[dict[str, float | None], dict[str, int]]:
    """Each run's speed over ``--probe-steps`` steps, all at once, and the steps that end it
    before ``deadline`` at that speed (times ``--rate-factor``); a run that logged none is left out."""
    probing = {
        name: launch(["--one", name, str(args.probe_steps), str(args.work / f"speed-{name}"), *device],
                     results / f"speed-{name}.log", threads)
        for name in args.runs
    }  # fmt: skip
    wait_all(probing, deadline)
    speed = {}
    for name in args.runs:
        meta_batch = RUNS[name][1].get("meta_batch", KINDS[RUNS[name][0]][1]["meta_batch"])
        speed[name] = steps_per_second(args.work / f"speed-{name}", meta_batch)
    ready = time.monotonic() + 30  # each run's start (imports, the zoo, the first step)
    steps = {
        name: max(100, int(rate * args.rate_factor * (deadline - ready) * 0.9) // 100 * 100)
        for name, rate in speed.items()
        if rate is not None
    }
    return speed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=560, help="seconds, from start to packed results")
    parser.add_argument("--probe-steps", type=int, default=30, help="steps of the speed probe")
    parser.add_argument("--steps", type=int, default=None, help="train every run this long (no speed probe)")
    parser.add_argument("--reserve", type=float, default=100, help="seconds kept for probing and packing")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rate-factor", type=float, default=1.0, help="times the probe's speed (it underestimates)")
    parser.add_argument(
        "--no-cudnn",
        action="store_true",
        help="native convolutions (cuDNN 9 on an H200 found no engine for a zoo ViT's)",
    )
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_zoo_runs"), help="where runs are trained")
    parser.add_argument("--out", type=Path, help="where the packed pieces go (required)")
    parser.add_argument("--one", nargs=3, metavar=("NAME", "STEPS", "RUN"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-run", nargs=3, metavar=("NAME", "RUN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        train_one(args.one[0], Path(args.one[2]), int(args.one[1]), args.device, not args.no_cudnn)
        return
    if args.probe_run:
        probe_one(args.probe_run[0], Path(args.probe_run[1]), Path(args.probe_run[2]))
        return
    if args.out is None:
        parser.error("--out is required")
    start = time.monotonic()
    deadline = start + args.budget - args.reserve
    threads = max(1, (os.cpu_count() or 2) // len(args.runs))
    shutil.rmtree(args.work, ignore_errors=True)
    results = args.work / "results"
    results.mkdir(parents=True)
    device = ["--device", args.device, *(["--no-cudnn"] if args.no_cudnn else [])]
    if args.steps is None:
        speed, steps = sized_steps(args, deadline, results, device, threads)
    else:
        speed, steps = {}, dict.fromkeys(args.runs, args.steps)
    print(json.dumps({"steps per second": speed, "steps": steps}), flush=True)
    runs = {name: args.work / name for name in steps}
    training_runs = {
        name: launch(["--one", name, str(steps[name]), str(runs[name]), *device],
                     results / f"train-{name}.log", threads)
        for name in steps
    }  # fmt: skip
    codes = wait_all(training_runs, deadline)
    probes = {
        name: launch(["--probe-run", name, str(runs[name]), str(results / f"probe-{name}.json")],
                     results / f"probe-{name}.log", threads)
        for name in codes
        if last_weights(runs[name]) is not None
    }  # fmt: skip
    wait_all(probes, start + args.budget - 15)
    summary = {"steps per second": speed, "steps": steps, "exit": codes, "seconds": time.monotonic() - start}
    (results / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    for name in runs:
        report = results / f"probe-{name}.json"
        if report.exists():
            figures = json.loads(report.read_text())
            print(name, {k: v for k, v in figures.items() if k != "predicted @0"}, flush=True)
    print([str(p) for p in pack(results, runs, args.out)], flush=True)


if __name__ == "__main__":
    main()

"""What the benchmark scripts share: machine facts, the BENCHMARKS.md sections, the command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from graphkit.training.data import data_config

ROOT = Path(__file__).resolve().parent.parent


def cores() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0))


def fresh_folder(benchmark: str, name: str) -> Path:
    """``out/<benchmark>/<name>``, emptied, for what ``benchmark`` generates afresh: a folder of its
    own, so that a benchmark never empties a finished ``out/<name>`` (a zoo ``graphkit generate``
    wrote, which later commands read)."""
    folder = ROOT / "out" / benchmark / name
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def run_fresh(script: str, *args: str) -> dict:
    """Run ``script --one ARGS`` in a fresh Python process; its last stdout line is a JSON result."""
    out = subprocess.run([sys.executable, script, "--one", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_jobs(run: Callable, jobs: list[tuple]) -> tuple[dict, str]:
    """``run(*job)`` for every job, one process a core: the results by job, and how the table's
    first line begins, "Measured DATE on N CPU cores (M min)"."""
    start = time.perf_counter()
    with ProcessPoolExecutor(cores()) as pool:
        results = dict(zip(jobs, pool.map(run, *zip(*jobs))))
    minutes = (time.perf_counter() - start) / 60
    return results, f"Measured {time.strftime('%Y-%m-%d')} on {cores()} CPU cores ({minutes:.1f} min)"


def fixed_batches(
    source, model, batch_size: int, held_out: int, steps: int, example_inputs=None, seed: int = 0
) -> tuple[list, list]:
    """``held_out`` evaluation batches and ``steps`` training batches of ``source`` shaped for
    ``model`` (read off ``example_inputs`` where given: a hand-written model's), drawn from
    ``seed``: every initialisation a script compares sees the same ones."""
    evaluation, batch_at = batches_in_order(source, model, batch_size, held_out, example_inputs, seed)
    return evaluation, [batch_at(step) for step in range(steps)]


def batches_in_order(
    source, model, batch_size: int, held_out: int, example_inputs=None, seed: int = 0
) -> tuple[list, Callable[[int], object]]:
    """:func:`fixed_batches`' held-out batches and its training batches drawn one at a time, step
    0, 1, 2, ... (the same batches, without holding them all: 400 batches of 32 images at 224 px
    are 7.7 GB). The function gives batch ``step`` only when called in order."""
    shape, generator = data_config(model, example_inputs), torch.Generator().manual_seed(seed)
    evaluation = [source.batch(shape, batch_size, generator, "eval") for _ in range(held_out)]
    drawn = -1

    def batch_at(step: int):
        nonlocal drawn
        if step != drawn + 1:
            raise ValueError(f"training batch {step} asked for after batch {drawn}: they are drawn in order")
        drawn = step
        return source.batch(shape, batch_size, generator, "train")

    return evaluation, batch_at


def write_section(text: str, key: str, path: Path = ROOT / "BENCHMARKS.md") -> None:
    """Replace the marked section ``key`` of BENCHMARKS.md (or append it)."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    body = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{text}{end}"
    if start in body:
        body = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    path.write_text(body)


def ghn_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--ghn LABEL=CHECKPOINT`` (a bundled name or a run folder), repeated; ``default`` when none
    is given. :func:`checkpoints` reads it."""
    parser.add_argument(
        "--ghn",
        action="append",
        default=None,
        help=f"LABEL=CHECKPOINT (a bundled name or a run folder), repeated; default: {default}",
    )
    parser.set_defaults(ghn_default=default)


def checkpoints(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(label, checkpoint) for each ``--ghn`` of :func:`ghn_option`, its default filled into ``args.ghn``."""
    args.ghn = args.ghn or [args.ghn_default]
    return [(label, path) for label, _, path in (spec.rpartition("=") for spec in args.ghn)]


def main(
    doc: str,
    key: str | Callable[[argparse.Namespace], str],
    table: Callable[[argparse.Namespace], str],
    options: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
) -> None:
    """Parse ``--write`` and the script's own ``options``, print the table, update BENCHMARKS.md's
    section ``key`` (a function of the parsed options, where they pick the section)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    options(parser)
    args = parser.parse_args()
    text = table(args)
    print(text)
    if args.write:
        write_section(text, key(args) if callable(key) else key)

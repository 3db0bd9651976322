"""Generate a graph dataset from a recipe: sample, trace, write Parquet parts.

Why it is reproducible and restartable:

- The record list (ids, configs, splits) is drawn in the parent from the recipe and seed alone;
  workers only trace, so any worker count gives the same rows and the same content hash.
- Records are written in parts of ``part_size`` (``data/train-00003-of-00010.parquet`` and the
  matching ``eval-`` file), each written atomically. A part is the unit of work: ``--num-shards K
  --shard-index i`` makes part j only when j % K == i, so shards written on different machines
  fill one folder without overlap, and ``resume=True`` skips parts already on disk.
- Each distinct architecture is traced once; configs that differ only in depth go to one worker
  together and share one export through :func:`graphkit.trace`'s cache.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphkit.datasets.recipes import Recipe, get_recipe
from graphkit.datasets.store import finalize_dataset, graph_to_row, shard_name, write_shard
from graphkit.errors import GraphkitError
from graphkit.graph import ArchGraph

SPLITS = ("train", "eval")


class GenerateError(GraphkitError):
    """Bad generation options or an output folder in the way."""


@dataclass
class GenerateResult:
    """What a generation run did."""

    path: Path
    records: int         # records this run wrote
    architectures: int   # distinct architectures among them
    parts_written: int
    parts_skipped: int   # already on disk (resume)
    seconds: float


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _width_key(key: str) -> str:
    """Configs equal but for their depth share one export (folded blocks)."""
    return _config_key({**json.loads(key), "num_layers": 0})


def _trace_group(keys: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Worker: trace configs that differ only in depth; the first export serves them all."""
    from graphkit.families import build_model
    from graphkit.trace import trace

    cache: dict = {}
    return [(key, trace(build_model(json.loads(key)), cache=cache).to_dict()) for key in keys]


def _warm_up() -> None:
    """One tiny export, so torch.export's one-time set-up happens once, before workers fork."""
    from graphkit.families import build_model
    from graphkit.trace import trace

    trace(build_model({"family": "gpt2", "num_layers": 1, "hidden": 8, "heads": 1, "context": 8}))


def _trace_all(keys: list[str], workers: int, advance: Callable[[int], None]) -> Iterator[tuple[str, ArchGraph]]:
    groups: dict[str, list[str]] = {}
    for key in sorted(keys):
        groups.setdefault(_width_key(key), []).append(key)
    tasks = sorted(groups.values(), key=lambda group: (-len(group), group[0]))  # long tasks first: a short tail
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # meta tensors do no arithmetic; workers share the cores
    pool = None
    try:
        if workers <= 1 or len(tasks) <= 1:
            results: Iterator[list[tuple[str, dict[str, Any]]]] = map(_trace_group, tasks)
        else:
            _warm_up()
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
            results = pool.map(_trace_group, tasks)
        for traced in results:
            advance(len(traced))
            for key, graph in traced:
                yield key, ArchGraph.from_dict(graph)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        torch.set_num_threads(threads)


def generate(
    recipe: str | Path | Recipe,
    out: str | Path | None = None,
    *,
    num: int | None = None,
    seed: int = 0,
    workers: int = 1,
    num_shards: int = 1,
    shard_index: int = 0,
    resume: bool = False,
    part_size: int = 100,
    attention: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GenerateResult:
    """Generate ``num`` records of ``recipe`` (a built-in name or a .json / .yaml file) into the
    dataset folder ``out`` (default: the recipe's name). ``attention`` (mha, gqa, kdgqa, dgqa,
    pgqa) converts every model to that variant with K/V heads drawn from the divisors of its head
    count (:meth:`Recipe.with_attention`). ``progress(done, total)`` is called after each traced
    architecture. Returns what was written."""
    start = time.perf_counter()
    recipe = get_recipe(recipe)
    if attention is not None:
        from graphkit.attention import VARIANTS

        if attention not in ("mha", *VARIANTS):
            raise GenerateError(f"unknown attention {attention!r}; accepted: mha, {', '.join(VARIANTS)}")
        recipe = recipe.with_attention(attention)
    out = Path(out if out is not None else recipe.name)
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise GenerateError(f"--shard-index must be in 0..{num_shards - 1} for --num-shards {num_shards}, got {shard_index}")
    if workers < 1 or part_size < 1:
        raise GenerateError(f"workers and part_size must be at least 1, got {workers} and {part_size}")
    existing = sorted((out / "data").glob("*.parquet")) if (out / "data").is_dir() else []
    if existing and not resume and num_shards == 1:
        raise GenerateError(f"{out} already holds a dataset ({len(existing)} files); pass --resume to finish it or choose another --out")
    if out.exists() and not out.is_dir():
        raise GenerateError(f"{out} exists and is not a folder")

    for stale in (out / "data").glob(".*.tmp") if (out / "data").is_dir() else []:
        stale.unlink()  # left by a run killed while writing a part
    records = recipe.sample(num, seed)
    n_parts = math.ceil(len(records) / part_size)
    mine = [j for j in range(n_parts) if j % num_shards == shard_index]
    done = {j for j in mine if all((out / "data" / shard_name(s, j, n_parts)).exists() for s in SPLITS)}
    todo = [j for j in mine if j not in done]
    todo_records = [r for j in todo for r in records[j * part_size:(j + 1) * part_size]]
    keys = sorted({_config_key(config) for _, config, _ in todo_records})

    graphs: dict[str, ArchGraph] = {}
    traced = 0

    def advance(count: int) -> None:
        nonlocal traced
        traced += count
        if progress is not None:
            progress(traced, len(keys))

    for key, graph in _trace_all(keys, workers, advance):
        graphs[key] = graph
    for j in todo:
        rows = [graph_to_row(graphs[_config_key(config)], config, id=rid, split=split)
                for rid, config, split in records[j * part_size:(j + 1) * part_size]]
        for split in SPLITS:  # both files, even an empty one: together they mark the part done
            write_shard([r for r in rows if r["split"] == split], out / "data" / shard_name(split, j, n_parts))
    finalize_dataset(out, name=recipe.name, info={
        "recipe": recipe.to_dict(), "seed": seed, "num": len(records), "parts": n_parts, "part_size": part_size,
    })
    return GenerateResult(path=out, records=len(todo_records), architectures=len(keys), parts_written=len(todo),
                          parts_skipped=len(done), seconds=time.perf_counter() - start)


__all__ = ["generate", "GenerateResult", "GenerateError"]

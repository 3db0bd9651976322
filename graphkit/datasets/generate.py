"""Generate a graph dataset from a recipe: sample, trace, write Parquet parts.

Why it is reproducible and restartable:

- The record list (ids, configs, splits) is drawn in the parent from the recipe and seed alone;
  workers only trace and convert each distinct architecture to its row, so any worker count
  gives the same rows and the same content hash.
- Records are written in parts of ``part_size`` (``data/train-00003-of-00010.parquet`` and the
  matching ``eval-`` file), each written atomically. A part is the unit of work: ``--num-shards K
  --shard-index i`` makes part j only when j % K == i, so shards written on different machines
  fill one folder without overlap, and ``resume=True`` skips parts already on disk whose files
  open and hold the expected rows (a truncated or corrupted part is redone).
- What a run makes (recipe, seed, num, part_size, attention) is written to ``.graphkit-run.json``
  when it starts, so a resume or another shard with other options is refused, naming the
  option, instead of mixing datasets; a folder holding anything else is never written into.
- Runs lock the folder with ``flock`` on ``.graphkit*.lock`` files there (the kernel releases
  them when the process ends, however it ends): a plain run holds the folder alone; shards share
  it but each shard index runs once at a time; the manifest and run file are written by one
  process at a time. A run that cannot have its lock is refused at once, nothing touched. The
  folder lock (:mod:`graphkit.datasets.runs`) is the zoos' too, and the handling of SIGTERM and
  Ctrl-C every command's (:mod:`graphkit.workers`): an interrupted run stops its workers and can
  be resumed.
- Each distinct architecture is traced once; configs that differ only in depth go to one worker
  together and share one export through :func:`graphkit.trace`'s cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from graphkit.attention import ATTENTION_VARIANTS
from graphkit.datasets.recipes import MAX_RECORDS, RECIPES, Recipe, RecipeError, get_recipe
from graphkit.datasets.runs import flock, folder_lock
from graphkit.datasets.store import (
    RUN_FILE,
    StoreError,
    check_dataset_folder,
    finalize_dataset,
    graph_to_row,
    read_manifest,
    read_table,
    shard_name,
    write_shard,
)
from graphkit.errors import GenerateError
from graphkit.families import build_model, get_family
from graphkit.fileio import write_text_atomic
from graphkit.graph import ArchGraph
from graphkit.tracing import trace
from graphkit.validation import is_count
from graphkit.workers import ended_by_sigterm, worker_pool

SPLITS = ("train", "eval")
#: held (flock, exclusively) while the run file, manifest and card are checked or written
MANIFEST_LOCK = ".graphkit-manifest.lock"
DEFAULT_PART_SIZE = 100
#: the run's identity: a resume or shard must match it; each key with the option that sets it
IDENTITY = {"recipe": "recipe", "seed": "--seed", "num": "--num", "part_size": "part_size", "attention": "--attention"}


@dataclass
class GenerateResult:
    """What a generation run did."""

    path: Path
    records: int  # records this run wrote
    architectures: int  # distinct architectures among them
    parts_written: int
    parts_skipped: int  # already on disk (resume)
    seconds: float
    repaired: list[str] = field(default_factory=list)  # damaged parts found and redone, one line each


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _heads_only_label(config: Mapping[str, Any]) -> bool:
    """True for an MHA config of a family whose attention is its own projections (not grouped,
    not converted): there the head count changes no parameter shape, only the attention nodes'
    ``heads``, ``kv_heads`` and ``head_dim`` (tests compare against direct traces over gpts-1k
    and vits-1k), so one export serves every head count of a width."""

    return config.get("attention") is None and not get_family(config["family"]).grouped


def _width_key(key: str) -> str:
    """Configs equal but for their depth (and, where it is only a label, their head count) share
    one export."""
    config = {**json.loads(key), "num_layers": 0}
    if _heads_only_label(config):
        config["heads"] = 0
    return _config_key(config)


def _with_heads(graph: ArchGraph, heads: int) -> ArchGraph:
    """``graph`` with its attention nodes relabelled to ``heads`` MHA heads of the same width."""
    nodes = [
        replace(
            n,
            attrs={
                **n.attrs,
                "heads": heads,
                "kv_heads": heads,
                "head_dim": n.attrs["heads"] * n.attrs["head_dim"] // heads,
            },
        )
        if n.op == "attention"
        else n
        for n in graph.nodes
    ]
    return ArchGraph(nodes=nodes, edges=list(graph.edges), meta=dict(graph.meta))


def _trace_group(keys: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Worker: trace configs that differ only in depth and head count (the first export serves
    them all; other head counts are relabelled) and turn each graph into its dataset row, id and
    split left for the parent to fill in per record, so the conversion runs in parallel and the
    graph crosses processes once, as a row."""

    cache: dict = {}
    rows = []
    traced_heads = None
    for key in keys:
        config = json.loads(key)
        if _heads_only_label(config):
            traced_heads = traced_heads or config["heads"]
            graph = trace(build_model({**config, "heads": traced_heads}), cache=cache)
            if config["heads"] != traced_heads:
                graph = _with_heads(graph, config["heads"])
        else:
            graph = trace(build_model(config), cache=cache)
        rows.append((key, graph_to_row(graph, config, id="", split="")))
    return rows


def _warm_up() -> None:
    """One tiny export, so torch.export's one-time set-up happens once, before workers fork."""

    trace(build_model({"family": "gpt2", "num_layers": 1, "hidden": 8, "heads": 1, "context": 8}))


def _trace_all(keys: list[str], workers: int, advance: Callable[[int], None]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(config key, row without id and split) for every key, traced by ``workers`` processes."""
    groups: dict[str, list[str]] = {}
    for key in sorted(keys):
        groups.setdefault(_width_key(key), []).append(key)
    tasks = sorted(groups.values(), key=lambda group: (-len(group), group[0]))  # long tasks first: a short tail
    workers = min(workers, len(tasks))  # more processes than tasks would only fork idle ones

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # meta tensors do no arithmetic; workers share the cores
    try:
        with contextlib.ExitStack() as pool:
            if workers <= 1 or len(tasks) <= 1:
                results: Iterator[list[tuple[str, dict[str, Any]]]] = map(_trace_group, tasks)
            else:
                _warm_up()  # forked workers inherit it
                results = pool.enter_context(worker_pool(workers, fork=True)).map(_trace_group, tasks)
            for traced in results:
                advance(len(traced))
                yield from traced
    finally:
        torch.set_num_threads(threads)


def _check_options(num: int | None, workers: int, num_shards: int, shard_index: int, part_size: int) -> None:
    """Refuse nonsense counts in one line naming the option, before anything is read or written."""
    counts = {
        "--num": (num, MAX_RECORDS),
        "--workers": (workers, None),
        "--num-shards": (num_shards, None),
        "part_size": (part_size, None),
    }
    for option, (value, high) in counts.items():
        if value is None and option == "--num":
            continue
        if not is_count(value, 1, high):
            bound = f" and at most {high:,}" if high is not None else ""
            raise GenerateError(f"{option} must be an integer of at least 1{bound}, got {value!r}")
    if not isinstance(shard_index, int) or not 0 <= shard_index < num_shards:
        raise GenerateError(
            f"--shard-index must be in 0..{num_shards - 1} for --num-shards {num_shards}, got {shard_index}"
        )


def recorded_run(out: str | Path) -> dict[str, Any] | None:
    """The identity of the run that made the dataset folder ``out``: from the run file its
    ``generate`` wrote when it started, else (datasets made before there was one) from its
    manifest; None when the folder holds neither, i.e. it is not a graphkit dataset."""
    out = Path(out)
    try:
        run = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        run = None
    if isinstance(run, dict):
        return run
    manifest = read_manifest(out)
    return None if manifest is None else {key: manifest[key] for key in IDENTITY if key in manifest}


def _check_folder(out: Path) -> None:
    """Refuse an ``--out`` that is a file, lies under one, or is a non-empty folder that is not a
    graphkit dataset (a project's README.md must never be overwritten by a dataset card)."""
    if out.exists() and not out.is_dir():
        raise GenerateError(f"{out} exists and is not a folder")
    check_dataset_folder(out)


def _check_identity(out: Path, recorded: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Refuse a run whose identity differs from the one that made the folder, naming the first
    differing option and both values."""
    for key, option in IDENTITY.items():
        if key not in recorded or recorded[key] == identity[key]:
            continue
        old, new = recorded[key], identity[key]
        if key == "recipe" and isinstance(old, dict) and old.get("name") == new["name"]:
            field_name = next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            option, old, new = (
                f"recipe {new['name']!r} with {field_name}",
                json.dumps(old.get(field_name)),
                json.dumps(new.get(field_name)),
            )
        elif key == "recipe":
            old, new = old.get("name") if isinstance(old, dict) else old, new["name"]
        raise GenerateError(
            f"{out} holds a dataset made with {option} {old}; this run asks for {option} {new}. "
            "Rerun with the same options to finish it, or choose another --out"
        )


def _start_run(out: Path, identity: Mapping[str, Any], *, resume: bool) -> None:
    """Under the manifest lock: refuse to overwrite a dataset unless resuming (shards always add
    to one), refuse a run whose identity differs from the folder's, then record this run's
    identity before any part is written, so even an interrupted first run can be checked."""
    with flock(out / MANIFEST_LOCK, fcntl.LOCK_EX):
        existing = sorted((out / "data").glob("*.parquet")) if (out / "data").is_dir() else []
        if existing and not resume:
            raise GenerateError(
                f"{out} already holds a dataset ({len(existing)} files); "
                "pass --resume to finish it or choose another --out"
            )
        recorded = recorded_run(out)
        if recorded is not None:
            _check_identity(out, recorded, identity)
        elif existing:
            raise GenerateError(
                f"{out} holds shards but no record of the run that made them ({RUN_FILE}); "
                "they cannot be resumed safely: choose another --out"
            )
        _sweep_temporaries(out, ["manifest.json", "README.md", RUN_FILE])
        if recorded != identity:  # a new run, or a dataset made before run files: record what this run makes
            write_text_atomic(out / RUN_FILE, json.dumps(identity, indent=1) + "\n")


def _sweep_temporaries(folder: Path, names: list[str]) -> None:
    """Remove the staging folders (:func:`graphkit.fileio.atomic_path`) a run killed outright left
    beside ``names`` in ``folder``, and the temporary files of older graphkits (only what the
    locks say no running process is writing)."""
    for name in names:
        for stale in folder.glob(f".{name}.*.tmp"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            else:
                stale.unlink()


def _damage(out: Path, j: int, n_parts: int, rows: list[tuple[str, dict[str, Any], str]]) -> str | None:
    """Why part ``j`` must be (re)made: None when both its files open and hold exactly its
    expected rows; "missing" when a file is absent; otherwise what is wrong with which file."""
    for split in SPLITS:
        path = out / "data" / shard_name(split, j, n_parts)
        if not path.exists():
            return "missing"
        try:
            table = read_table(path)  # decodes every column: a corrupted page is found here
        except StoreError as e:
            return str(e)
        expected = [(rid, config) for rid, config, s in rows if s == split]
        found = list(
            zip(table.column("id").to_pylist(), map(json.loads, table.column("config").to_pylist()), strict=True)
        )
        if found != expected:
            return f"{path}: holds other rows than this part's ({len(found)} found, {len(expected)} expected)"
    return None


def resume_hint(out: str | Path) -> str:
    """The command that finishes the interrupted dataset ``out``, for warnings."""
    run = recorded_run(out) or {}
    recipe = run.get("recipe")
    recipe = recipe if isinstance(recipe, dict) else {}
    attention = run.get("attention") or "mha"
    base = str(recipe.get("name", "RECIPE"))
    if attention != "mha" and base.endswith(f"-{attention}"):
        base = base[: -len(attention) - 1]
    try:
        built_in = base in RECIPES and RECIPES[base].with_attention(attention).to_dict() == recipe
    except RecipeError:  # a run file edited by hand: name no recipe rather than fail a warning
        built_in = False
    options = [
        f"--num {run['num']}" if "num" in run else "",
        f"--seed {run['seed']}" if "seed" in run else "",
        f"--attention {attention}" if attention != "mha" else "",
    ]
    return " ".join(
        [
            "graphkit generate",
            base if built_in else "RECIPE_FILE",
            "--out",
            str(out),
            *filter(None, options),
            "--resume",
        ]
    )


def incomplete(path: str | Path, records: int) -> str | None:
    """Why the dataset folder ``path`` holding ``records`` records is unfinished (no manifest,
    or fewer records than its run draws) and how to finish it; None when it is complete."""
    path = Path(path)
    expected = (recorded_run(path) or {}).get("num")
    problems = [
        f"{records:,} of {expected:,} records" if isinstance(expected, int) and records != expected else "",
        "no manifest.json" if not (path / "manifest.json").is_file() else "",
    ]
    if not any(problems):
        return None
    return (
        f"{path} is incomplete ({', '.join(filter(None, problems))}): its graphkit generate was interrupted; "
        f"finish it with `{resume_hint(path)}`"
    )


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
    part_size: int | None = None,
    attention: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GenerateResult:
    """Generate ``num`` records of ``recipe`` (a built-in name or a .json / .yaml file) into the
    dataset folder ``out`` (default: the recipe's name). ``attention`` (mha, gqa, kdgqa, dgqa,
    pgqa) converts every model to that variant with K/V heads drawn from the divisors of its head
    count (:meth:`Recipe.with_attention`). ``num`` and ``part_size`` (records per part) default
    to those of the run that made ``out``, else the recipe's and 100. ``progress(done, total)`` is
    called after each traced architecture. Every option, the recipe and the folder are checked
    before anything is written; the folder is locked while the run writes it. Returns what was
    written."""
    start = time.perf_counter()
    recipe = get_recipe(recipe)
    if attention is not None:
        if attention not in ("mha", *ATTENTION_VARIANTS):
            raise GenerateError(f"unknown attention {attention!r}; accepted: mha, {', '.join(ATTENTION_VARIANTS)}")
        recipe = recipe.with_attention(attention)
    out = Path(out if out is not None else recipe.name)
    _check_folder(out)
    recorded = (recorded_run(out) if out.is_dir() else None) or {}
    # a resume or shard continues the recorded run; the identity check under the lock confirms it
    num = recorded.get("num") if num is None else num
    part_size = recorded.get("part_size", DEFAULT_PART_SIZE) if part_size is None else part_size
    _check_options(num, workers, num_shards, shard_index, part_size)
    records = recipe.sample(num, seed)  # before the folder is touched: a bad recipe leaves nothing behind
    identity = {
        "recipe": recipe.to_dict(),
        "seed": seed,
        "num": len(records),
        "part_size": part_size,
        "attention": attention or "mha",
    }
    parts = [records[j : j + part_size] for j in range(0, len(records), part_size)]
    n_parts = len(parts)
    mine = [j for j in range(n_parts) if j % num_shards == shard_index]
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as locks:
        locks.enter_context(folder_lock(out, GenerateError, shared=num_shards > 1))
        locks.enter_context(ended_by_sigterm())
        _start_run(out, identity, resume=resume or num_shards > 1)
        if num_shards > 1:
            locks.enter_context(
                flock(
                    out / f".graphkit-shard-{shard_index}-of-{num_shards}.lock",
                    fcntl.LOCK_EX,
                    GenerateError(
                        f"{out}: another graphkit generate is making shard "
                        f"{shard_index} of {num_shards} here; wait for it to finish"
                    ),
                )
            )
        _sweep_temporaries(out / "data", [shard_name(split, j, n_parts) for j in mine for split in SPLITS])
        damage = {j: _damage(out, j, n_parts, parts[j]) for j in mine}
        todo = [j for j in mine if damage[j] is not None]
        repaired = [f"redoing part {j}: {damage[j]}" for j in todo if damage[j] != "missing"]
        todo_records = [r for j in todo for r in parts[j]]
        keys = sorted({_config_key(config) for _, config, _ in todo_records})

        rows_by_key: dict[str, dict[str, Any]] = {}  # records repeat architectures: one row each, copied per record
        traced = 0

        def advance(count: int) -> None:
            nonlocal traced
            traced += count
            if progress is not None:
                progress(traced, len(keys))

        rows_by_key.update(_trace_all(keys, workers, advance))
        for j in todo:
            rows = [{**rows_by_key[_config_key(config)], "id": rid, "split": split} for rid, config, split in parts[j]]
            for split in SPLITS:  # both files, even an empty one: together they mark the part done
                write_shard([r for r in rows if r["split"] == split], out / "data" / shard_name(split, j, n_parts))
        with flock(out / MANIFEST_LOCK, fcntl.LOCK_EX):
            finalize_dataset(out, name=recipe.name, info={**identity, "parts": n_parts})
    return GenerateResult(
        path=out,
        records=len(todo_records),
        architectures=len(keys),
        parts_written=len(todo),
        parts_skipped=len(mine) - len(todo),
        seconds=time.perf_counter() - start,
        repaired=repaired,
    )


__all__ = ["generate", "GenerateResult", "GenerateError", "recorded_run", "resume_hint", "incomplete"]

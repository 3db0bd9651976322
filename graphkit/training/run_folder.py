"""A training run's folder: the checks before a run writes into it (outside the dataset, no
earlier run's files under a fresh run, a checkpoint to resume), the options a resume must
repeat, and its metrics log cut back to the checkpoint it resumes from. Hypernetwork training
(:mod:`graphkit.ghn.training`) and up-training (:mod:`graphkit.finetune`) both keep their runs
this way, each with its own files and options; a fresh run that stops before its first checkpoint
leaves nothing behind (:func:`nothing_left_unless_checkpointed`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from graphkit.errors import TrainError
from graphkit.fileio import check_output_dir, write_text_atomic
from graphkit.training.state import read_trainer_state


def run_folder(
    out: str | Path,
    resume: bool,
    files: tuple[str, ...],
    kind: str,
    dataset: str | Path | None = None,
) -> Path:
    """The absolute run folder for ``--out`` (``.`` included), checked before any work: it must
    be (or become) a folder outside the dataset (when the run reads one), a fresh run must not
    land on an earlier run's ``files`` (or anyone else's files of those names), and a resumed one
    must find a training checkpoint there; a folder holding another ``kind`` of graphkit output
    is refused (:func:`~graphkit.fileio.check_output_dir`)."""
    folder = Path(os.path.abspath(check_output_dir(out)))
    data_folder = Path(os.path.abspath(dataset)) if dataset is not None else None
    if data_folder is not None and (folder == data_folder or data_folder in folder.parents):
        raise TrainError(f"--out {out}: lies in the dataset folder {dataset}; choose another --out")
    check_output_dir(out, kind=kind)
    if resume:
        if not (folder / "checkpoint" / "trainer_state.json").is_file():
            raise TrainError(f"{folder / 'checkpoint'}: nothing to resume (no training checkpoint there)")
        return folder
    clash = next((name for name in files if (folder / name).exists()), None)
    if clash is not None:
        raise TrainError(
            f"--out {out}: already holds {clash}; continue that run with --resume, or choose another --out "
            "(nothing was changed)"
        )
    return folder


def check_resume(
    folder: Path,
    options: Mapping[str, Any],
    default_data: str | None,
    names: tuple[str, ...],
    world: int = 1,
    unrecorded: Mapping[str, Any] | None = None,
) -> None:
    """Refuse a resume whose options ``names`` differ from those the checkpoint in ``folder`` was
    trained with (they would be recorded as if used throughout), with another number of
    processes (each draws its own meta-batch), or whose ``--steps`` is below the steps already
    done. ``options`` are the run's (its config as a dict, ``data`` resolved to its source),
    ``default_data`` the family's data source (what a run recorded without ``--data`` used; None
    for a family with none, whose runs all name their data), ``unrecorded`` the values of options
    that runs recorded before the option existed used."""
    state = read_trainer_state(folder)
    if state.get("world_size", world) != world:
        raise TrainError(
            f"--resume: {folder.parent} was trained by {state['world_size']} processes, not {world}; "
            f"resume it with {state['world_size']} processes"
        )
    recorded = {
        **(unrecorded or {}),
        **state["config"],
        "data": state["config"].get("data") or default_data,
    }
    given = options
    for name in names:
        if name not in recorded:  # an option added after the run was recorded: it cannot be checked
            continue
        before, now = recorded[name], given[name]
        same = before == now or (name == "dataset" and Path(str(before)).resolve() == Path(now).resolve())
        if not same:
            raise TrainError(
                f"--resume: {folder.parent} was trained with --{name.replace('_', '-')} {before}, "
                f"not {now}; resume with the run's options, or train into another --out"
            )
    if options["steps"] < state["step"]:
        raise TrainError(
            f"--steps {options['steps']}: {folder.parent} has already trained {state['step']} steps; "
            f"resume with --steps {state['step']} or more"
        )


def logged_step(line: str) -> float:
    """The step of a metrics.jsonl line; a line cut short by an interruption counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def trim_metrics(metrics_file: Path, step: int) -> None:
    """Drop the lines a run logged after the checkpoint it resumes from at ``step``: it logs them
    again as it redoes those steps."""
    if metrics_file.exists():
        lines = metrics_file.read_text().splitlines(keepends=True)
        write_text_atomic(metrics_file, "".join(line for line in lines if logged_step(line) <= step))


@contextlib.contextmanager
def nothing_left_unless_checkpointed(folder: Path, files: tuple[str, ...], resuming: bool) -> Iterator[None]:
    """Make ``folder`` and run the block as a run into it; if it is a fresh run (not ``resuming``) and stops
    for any reason (an error, Ctrl-C, SIGTERM) before its first checkpoint (``folder/checkpoint``)
    is written, remove the run's ``files`` it wrote (its metrics log) and the folder itself when
    the run made it and left it empty.

    Why: a fresh run is refused where any of ``files`` lies (:func:`run_folder`), and a resume
    needs a checkpoint, so a metrics log without one would block both: the same command rerun
    with a lower ``--lr``, as the error says, would be refused. :func:`run_folder` checked that
    none of ``files`` was there before the run, so each one removed is the run's own."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if not resuming and not (folder / "checkpoint").exists():
            for name in files:
                path = folder / name
                if path.is_file() and not path.is_symlink():
                    path.unlink()
            if made and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise

"""CIFAR-10 and CIFAR-100 from the "python version" of their release, read without running
code: the pickles are opened by an unpickler that rebuilds numpy arrays and nothing else."""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

from graphkit.training.data.images import ImageSource
from graphkit.training.data.source import SPLITS, DataError


@dataclass(frozen=True)
class CifarLayout:
    """Where a CIFAR release (the "python version" of the CIFAR site) keeps its batches."""

    title: str
    folder: str  # the folder the archive unpacks to
    train: tuple[str, ...]
    eval: tuple[str, ...]
    meta: str  # the file naming the classes...
    names: str  # ...under this key
    labels: str  # each batch's label list


CIFAR = {
    "cifar10": CifarLayout(
        "CIFAR-10",
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "batches.meta",
        "label_names",
        "labels",
    ),
    "cifar100": CifarLayout(
        "CIFAR-100", "cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels"
    ),
}


def _latin1(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as Python 3 pickles bytes at protocol 2, limited to that use."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


@functools.cache
def _cifar_globals() -> dict[tuple[str, str], Any]:
    """The only globals a CIFAR pickle may name: numpy's array, dtype and scalar rebuilders
    under the module names numpy 1 and 2 write, and the bytes codec of protocol 2. Each rebuilds
    data from data; none can import or call anything else."""

    try:
        from numpy._core import multiarray, numeric  # noqa: PLC0415 (the name differs by numpy version)
    except ImportError:  # numpy 1
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]  # noqa: PLC0415
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[f"{package}.multiarray", "_reconstruct"] = multiarray._reconstruct
        allowed[f"{package}.multiarray", "scalar"] = multiarray.scalar
        allowed[f"{package}.numeric", "_frombuffer"] = numeric._frombuffer  # type: ignore[attr-defined]  # private
    return allowed


class _CifarUnpickler(pickle.Unpickler):
    """Reads a CIFAR batch without running code: a pickle names the functions it calls, and
    any name but numpy's rebuilders is refused before it is imported."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        super().__init__(file, encoding="latin1")  # the release was pickled by Python 2
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = _cifar_globals().get((module, name))
        if allowed is None:
            raise DataError(
                f"{self.path}: names {module}.{name}, which a CIFAR batch never holds; refused without "
                "running it (accepted: numpy arrays, lists, dicts, strings and numbers)"
            )
        return allowed


def read_cifar_file(path: Path) -> dict[str, Any]:
    """One CIFAR pickle (a batch or the meta file) as a dict, read by :class:`_CifarUnpickler`;
    DataError naming the file if it is no such pickle."""
    try:
        with open(path, "rb") as f:
            value = _CifarUnpickler(f, path).load()
    except DataError:
        raise
    except Exception as e:  # a damaged pickle fails in many ways (EOFError, UnpicklingError, TypeError from numpy...)
        raise DataError(f"{path}: not a CIFAR pickle ({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: not a CIFAR pickle (holds a {type(value).__name__}, not a dict)")
    return value


def _cifar_batch(path: Path, layout: CifarLayout, classes: int) -> tuple[Tensor, Tensor]:
    """A batch file's images, uint8 (N, 3, 32, 32), and labels, checked against the layout."""

    batch = read_cifar_file(path)
    data, labels = batch.get("data"), batch.get(layout.labels)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(
            f"{path}: 'data' must be a uint8 array of N rows of 3072 pixels (32x32, R then G then B); "
            f"got {getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}"
        )
    if (
        not isinstance(labels, (list, np.ndarray))
        or len(labels) != len(data)
        or not all(isinstance(t, (int, np.integer)) and 0 <= t < classes for t in labels)
    ):
        raise DataError(
            f"{path}: {layout.labels!r} must list {len(data)} labels from 0 to {classes - 1}, one per image"
        )
    return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), torch.tensor(
        [int(t) for t in labels], dtype=torch.long
    )


def cifar(spec: str, folder: Path) -> ImageSource:
    """A CIFAR-10 or -100 folder as the CIFAR site ships it (no md5 check, so subsets and
    re-pickled copies load); DIR may be the root or the batches folder itself. The pickles are
    read by a restricted unpickler: a crafted file cannot run code."""
    layout = CIFAR[spec.partition(":")[0]]
    inside = not (folder / layout.folder).is_dir() and (folder / layout.eval[0]).is_file()
    batches = folder if inside else folder / layout.folder
    files = [*layout.train, *layout.eval, layout.meta]
    missing = next((name for name in files if not (batches / name).is_file()), None)
    if missing is not None:
        raise DataError(
            f"{spec}: {folder} is not a {layout.title} folder (expected {layout.folder}/ with "
            f"{', '.join(files)}; {batches / missing} is missing)"
        )
    names = read_cifar_file(batches / layout.meta).get(layout.names)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"{batches / layout.meta}: {layout.names!r} must list the class names")
    splits = {}
    for split, members in zip(SPLITS, (layout.train, layout.eval)):
        parts = [_cifar_batch(batches / name, layout, len(names)) for name in members]
        splits[split] = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    return ImageSource(spec, splits, len(names), 3, "32x32x3")

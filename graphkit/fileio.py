"""Writing files so that nothing is lost or half-written, and checking output paths before work.

Every file graphkit writes appears complete or not at all: it is written to a uniquely named
temporary file beside its final place and renamed over it. ``tempfile.mkstemp`` creates files
with mode 0600 whatever the umask; :func:`atomic_path` gives the final file the mode a plain
``open(path, "w")`` would (0666 less the umask), so datasets and weights stay readable by the
group and the Hub's tooling.

Output paths are checked where they enter (:func:`check_output_file`,
:func:`check_output_dir`), before any long work, so a bad ``--out`` fails in a second rather
than after an hour of training.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import GraphkitError


class OutputError(GraphkitError):
    """An output path is unusable: a folder where a file goes, under a file, or not ours to overwrite."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error, the file
    written there gets the umask's mode and is renamed to ``path``; on any error (Ctrl-C
    included) it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_path`)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


def _check_parents(path: Path, what: str) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what} {path}: {parent} is a file, not a folder")
            return


def check_output_file(path: str | Path, what: str = "--out", suffixes: tuple[str, ...] = ()) -> Path:
    """Check that a file can be written at ``path`` before any work: it has a name, is not a
    folder, does not lie under a file, and (if ``suffixes`` are given) ends in one of them."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputError(f"{what} {path}: needs a file name")
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a folder; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputError(f"{what} {path}: unsupported extension {path.suffix or '(none)'!r}; accepted: {', '.join(suffixes)}")
    _check_parents(path, what)
    return path


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """Check that ``path`` can be a folder graphkit writes into: it is one already or can be made
    (it is not a file and does not lie under a file)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: is a file, not a folder")
    _check_parents(path, what)
    return path


__all__ = ["OutputError", "atomic_path", "write_text_atomic", "check_output_file", "check_output_dir"]

"""Writing files so that nothing is lost or half-written, and checking output paths before work.

Every file graphkit writes appears complete or not at all: it is written to a uniquely named
temporary file beside its final place and renamed over it. ``tempfile.mkstemp`` creates files
with mode 0600 whatever the umask; :func:`atomic_path` gives the final file the mode a plain
``open(path, "w")`` would (0666 less the umask), so datasets and weights stay readable by the
group and the Hub's tooling.

Output paths are checked where they enter (:func:`check_output_file`,
:func:`check_output_dir`), before any long work, so a bad ``--out`` fails in a second rather
than after an hour of training. An existing file is overwritten only when graphkit wrote it
(:func:`written_by_graphkit`): every file graphkit writes carries its mark (a graph's JSON
keys, a ``graphkit`` key in a safetensors header, the ``Software`` / ``Creator`` field of a
figure, a summary's closing ``fingerprint`` line), so ``--out model.py`` or ``--out
pretrained.safetensors`` never replaces a user's file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed
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


def _new_folder(parent: Path, name: str, kind: str) -> Path:
    """An empty hidden folder of a name no one else uses, in ``parent``, for staging a save."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / f".{name}.{uuid.uuid4().hex[:12]}.{kind}"
    folder.mkdir()
    return folder


def write_folder(path: str | Path, write: Callable[[Path], None], *, in_place: bool = False) -> Path:
    """Have ``write`` fill a freshly made hidden folder beside ``path`` (or inside it, with
    ``in_place``), then put what it wrote at ``path`` so that an interrupted save leaves the
    previous contents intact: by default the folder is swapped whole (its files always belong
    together, and an earlier save's files of other names go); with ``in_place`` (a run folder
    that holds more, such as metrics or a checkpoint) each written file replaces its namesake,
    ``config.json`` last, and nothing else is touched. Returns the absolute ``path``. Whether
    ``path`` may be written at all is the caller's check (:func:`check_output_dir`)."""
    path = Path(os.path.abspath(path))
    in_place = in_place and path.is_dir()
    staging = _new_folder(path if in_place else path.parent, path.name, "tmp")
    old = None
    try:
        write(staging)
        if in_place:
            for name in sorted(os.listdir(staging), key=lambda n: n == "config.json"):  # config.json last
                os.replace(staging / name, path / name)
            staging.rmdir()
            return path
        if path.exists():
            old = _new_folder(path.parent, path.name, "old")
            os.replace(path, old)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)
    return path


#: the mark every file graphkit writes carries (see the module docstring)
MARK = "graphkit"
_FINGERPRINT_LINE = re.compile(rb"fingerprint [0-9a-f]{32}\s*$")
#: JSON files graphkit writes, by the keys they hold: a graph (``trace --out``), an evaluation
_JSON_KEYS = ({"nodes", "edges", "meta"}, {"config", "summary", "rows"})
#: files larger than this are never graphkit's JSON or text, and are not read whole to find out
_MAX_TEXT = 256 << 20


def version() -> str:
    """graphkit's installed version (what its marks record), or "unknown" outside an install."""
    try:
        return installed(MARK)
    except PackageNotFoundError:
        return "unknown"


def figure_metadata(format: str) -> dict[str, str]:
    """The ``savefig(metadata=...)`` that marks a matplotlib figure as graphkit's."""
    mark = f"{MARK} {version()}"
    return {"png": {"Software": mark}, "pdf": {"Creator": mark}, "svg": {"Creator": mark}}.get(format.lower(), {})


def written_by_graphkit(path: str | Path) -> bool:
    """Whether the file at ``path`` carries graphkit's mark (so graphkit may replace it)."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        with open(path, "rb") as f:
            if suffix == ".safetensors":
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size)) if 1 < size < 100_000_000 else None
                metadata = header.get("__metadata__") if isinstance(header, dict) else None
                return isinstance(metadata, dict) and any(str(key).startswith(MARK) for key in metadata)
            if suffix == ".png":
                return _png_software(f).startswith(MARK.encode())
            if suffix in (".svg", ".pdf"):
                head = f.read(1 << 16)
                f.seek(max(0, os.fstat(f.fileno()).st_size - (1 << 16)))
                return MARK.encode() in head + f.read()
            if os.fstat(f.fileno()).st_size > _MAX_TEXT:
                return False
            data = f.read()
    except (OSError, ValueError, struct.error):
        return False
    if suffix == ".json":
        try:
            value = json.loads(data)
        except ValueError:
            return False
        return isinstance(value, dict) and any(keys <= value.keys() for keys in _JSON_KEYS)
    return bool(_FINGERPRINT_LINE.search(data))


def _png_software(f) -> bytes:
    """The ``Software`` text of an open PNG file (b"" when it has none, or is not a PNG)."""
    if f.read(8) != b"\x89PNG\r\n\x1a\n":
        return b""
    while True:
        head = f.read(8)
        if len(head) < 8:
            return b""
        length, kind = struct.unpack(">I4s", head)
        if kind in (b"IDAT", b"IEND"):
            return b""
        data = f.read(length)
        f.read(4)  # CRC
        if kind == b"tEXt" and data.startswith(b"Software\x00"):
            return data[len(b"Software\x00") :]


def _check_parents(path: Path, what: str) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what} {path}: {parent} is a file, not a folder")
            return


def check_output_file(path: str | Path, what: str = "--out", suffixes: tuple[str, ...] = ()) -> Path:
    """Check that a file can be written at ``path`` before any work: it has a name, is not a
    folder, does not lie under a file, is not a Python file, ends in one of ``suffixes`` (if
    given), and is either new or a file graphkit wrote (:func:`written_by_graphkit`)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputError(f"{what} {path}: needs a file name")
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a folder; give a file name")
    if path.suffix.lower() == ".py":
        raise OutputError(f"{what} {path}: is a Python file name; graphkit never writes over model sources")
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputError(
            f"{what} {path}: unsupported extension {path.suffix or '(none)'!r}; accepted: {', '.join(suffixes)}"
        )
    _check_parents(path, what)
    if path.exists() and not written_by_graphkit(path):
        raise OutputError(
            f"{what} {path}: exists and was not written by graphkit; refusing to overwrite it "
            "(remove it, or choose another name)"
        )
    return path


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """Check that ``path`` can be a folder graphkit writes into: it is one already or can be made
    (it is not a file and does not lie under a file)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: is a file, not a folder")
    _check_parents(path, what)
    return path


__all__ = [
    "OutputError",
    "MARK",
    "version",
    "atomic_path",
    "write_text_atomic",
    "write_folder",
    "check_output_file",
    "check_output_dir",
    "written_by_graphkit",
    "figure_metadata",
]

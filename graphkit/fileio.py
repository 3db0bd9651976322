"""Writing files so that nothing is lost or half-written, and checking output paths before work.

Every file graphkit writes appears complete or not at all: it is written into a uniquely named
hidden folder beside its final place (``.<name>.<hex>.tmp/``) and renamed over it. The folder,
not a lone temporary file, because the libraries that write for graphkit make temporary files
of their own beside their target (safetensors' ``save_file`` writes ``.tmpXXXXXX`` and renames
it): in graphkit's folder they are graphkit's to remove. Whatever ends the write, an error,
Ctrl-C or SIGTERM (every command unwinds on it, :func:`graphkit.workers.ended_by_sigterm`),
the folder goes with everything in it. safetensors creates files with mode 0600 whatever the
umask; :func:`atomic_path` gives the final file the mode a plain ``open(path, "w")`` would
(0666 less the umask), so datasets and weights stay readable by the group and the Hub's tooling.

Output paths are checked where they enter (:func:`check_output_file`,
:func:`check_output_dir`), before any long work, so a bad ``--out`` fails in a second rather
than after an hour of training. The rule for an existing path:

- A file is graphkit's only when graphkit can prove it wrote it: a mark, naming graphkit, a
  version (a number first, as PEP 440's are) and one of the kinds graphkit writes, at a fixed
  place in the format itself (:func:`graphkit_kind`), and for JSON nothing else in the stamp:

  =============  ===========================================================================
  JSON           a top-level ``"graphkit": {"kind": ..., "version": ...}`` key
  safetensors    the header's metadata key ``graphkit``, ``graphkit <version> <kind>``
  text           a first line ``# graphkit <version> <kind>``
  SVG            a first line ``<!-- graphkit <version> <kind> -->`` (second after ``<?xml ...?>``)
  PNG            a ``Software`` text chunk ``graphkit <version> <kind>`` before the image data
  PDF            the document information's ``Creator``, ``graphkit <version> <kind>``
  =============  ===========================================================================

  Nothing else counts: not a graph's ``nodes`` / ``edges`` keys, which any JSON can hold, nor
  a trailing ``fingerprint`` line, which a user can paste into their notes, nor a lookalike
  (``# graphkit usage summary``, ``<!-- graphkit logo drawing -->``, a settings file's own
  ``"graphkit": {"kind": ...}`` section). Files written by a
  graphkit from before these marks carry none and are refused like a user's.
- A command replaces only a file of the kind it writes (:data:`KINDS`): ``trace --out`` over
  compiled weights, ``predict --out`` over a graph or ``compile --out`` over a drawing is
  refused, naming both kinds. Each command's weights are their own kind, so ``predict`` never
  replaces the weights ``compile`` or ``convert`` wrote, which may hold a trained model.
- A symbolic link, live or dangling, is refused: replacing it would either write through to
  a file elsewhere or silently turn the link into a file.
- Anything that is not a regular file (a folder, a device, a pipe) is refused.

Folders follow the same rule (:func:`check_output_dir`): a symbolic link is refused, and a
folder whose marked files say it holds another kind of graphkit output (:func:`folder_kind`)
is refused, naming both kinds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphkit.errors import OutputError

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a path of ``path``'s name inside a fresh hidden folder beside it; when the block
    ends without an error, the file written there gets the umask's mode and is renamed to
    ``path``; however it ends, the folder is removed with whatever the writer left in it (see
    the module docstring), and on an error (Ctrl-C and SIGTERM included) ``path`` is untouched."""
    path = Path(path)
    staging = _new_folder(path.parent, path.name, "tmp")
    try:
        tmp = staging / path.name
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


#: the name every mark starts with (see the module docstring)
MARK = "graphkit"
#: what graphkit writes, by the kind its mark records: a command replaces only its own kind,
#: and a refusal names both with these words
KINDS = {
    "graph": "a graph",  # trace --out (JSON)
    "summary": "a graph summary",  # trace --format text --out
    "drawing": "a drawing",  # draw
    "histogram": "a parameter-count histogram",  # stats --png
    "weights": "weights",  # graphkit.params.save_params called from Python
    "predicted-weights": "predicted weights",  # predict --out
    "converted-weights": "converted weights",  # convert --out
    "compiled-weights": "compiled weights",  # compile --out
    "evaluation": "an evaluation",  # eval-ghn: eval.json, and the folder holding it
    "evaluation-figure": "an evaluation figure",  # eval-ghn: eval.png
    "hypernetwork": "a hypernetwork checkpoint",  # train-ghn: its files, and the folder holding them
    "training-figure": "a training-metrics figure",  # train-ghn: metrics.png
    "dataset": "a dataset",  # generate: the folder
    "model-folder": "a model folder",  # convert --format hf: what save_pretrained writes, marked in config.json
    "finetune": "an up-training run",  # finetune: the run folder, its model.safetensors and checkpoint
}
#: a version as graphkit's marks record one (PEP 440's shape: it starts with a number), so that
#: a user's "# graphkit usage summary" is no mark
_VERSION = r"[0-9]+(?:\.[0-9]+)*(?:[-.+!]?[0-9A-Za-z]+)*"
#: the text of a mark: graphkit, its version, a kind's name (one of :data:`KINDS`, checked apart)
_MARK_TEXT = re.compile(rf"{MARK} ({_VERSION}) ([a-z][a-z0-9-]*)")
#: the fields of a JSON mark; a folder saved in Hugging Face's format adds what it was made by
_STAMP_FIELDS = {"kind", "version"}
#: the file, by folder kind, whose mark says what a folder graphkit writes holds (a dataset by
#: its run file, named in graphkit's hidden namespace and written before anything else)
FOLDER_MARKERS = {
    "dataset": ".graphkit-run.json",
    "hypernetwork": "config.json",
    "evaluation": "eval.json",
    "finetune": "checkpoint/trainer_state.json",  # before model-folder: a run saved --format hf holds both
    "model-folder": "config.json",
}


def register_kind(kind: str, words: str, folder_marker: str | None = None) -> None:
    """Make ``kind`` an output graphkit marks, replaces only over its own kind and refuses to
    write over otherwise (``words``: how refusals name it, "a graph"); ``folder_marker`` is the
    file inside a folder of this kind whose mark says what the folder holds. Registering a kind
    again with other words or another marker is a bug, not a registration."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", kind):
        raise ValueError(f"kind {kind!r}: lower-case letters, digits and '-', starting with a letter")
    if KINDS.get(kind, words) != words or FOLDER_MARKERS.get(kind, folder_marker) != folder_marker:
        raise ValueError(f"kind {kind!r} is registered already, as {KINDS[kind]!r}")
    KINDS[kind] = words
    if folder_marker is not None:
        FOLDER_MARKERS[kind] = folder_marker


#: files larger than this are never graphkit's JSON, and are not read whole to find out
_MAX_JSON = 256 << 20
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


#: the version marks record when neither an installed graphkit nor its checkout says: still a
#: version (a PEP 440 local one), so that graphkit recognises its own marks
UNKNOWN_VERSION = "0+unknown"


def version() -> str:
    """graphkit's installed version (what its marks record); run from a source checkout that is not
    installed (``PYTHONPATH=.``, as on a lent GPU machine), the checkout's pyproject.toml's; else
    :data:`UNKNOWN_VERSION`."""
    try:
        return installed(MARK)
    except PackageNotFoundError:
        pass
    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    except (OSError, UnicodeDecodeError):
        return UNKNOWN_VERSION
    section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)  # Python 3.10 has no tomllib
    fields = dict(re.findall(r'^(name|version)\s*=\s*"([^"]+)"', section.group(1), re.M)) if section else {}
    return fields.get("version", UNKNOWN_VERSION) if fields.get("name") == MARK else UNKNOWN_VERSION


def _known(kind: str) -> str:
    """``kind``, which must be one of :data:`KINDS` (another is a bug in graphkit, not bad input)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of output {kind!r}; known: {', '.join(KINDS)}")
    return kind


def mark(kind: str) -> str:
    """The mark of a file of ``kind`` (one of :data:`KINDS`): ``graphkit <version> <kind>``."""
    return f"{MARK} {version()} {_known(kind)}"


def marked_text(kind: str, text: str) -> str:
    """``text`` behind the leading comment line ``# graphkit <version> <kind>`` that proves it
    graphkit's (a trailing line would not: a user can paste output at the end of their notes)."""
    return f"# {mark(kind)}\n{text}"


def marked_json(kind: str, value: Mapping[str, Any], **dumps: Any) -> str:
    """``value`` (a JSON object) as JSON text with the top-level key ``"graphkit": {"kind": kind,
    "version": ...}`` first (replacing any it had); ``dumps`` go to ``json.dumps``."""
    fields = {key: item for key, item in value.items() if key != MARK}
    return json.dumps({MARK: {"kind": _known(kind), "version": version()}, **fields}, **dumps)


def marked_svg(kind: str, svg: str) -> str:
    """The SVG document ``svg`` with the comment ``<!-- graphkit <version> <kind> -->`` as its
    first line, or its second after an XML declaration (which must come first)."""
    comment = f"<!-- {mark(kind)} -->\n"
    if svg.startswith("<?xml"):
        declaration, _, rest = svg.partition("\n")
        return f"{declaration}\n{comment}{rest}"
    return comment + svg


def save_figure(figure: Figure, path: str | Path, kind: str, **savefig: Any) -> Path:
    """Save a matplotlib figure atomically in the format of ``path``'s extension (.png, .svg or
    .pdf), marked as graphkit's ``kind``; ``savefig`` go to ``Figure.savefig`` (dpi, facecolor)."""
    path = Path(path)
    format = path.suffix[1:].lower()
    with atomic_path(path) as tmp:
        if format == "svg":
            text = io.StringIO()
            figure.savefig(text, format="svg", **savefig)
            tmp.write_text(marked_svg(kind, text.getvalue()))
        else:
            field = {"png": "Software", "pdf": "Creator"}[format]
            figure.savefig(tmp, format=format, metadata={field: mark(kind)}, **savefig)
    return path


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | Path, kind: str, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` to the safetensors file ``path`` atomically, with the umask's mode (not
    the 0600 safetensors gives), marked as graphkit's ``kind`` in the header's metadata key
    ``graphkit`` beside ``metadata`` (whose own ``graphkit`` is replaced; its ``graphkit_...``
    keys are facts about the model, such as a conversion's, and are kept)."""
    from safetensors.torch import save_file  # noqa: PLC0415 (torch: the CLI imports fileio, --help must not wait)

    header = {**(metadata or {}), MARK: mark(kind)}
    with atomic_path(path) as tmp:
        save_file(dict(tensors), str(tmp), metadata=header)
        _sort_metadata(tmp)
    return Path(path)


def _sort_metadata(path: Path) -> None:
    """Rewrite the header of the safetensors file ``path`` with its metadata keys sorted.
    safetensors keeps the metadata in a hash map whose order changes from one save to the next,
    so the same tensors would give files of different bytes (and checkpoint hashes); the sorted
    header has the same length, so only it is rewritten, in place."""
    with open(path, "r+b") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(length))
        metadata = header.get("__metadata__")
        if not isinstance(metadata, dict):
            return
        header["__metadata__"] = dict(sorted(metadata.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:  # never: the same keys and values, reordered
            return
        f.seek(8)
        f.write(text.ljust(length, b" "))


def graphkit_kind(path: str | Path) -> str | None:
    """The kind recorded in the mark of the file at ``path`` (see the module docstring), or None
    when it carries none: a user's file, a file from a graphkit before marks, no regular file."""
    if not Path(path).is_file():  # a pipe or a device is never opened: reading could block
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if head == _PNG_SIGNATURE:
                return _kind_in(_png_software(f))
            if head.startswith(b"%PDF-"):
                return _kind_in(_pdf_creator(f))
            size = os.fstat(f.fileno()).st_size
            kind = _safetensors_kind(f, head, size)
            f.seek(0)
            if kind is not None or size > _MAX_JSON:
                return kind
            start = f.read(4096)
            if start.lstrip().startswith(b"{"):
                return _json_kind(start + f.read())
    except OSError:
        return None
    return _first_line_kind(start)


def _first_line_kind(start: bytes) -> str | None:
    """The kind in the comment that opens a text or SVG file (``start``: its first bytes)."""
    first, second = (start.split(b"\n", 2) + [b"", b""])[:2]
    if first.startswith(b"<?xml"):
        first = second
    match = re.fullmatch(rb"(?:# (.*?)|<!-- (.*?) -->)\r?", first)
    return _kind_in(match[1] or match[2]) if match else None


def _kind_in(text: bytes | str) -> str | None:
    """The kind in a mark's text (``graphkit <version> <kind>``), or None if it is not one."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    match = _MARK_TEXT.fullmatch(text)
    return match[2] if match and match[2] in KINDS else None


def _json_kind(data: bytes) -> str | None:
    """The kind of a JSON document's top-level ``graphkit`` stamp, or None unless the stamp is
    exactly graphkit's: ``kind`` (one of :data:`KINDS`) and a ``version``, and nothing else but
    in a model folder's config.json (what the folder was made by). A settings file with a
    ``graphkit`` section of its own is a user's."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    stamp = value.get(MARK) if isinstance(value, dict) else None
    if not isinstance(stamp, dict) or not _STAMP_FIELDS <= stamp.keys():
        return None
    kind, written_by = stamp["kind"], stamp["version"]
    if not (isinstance(kind, str) and isinstance(written_by, str)):
        return None
    kind = _kind_in(f"{MARK} {written_by} {kind}")  # the text marks' grammar: a version, a known kind
    return kind if kind == "model-folder" or stamp.keys() == _STAMP_FIELDS else None


def _safetensors_kind(f, head: bytes, size: int) -> str | None:
    """The kind in a safetensors header's metadata (``head``: the file's first 8 bytes), or None
    when the file is not safetensors or its metadata carries no kind."""
    if len(head) < 8:
        return None
    length = struct.unpack("<Q", head)[0]
    if not 2 <= length <= min(size - 8, 100_000_000):
        return None
    try:
        header = json.loads(f.read(length))
    except ValueError:
        return None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    stamp = metadata.get(MARK) if isinstance(metadata, dict) else None
    return _kind_in(stamp) if isinstance(stamp, str) else None


def _png_software(f) -> bytes:
    """The ``Software`` text of an open PNG file past its signature (b"" when it has none)."""
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


def _pdf_creator(f) -> bytes:
    """The ``Creator`` of an open PDF's document information: the dictionary the last trailer's
    ``/Info`` names, found in the last 64 KB (where matplotlib writes it); b"" when there is none."""
    f.seek(max(0, os.fstat(f.fileno()).st_size - (1 << 16)))
    tail = f.read()
    info = re.findall(rb"/Info (\d+) 0 R", tail)
    if not info:
        return b""
    objects = re.findall(rb"(?:^|[\r\n])" + info[-1] + rb" 0 obj\s*<<(.*?)>>\s*endobj", tail, re.S)
    creator = re.search(rb"/Creator \(([^()\\]*)\)", objects[-1]) if objects else None
    return creator[1] if creator else b""


def describe_kind(kind: str, article: bool = True) -> str:
    """The words for ``kind`` in a message: "a graph", or without ``article`` "graph"."""
    words = KINDS.get(kind, f"a {kind} file")
    return words if article else re.sub(r"^(a|an) ", "", words)


def _check_parents(path: Path, what: str) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what} {path}: {parent} is a file, not a folder")
            return


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        state = "" if path.exists() else " (dangling)"
        raise OutputError(
            f"{what} {path}: is a symbolic link{state}; graphkit never writes through or over a link "
            "(give the path it points to, or another name)"
        )


def check_output_file(path: str | Path, what: str = "--out", suffixes: tuple[str, ...] = (), *, kind: str) -> Path:
    """Check that a file of ``kind`` (one of :data:`KINDS`) can be written at ``path`` before any
    work: it has a name, is not a symbolic link, a folder or a Python file, does not lie under a
    file, ends in one of ``suffixes`` (if given), and is either new or a regular file whose mark
    proves it graphkit's ``kind`` (:func:`graphkit_kind`); an OutputError naming ``what`` and
    ``path`` otherwise, the file untouched."""
    path, kind = Path(path), _known(kind)
    if path.name in ("", ".", ".."):
        raise OutputError(f"{what} {path}: needs a file name")
    _refuse_link(path, what)
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a folder; give a file name")
    if path.suffix.lower() == ".py":
        raise OutputError(f"{what} {path}: is a Python file name; graphkit never writes over model sources")
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputError(
            f"{what} {path}: unsupported extension {path.suffix or '(none)'!r}; accepted: {', '.join(suffixes)}"
        )
    _check_parents(path, what)
    if not path.exists():
        return path
    if not path.is_file():
        raise OutputError(f"{what} {path}: is not a regular file; refusing to write over it")
    found = graphkit_kind(path)
    if found is None:
        raise OutputError(
            f"{what} {path}: exists and was not written by graphkit; refusing to overwrite it "
            "(remove it, or choose another name)"
        )
    if found != kind:
        raise OutputError(
            f"{what} {path}: holds graphkit's {describe_kind(found, article=False)}, not {describe_kind(kind)}; "
            "refusing to replace it (remove it, or choose another name)"
        )
    return path


def folder_kind(path: str | Path) -> str | None:
    """What the folder ``path`` holds by graphkit's marks (a kind of :data:`FOLDER_MARKERS`), or
    None: a new or empty folder, a user's, or one from a graphkit before marks."""
    path = Path(path)
    for kind, name in FOLDER_MARKERS.items():
        marker = path / name
        if marker.is_file() if kind == "dataset" else graphkit_kind(marker) == kind:
            return kind
    return None


def check_output_dir(path: str | Path, what: str = "--out", *, kind: str | None = None) -> Path:
    """Check that ``path`` can be a folder graphkit writes into: it is not a symbolic link, is a
    folder already or can be made (it is not a file and does not lie under a file), and, with
    ``kind``, does not hold another kind of graphkit output (:func:`folder_kind`)."""
    path = Path(path)
    kind = kind if kind is None else _known(kind)
    _refuse_link(path, what)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: is a file, not a folder")
    _check_parents(path, what)
    found = folder_kind(path) if kind is not None else None
    if kind is not None and found is not None and found != kind:
        raise OutputError(
            f"{what} {path}: holds graphkit's {describe_kind(found, article=False)}, not {describe_kind(kind)}; "
            "refusing to write into it (choose another folder)"
        )
    return path


__all__ = [
    "OutputError",
    "MARK",
    "UNKNOWN_VERSION",
    "KINDS",
    "FOLDER_MARKERS",
    "register_kind",
    "version",
    "mark",
    "marked_text",
    "marked_json",
    "marked_svg",
    "atomic_path",
    "write_text_atomic",
    "save_figure",
    "save_safetensors",
    "write_folder",
    "check_output_file",
    "check_output_dir",
    "graphkit_kind",
    "folder_kind",
    "describe_kind",
]

"""Data the hypernetwork trains and evaluates on: random batches shaped for any model config.

LoGAH scores predicted parameters by running the predicted model on real data, so a source
must fit every config of a family (any image size, channel count, context length). Images are
resized per batch and text is tokenised as UTF-8 bytes (ids 0..255), which any vocab >= 256
accepts with no tokenizer download. The defaults ship with scikit-learn and Python itself, so
training and tests never touch the network.

    >>> source = load_source("digits")
    >>> images, labels = source.batch(config, 32, torch.Generator().manual_seed(0))
"""

from __future__ import annotations

import abc
import functools
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from graphkit.errors import GraphkitError
from graphkit.families import FamilyTable

SPLITS = ("train", "eval")
#: each family's default data source (``Family.data``), a live view of the family registry
DEFAULT_SOURCES = FamilyTable("data")
TEXT_SUFFIXES = (".txt", ".tokens", ".raw", ".md")
WIKITEXT_FILES = (("wiki.train.tokens", "wiki.valid.tokens"), ("wiki.train.raw", "wiki.valid.raw"))


class DataError(GraphkitError):
    """A data source cannot be loaded, or cannot feed the model it is asked to."""


def default_source(family: str) -> str:
    """The bundled source for a family's models (used when the user names none)."""
    if family not in DEFAULT_SOURCES:
        raise DataError(f"no default data for family {family!r}; families with one: {', '.join(DEFAULT_SOURCES)}")
    return DEFAULT_SOURCES[family]


class DataSource(abc.ABC):
    """Random batches from one dataset; ``task`` is "image" or "text", ``spec`` what it was loaded from."""

    task: str

    def __init__(self, spec: str, sizes: Mapping[str, int]) -> None:
        self.spec = spec
        self.sizes = dict(sizes)  # examples (images or bytes) per split, for describe()
        empty = [s for s in SPLITS if not self.sizes[s]]
        if empty:
            raise DataError(
                f"{spec}: the {empty[0]} split is empty (train {self.sizes['train']:,}, eval {self.sizes['eval']:,})"
            )

    def batch(
        self, config: Mapping[str, Any], batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[Tensor, Tensor]:
        """(inputs, targets) for the model a resolved ``config`` describes, drawn with replacement
        so a training step needs no epoch bookkeeping."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
        self.check(config)
        return self._batch(config, batch_size, generator, split)

    def check(self, config: Mapping[str, Any]) -> None:
        """Raise DataError (one line) if this data cannot feed the model ``config`` describes."""
        family = config.get("family", "?")
        wants = "image" if "image_size" in config else "text" if "vocab_size" in config else None
        if wants != self.task:
            model = (
                f"a {family} model takes {wants}"
                if wants
                else f"the {family} config has neither image_size nor vocab_size"
            )
            raise DataError(f"{self.spec} is {self.task} data but {model}")

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for logs and reports."""

    @abc.abstractmethod
    def _batch(
        self, config: Mapping[str, Any], batch_size: int, generator: torch.Generator, split: str
    ) -> tuple[Tensor, Tensor]:
        """The batch itself, after ``batch`` has checked the split and the config."""


class ImageSource(DataSource):
    """Labelled images, either uint8 (N, C, H, W) tensors in memory or files read per batch by ``load``.

    Batches are float (B, in_chans, image_size, image_size): scaled to [0, 1], resized bilinearly,
    channels repeated (1 -> C) or averaged (C -> 1), then normalised with mean 0.5 / std 0.5 to [-1, 1]."""

    task = "image"

    def __init__(
        self,
        spec: str,
        splits: Mapping[str, tuple[Any, Tensor]],
        num_classes: int,
        channels: int,
        shape: str,
        load: Callable[[Any], Tensor] | None = None,
    ) -> None:
        super().__init__(spec, {s: len(t) for s, (_, t) in splits.items()})
        self.splits, self.num_classes, self.channels, self.shape, self.load = splits, num_classes, channels, shape, load

    def check(self, config: Mapping[str, Any]) -> None:
        """Also: the head must cover every class, and channels must match or be 1 on one side."""
        super().check(config)
        if self.num_classes > config["num_classes"]:
            raise DataError(
                f"{self.spec} has {self.num_classes} classes but the "
                f"{config['family']} config has num_classes {config['num_classes']}"
            )
        if self.channels != config["in_chans"] and 1 not in (self.channels, config["in_chans"]):
            raise DataError(
                f"{self.spec} images have {self.channels} channels; "
                f"in_chans {config['in_chans']} needs 1 or {self.channels}"
            )

    def describe(self) -> str:
        """E.g. "digits: 1,437 train / 360 eval images, 10 classes, 8x8x1"."""
        sizes = f"{self.sizes['train']:,} train / {self.sizes['eval']:,} eval"
        return f"{self.spec}: {sizes} images, {self.num_classes} classes, {self.shape}"

    def _batch(self, config, batch_size, generator, split):
        images, targets = self.splits[split]
        idx = torch.randint(len(targets), (batch_size,), generator=generator)
        if self.load is None:
            return _fit(images[idx], config), targets[idx]
        return torch.cat([_fit(self.load(images[i])[None], config) for i in idx.tolist()]), targets[idx]


def _fit(images: Tensor, config: Mapping[str, Any]) -> Tensor:
    """uint8 (B, C, H, W) -> the normalised float input ``config``'s model takes."""
    x = images.float() / 255
    size, chans = config["image_size"], config["in_chans"]
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    if x.shape[1] != chans:
        x = x.expand(-1, chans, -1, -1) if x.shape[1] == 1 else x.mean(1, keepdim=True)
    return (x - 0.5) / 0.5


class TextSource(DataSource):
    """A UTF-8 byte stream per split; a batch is B random windows of T = min(seq_len, context)
    bytes, targets the same windows shifted by one."""

    task = "text"

    def __init__(self, spec: str, train: bytes, eval: bytes, seq_len: int) -> None:
        if not (train or eval):
            raise DataError(f"{spec}: no text (0 bytes)")
        super().__init__(spec, {"train": len(train), "eval": len(eval)})
        self.seq_len = seq_len
        self.tokens = {
            s: torch.frombuffer(bytearray(b), dtype=torch.uint8) for s, b in (("train", train), ("eval", eval))
        }

    def check(self, config: Mapping[str, Any]) -> None:
        """Also: byte ids need vocab_size >= 256, and each split must hold one window plus its target."""
        super().check(config)
        if config["vocab_size"] < 256:
            raise DataError(
                f"{self.spec} tokens are UTF-8 bytes (ids 0..255); the {config['family']} "
                f"config has vocab_size {config['vocab_size']}, needs >= 256"
            )
        length = min(self.seq_len, config["context"])
        short = [s for s in SPLITS if self.sizes[s] <= length]
        if short:
            raise DataError(
                f"{self.spec}: the {short[0]} split has {self.sizes[short[0]]:,} "
                f"bytes, too few for a window of {length} tokens plus target"
            )

    def describe(self) -> str:
        """E.g. "stdlib-text: 418,473 train / 46,497 eval bytes, UTF-8 byte tokens, windows of 64"."""
        sizes = f"{self.sizes['train']:,} train / {self.sizes['eval']:,} eval"
        return f"{self.spec}: {sizes} bytes, UTF-8 byte tokens, windows of {self.seq_len}"

    def unigram_loss(self) -> float:
        """The eval split's loss under the train split's byte frequencies (add-one smoothed): what a
        model that ignores its input scores at best, the level a predicted language model must get below."""
        counts = torch.bincount(self.tokens["train"].long(), minlength=256).double() + 1
        return -(counts / counts.sum()).log()[self.tokens["eval"].long()].mean().item()

    def _batch(self, config, batch_size, generator, split):
        stream, length = self.tokens[split], min(self.seq_len, config["context"])
        starts = torch.randint(len(stream) - length, (batch_size, 1), generator=generator)
        windows = stream[starts + torch.arange(length + 1)].long()
        return windows[:, :-1], windows[:, 1:]


def output_loss(task: str, output: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy, accuracy) of a model's output: logits (B, classes) for images, an
    object with ``.logits`` (B, T, vocab) or the tensor itself for text (accuracy per token).
    The loss keeps its graph, as the hypernetwork trains through it; the accuracy does not."""
    logits = getattr(output, "logits", output)
    dims = {"image": 2, "text": 3}
    if task not in dims:
        raise ValueError(f"task must be one of {', '.join(dims)}; got {task!r}")
    if logits.dim() != dims[task] or logits.shape[:-1] != targets.shape:
        raise ValueError(f"{task} logits {tuple(logits.shape)} do not fit targets {tuple(targets.shape)}")
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())  # float32 whatever the model ran in
    return loss, (logits.detach().argmax(-1) == targets).float().mean()


def _split(n: int, train_fraction: float) -> tuple[Tensor, Tensor]:
    """A fixed permutation (seed 0) cut into train / eval indices, the same on every machine."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    return order[: int(n * train_fraction)], order[int(n * train_fraction) :]


def _digits(spec: str, _: Path | None) -> ImageSource:
    from sklearn.datasets import load_digits

    digits = load_digits()  # 1,797 8x8 images, values 0..16
    images = torch.from_numpy(digits.data * (255 / 16)).round().to(torch.uint8).view(-1, 1, 8, 8)
    targets = torch.from_numpy(digits.target).long()
    splits = {s: (images[i], targets[i]) for s, i in zip(SPLITS, _split(len(targets), 0.8))}
    return ImageSource(spec, splits, 10, 1, "8x8x1")


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
        from numpy.core import multiarray, numeric  # noqa: PLC0415
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[f"{package}.multiarray", "_reconstruct"] = multiarray._reconstruct
        allowed[f"{package}.multiarray", "scalar"] = multiarray.scalar
        allowed[f"{package}.numeric", "_frombuffer"] = numeric._frombuffer
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


def _cifar(spec: str, folder: Path) -> ImageSource:
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


def _imagefolder(spec: str, folder: Path) -> ImageSource:
    """Class subfolders; ``train/`` with ``val/`` or ``eval/`` are the splits, else a fixed 90/10 split."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms.functional import pil_to_tensor

    held_out = next((folder / d for d in ("val", "eval") if (folder / d).is_dir()), None)
    try:
        if (folder / "train").is_dir() and held_out is not None:
            train, held = ImageFolder(str(folder / "train")), ImageFolder(str(held_out))
            extra = sorted(set(held.classes) - set(train.classes))
            if extra:
                raise DataError(f"{spec}: {held_out} has class {extra[0]!r}, which {folder / 'train'} lacks")
            samples = {
                "train": train.samples,
                "eval": [(p, train.class_to_idx[held.classes[t]]) for p, t in held.samples],
            }
        else:
            train = ImageFolder(str(folder))
            samples = {s: [train.samples[j] for j in i] for s, i in zip(SPLITS, _split(len(train.samples), 0.9))}
    except OSError as e:  # ImageFolder: FileNotFoundError when it finds no class folder or image
        raise DataError(
            f"{spec}: no images in {folder} (expected class subfolders of image files, optionally "
            f"under train/ and val/; {e})"
        ) from None
    splits = {s: ([p for p, _ in v], torch.tensor([t for _, t in v], dtype=torch.long)) for s, v in samples.items()}

    def load(path: str) -> Tensor:
        try:
            return pil_to_tensor(train.loader(path))
        except Exception as e:  # PIL fails on a damaged or huge image in many ways; this runs mid-training
            raise DataError(
                f"{spec}: cannot read the image {path} ({type(e).__name__}: {e}); remove or replace it and resume"
            ) from None

    return ImageSource(spec, splits, len(train.classes), 3, "RGB files", load=load)


def _held_out_tail(data: bytes) -> tuple[bytes, bytes]:
    """Train on the first 90% of a byte stream, evaluate on the last 10% (text the model never saw)."""
    cut = int(len(data) * 0.9)
    return data[:cut], data[cut:]


def _stdlib_text(_: Path | None) -> tuple[bytes, bytes]:
    from pydoc_data.topics import topics  # noqa: PLC0415 (Python's own documentation, ~465K characters, read on use)

    return _held_out_tail("\n".join(topics[k] for k in sorted(topics)).encode("utf-8"))


def _text(path: Path) -> tuple[bytes, bytes]:
    if not path.is_dir():
        return _held_out_tail(path.read_bytes())
    files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"no text files ({', '.join('*' + s for s in TEXT_SUFFIXES)}) under {path}")
    return _held_out_tail(b"\n".join(p.read_bytes() for p in files))


def _wikitext(folder: Path) -> tuple[bytes, bytes]:
    for d in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        for train, valid in WIKITEXT_FILES:
            if (d / train).is_file() and (d / valid).is_file():
                return (d / train).read_bytes(), (d / valid).read_bytes()
    raise DataError(
        f"no WikiText in {folder} or its subfolders (looked for {' or '.join(' + '.join(f) for f in WIKITEXT_FILES)})"
    )


_IMAGE: dict[str, Callable[[str, Path | None], ImageSource]] = {
    "digits": _digits,
    "cifar10": _cifar,
    "cifar100": _cifar,
    "imagefolder": _imagefolder,
}
_TEXT: dict[str, Callable[[Path | None], tuple[bytes, bytes]]] = {
    "stdlib-text": _stdlib_text,
    "text": _text,
    "wikitext": _wikitext,
}
_ARGS = {"cifar10": "DIR", "cifar100": "DIR", "imagefolder": "DIR", "text": "PATH", "wikitext": "DIR"}
ACCEPTED = ", ".join(f"{n}:{_ARGS[n]}" if n in _ARGS else n for n in [*_IMAGE, *_TEXT])


def load_source(spec: str, seq_len: int = 64) -> DataSource:
    """The source a spec names (see ACCEPTED); ``seq_len`` is the text window before clipping to a model's context."""
    name, _, arg = spec.partition(":")
    if name not in _IMAGE and name not in _TEXT:
        raise DataError(f"unknown data source {spec!r}; accepted: {ACCEPTED}")
    if bool(arg) != (name in _ARGS):
        raise DataError(
            f"data source {spec!r}: write {name}:{_ARGS[name]}"
            if name in _ARGS
            else f"data source {name!r} takes no argument; got {spec!r}"
        )
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1; got {seq_len}")
    path = Path(arg).expanduser() if arg else None
    if path is not None and not path.exists():
        raise DataError(f"data source {spec!r}: {path} does not exist")
    if _ARGS.get(name) == "DIR" and not path.is_dir():
        raise DataError(f"data source {spec!r}: {path} is not a folder")
    try:
        if name in _IMAGE:
            return _IMAGE[name](spec, path)
        return TextSource(spec, *_TEXT[name](path), seq_len)
    except OSError as e:  # unreadable files: permissions, a folder that vanished, an I/O error
        raise DataError(f"data source {spec!r}: {e.filename or path}: {e.strerror or e}") from None

"""Text sources: UTF-8 bytes as tokens (ids 0..255, so any vocabulary of 256 or more takes
them with no tokenizer), from Python's own documentation, a file or folder of text, or
WikiText."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from graphkit.training.data.source import SPLITS, DataError, DataSource

TEXT_SUFFIXES = (".txt", ".tokens", ".raw", ".md")
WIKITEXT_FILES = (("wiki.train.tokens", "wiki.valid.tokens"), ("wiki.train.raw", "wiki.valid.raw"))


class TextSource(DataSource):
    """A UTF-8 byte stream per split; a batch is B random windows of T bytes (:meth:`window`),
    targets the same windows shifted by one."""

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
        length = self.window(config)
        short = [s for s in SPLITS if self.sizes[s] <= length]
        if short:
            raise DataError(
                f"{self.spec}: the {short[0]} split has {self.sizes[short[0]]:,} "
                f"bytes, too few for a window of {length} tokens plus target"
            )

    def window(self, config: Mapping[str, Any]) -> int:
        """The tokens in a window for the model ``config`` describes: ``seq_len``, at most its
        ``context`` (None: a model no position table bounds, Mamba's)."""
        return min(self.seq_len, config["context"] or self.seq_len)

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
        stream, length = self.tokens[split], self.window(config)
        starts = torch.randint(len(stream) - length, (batch_size, 1), generator=generator)
        windows = stream[starts + torch.arange(length + 1)].long()
        return windows[:, :-1], windows[:, 1:]


def held_out_tail(data: bytes) -> tuple[bytes, bytes]:
    """Train on the first 90% of a byte stream, evaluate on the last 10% (text the model never saw)."""
    cut = int(len(data) * 0.9)
    return data[:cut], data[cut:]


def stdlib_text(_: Path | None) -> tuple[bytes, bytes]:
    from pydoc_data.topics import topics  # noqa: PLC0415 (Python's own documentation, ~465K characters, read on use)

    return held_out_tail("\n".join(topics[k] for k in sorted(topics)).encode("utf-8"))


def text_file(path: Path) -> tuple[bytes, bytes]:
    if not path.is_dir():
        return held_out_tail(path.read_bytes())
    files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"no text files ({', '.join('*' + s for s in TEXT_SUFFIXES)}) under {path}")
    return held_out_tail(b"\n".join(p.read_bytes() for p in files))


def wikitext(folder: Path) -> tuple[bytes, bytes]:
    for d in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        for train, valid in WIKITEXT_FILES:
            if (d / train).is_file() and (d / valid).is_file():
                return (d / train).read_bytes(), (d / valid).read_bytes()
    raise DataError(
        f"no WikiText in {folder} or its subfolders (looked for {' or '.join(' + '.join(f) for f in WIKITEXT_FILES)})"
    )

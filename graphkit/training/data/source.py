"""What every data source is: random batches, per split, shaped for any model config of its
task, and the one error a source raises."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from graphkit.errors import DataError

SPLITS = ("train", "eval")


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


def fixed_split(n: int, train_fraction: float) -> tuple[Tensor, Tensor]:
    """A fixed permutation (seed 0) cut into train / eval indices, the same on every machine."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    return order[: int(n * train_fraction)], order[int(n * train_fraction) :]

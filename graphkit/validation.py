"""The checks every command, recipe, config and checkpoint runs on its values where they enter,
so a bad value fails in a second with one line naming it and what it accepts, before a dataset
is read or a file written.

The predicates (:func:`is_count`, :func:`is_number`, :func:`divisors`) say whether a value fits;
the caller words the error, as a recipe field, a config key or a file's entry need. The
``check_*`` functions word it themselves for command options (train-ghn, eval-ghn) and take the
error class to raise, so training reports a TrainError and evaluation an EvalError in the same
words.
"""

from __future__ import annotations

import math
import os
from typing import Any, TypeGuard

import torch

from graphkit.errors import GraphkitError

#: the environment variable naming the device train-ghn and eval-ghn use when --device is not given
DEVICE_VARIABLE = "GRAPHKIT_DEVICE"
#: seeds are combined with step and rank into one 64-bit generator seed; this keeps that in range
MAX_SEED = 2**32 - 1


def is_count(value: Any, least: int = 1, most: int | None = None) -> bool:
    """An integer from ``least`` to ``most`` (no bound when None); True and False are not
    integers here, though Python counts them as 1 and 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least and (most is None or value <= most)


def is_number(value: Any) -> TypeGuard[int | float]:
    """A finite int or float, not a bool (NaN compares false to everything, so a range test alone
    lets it through)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, in O(sqrt(n)): the K/V head counts ``n`` query heads can be
    grouped into."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _flag(name: str) -> str:
    return name.replace("_", "-")


def check_counts(config: Any, names: tuple[str, ...], error: type[GraphkitError], least: int = 1) -> None:
    """Each of ``config``'s fields ``names`` must be an integer >= ``least`` (a step count, a batch
    size; 0 where zero means "none")."""
    for name in names:
        value = getattr(config, name)
        if not is_count(value, least):
            raise error(f"{_flag(name)} must be an integer >= {least}; got {value!r}")


def check_number(name: str, value: Any, error: type[GraphkitError], *, positive: bool) -> None:
    """``value`` must be a finite number, > 0 if ``positive`` else >= 0 (NaN compares false to
    everything, so without this check it slips through every range test)."""
    if not is_number(value) or value < 0 or (positive and value == 0):
        raise error(f"{_flag(name)} must be {'a positive number' if positive else 'a number >= 0'}; got {value!r}")


def check_flag(name: str, value: Any, error: type[GraphkitError]) -> None:
    """``value`` must be true or false (a config.json or a caller can hand over 1 or "no")."""
    if not isinstance(value, bool):
        raise error(f"{_flag(name)} must be true or false; got {value!r}")


def check_seed(value: Any, error: type[GraphkitError]) -> None:
    """A seed is an integer from 0 to MAX_SEED."""
    if not is_count(value, 0, MAX_SEED):
        raise error(f"seed must be an integer from 0 to {MAX_SEED}; got {value!r}")


def check_device(device: str | None, error: type[GraphkitError]) -> None:
    """``device`` must be None (pick one), cpu, or a CUDA device this machine has."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise error(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise error(f"device {device!r}: no CUDA GPU is available here; use --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise error(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), cuda:0 to "
            f"cuda:{torch.cuda.device_count() - 1}"
        )


def default_device(error: type[GraphkitError], local_rank: int = 0) -> str:
    """The device of a run given no ``--device``: ``$GRAPHKIT_DEVICE`` when it is set (checked as
    ``--device`` is), else this process's GPU (``cuda:LOCAL_RANK``) if there is one, else cpu.

    Why the variable: a GPU machine otherwise moves every default run onto the GPU, tests
    included, where hundreds of tiny steps are slower than on the CPU; the test suite sets it to
    cpu and asks for cuda by name where it tests the GPU."""
    chosen = os.environ.get(DEVICE_VARIABLE)
    if chosen:
        try:
            check_device(chosen, error)
        except GraphkitError as e:
            raise error(f"${DEVICE_VARIABLE}: {e}") from None
        return chosen
    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"

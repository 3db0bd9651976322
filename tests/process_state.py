"""The process-wide state a test could change and leave changed for every later test: signal
handlers, the environment, the working directory, torch's threads, default dtype and device,
grad mode and deterministic algorithms, the multiprocessing start method, logging handlers and
warnings filters. ``tests/conftest.py``'s autouse fixture snapshots it before each test and fails
the test that changed it, then puts it back, so that one leak is reported where it happens and not
as a mysterious failure further on (a SIGINT left ignored here is inherited by every subprocess a
later test starts)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import warnings
from typing import Any

import torch


def _signals() -> dict[str, int]:
    """The signals whose handler Python can read (SIGKILL and SIGSTOP have none to change), by
    name (the real-time signals have none: SIG34, ...)."""
    found = {}
    for number in map(int, signal.valid_signals()):
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                found[signal.Signals(number).name] = number
            except ValueError:
                found[f"SIG{number}"] = number
    return found


#: loggers whose handlers their library installs anew whenever it sets its logging up (torch's
#: artifact loggers, ``torch.__trace`` and the like, each time torch._logging initialises; its
#: distributed checkpoint's ``c10d-NullHandler-dcp_logger``; transformers' continuous-batching
#: logger on first import): not a test's doing
OWN_HANDLERS = ("torch", "c10d", "ContinuousBatchingLogger")


def _logging_handlers() -> dict[str, tuple[logging.Handler, ...]]:
    """The handlers of every logger that has some, by logger name ("" for the root), but those of
    :data:`OWN_HANDLERS`."""
    loggers = {"": logging.getLogger(), **logging.Logger.manager.loggerDict}
    return {
        name: tuple(logger.handlers)
        for name, logger in loggers.items()
        if getattr(logger, "handlers", None) and not name.split(".")[0].startswith(OWN_HANDLERS)
    }


def snapshot() -> dict[str, Any]:
    """The process-wide state, by a name that says what it is."""
    return {
        "signal handlers": {name: signal.getsignal(n) for name, n in _signals().items()},
        "environment": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
        "working directory": os.getcwd(),
        "torch threads": torch.get_num_threads(),
        "torch default dtype": torch.get_default_dtype(),
        "torch default device": torch.get_default_device(),
        "torch grad mode": torch.is_grad_enabled(),
        "torch deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "multiprocessing start method": multiprocessing.get_start_method(allow_none=True),
        "logging handlers": _logging_handlers(),
        "warnings filters": list(warnings.filters),
    }


def _changed_keys(before: dict, after: dict) -> list[str]:
    return sorted(str(k) for k in before.keys() | after.keys() if before.get(k, "<unset>") != after.get(k, "<unset>"))


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed from ``before`` to ``after``, one line each, naming the item (the signal, the
    variable, the logger) where the state is a table."""
    lines = []
    for what, old in before.items():
        new = after[what]
        if old == new:
            continue
        if isinstance(old, dict):
            lines.append(f"{what} changed: {', '.join(_changed_keys(old, new))}")
        elif what == "warnings filters":
            lines.append(f"{what} changed: {len(old)} filters before, {len(new)} after")
        else:
            lines.append(f"{what} changed: {old!r} -> {new!r}")
    return lines


def restore(before: dict[str, Any]) -> None:
    """Put back the state ``before`` holds (what :func:`snapshot` read)."""
    numbers = _signals()
    for name, handler in before["signal handlers"].items():
        if handler is not None and signal.getsignal(numbers[name]) != handler:
            signal.signal(numbers[name], handler)
    for name in set(os.environ) - set(before["environment"]) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[name]
    os.environ.update(before["environment"])
    os.chdir(before["working directory"])
    torch.set_num_threads(before["torch threads"])
    torch.set_default_dtype(before["torch default dtype"])
    torch.set_default_device(before["torch default device"])
    torch.set_grad_enabled(before["torch grad mode"])
    torch.use_deterministic_algorithms(before["torch deterministic algorithms"])
    multiprocessing.set_start_method(before["multiprocessing start method"], force=True)
    handlers = before["logging handlers"]
    for name, now in _logging_handlers().items():
        if now != handlers.get(name, ()):
            logger = logging.getLogger(name or None)
            logger.handlers[:] = handlers.get(name, ())
    for name, old in handlers.items():
        logger = logging.getLogger(name or None)
        if tuple(logger.handlers) != old:
            logger.handlers[:] = old
    warnings.filters[:] = before["warnings filters"]
    getattr(warnings, "_filters_mutated", lambda: None)()  # a private hook: absent, the filters still apply

"""Worker processes that end with the command that started them, however it ends.

Every command that starts worker processes uses what is here: ``graphkit generate`` (a recipe's
tracing pool, a zoo's tracing processes) and ``eval-ghn`` (its fine-tuning pool). Training
starts none: train-ghn and finetune read their batches in their own process.

- SIGTERM, like Ctrl-C, unwinds the command where it stands (:func:`ended_by_sigterm`) instead
  of ending it there: the ``finally`` blocks that kill its workers (:func:`worker_pool`) and
  remove temporary files run before it exits (143; Ctrl-C: 130).
- A worker leaves SIGINT to its command (a terminal's Ctrl-C reaches the whole process group;
  the command stops its workers itself) and, on Linux, is killed by the kernel when the
  command's process ends, however it ends, SIGKILL included (``PR_SET_PDEATHSIG``,
  :func:`worker_started`): no worker outlives its command, holding a folder's lock, busy for
  minutes or blocked writing to a pipe nobody reads.

- A Ctrl-C that arrives while a worker starts waits for it, in both processes. A worker starts
  with SIGINT blocked (:func:`worker_context`) until :func:`worker_started` ignores it, so that no
  KeyboardInterrupt is raised in a worker before it is one (a traceback from the fork's own
  bookkeeping, a pool broken by a worker that died starting). The command holds Ctrl-C and SIGTERM
  back while its pool starts processes and threads (:func:`signals_deferred`) and raises them
  after, not midway, where the pool would be left half set up (a manager thread that cannot be
  joined, a lock released that was never taken). Measured (BENCHMARKS.md, "Ctrl-C while workers
  start"): a plain pool printed a traceback in 37 of 600 commands stopped as it started, this
  one in none.

The kernel's guarantee binds a child to its parent, so every worker is a child of the command:
forked, or spawned where the command's process must not fork (it has run autograd). Not the
``forkserver``: its workers are the server's children, and each holds the server's end of the
pipe that would tell it that the command ended, so a SIGKILLed command left the server and its
busy workers running (measured: they ran on for as long as their jobs did).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.context import BaseContext
from typing import Any

#: prctl's request for a signal when the parent ends (linux/prctl.h)
PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def ended_by_sigterm() -> Iterator[None]:
    """For the block, SIGTERM raises ``SystemExit(143)`` (128 + SIGTERM, the exit status a
    shell reports for it) where the command stands, as Ctrl-C raises KeyboardInterrupt, so that
    the command's ``finally`` blocks stop its workers before the process ends. Nothing is changed
    where the program installed its own SIGTERM handler, or outside the main thread (which alone
    receives signals)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """For the block, a Ctrl-C or SIGTERM that arrives is held back and raised when it ends (its
    handler's KeyboardInterrupt or ``SystemExit``), so that it lands where the command can unwind,
    not midway through bookkeeping that must not be interrupted. Only the signals that have a
    Python handler are held; outside the main thread (which alone receives them) nothing is
    changed. A block that raises discards the signal: an exception unwinds the command already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    handlers: dict[signal.Signals, Callable[[int, Any], Any]] = {}
    for held in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(held)
        if callable(handler):
            handlers[held] = handler
    for held in handlers:
        signal.signal(held, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for held, handler in handlers.items():
            signal.signal(held, handler)
    if arrived:
        handlers[signal.Signals(arrived[0])](arrived[0], None)


class _BlockedStart:
    """A process whose ``start`` blocks SIGINT in the starting thread, so that the new process,
    forked or spawned (a blocked signal stays blocked across exec), begins with it blocked: a
    Ctrl-C then waits in it until :func:`worker_started` ignores it, and in the command until the
    start returns."""

    def start(self) -> None:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            super().start()  # type: ignore[misc]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


if hasattr(signal, "pthread_sigmask"):  # POSIX: the classes are module-level, so a spawned one unpickles

    class _ForkedWorker(_BlockedStart, multiprocessing.context.ForkProcess):
        """A forked worker process that starts with SIGINT blocked."""

    class _SpawnedWorker(_BlockedStart, multiprocessing.context.SpawnProcess):
        """A spawned worker process that starts with SIGINT blocked."""

    class _ForkContext(multiprocessing.context.ForkContext):
        Process = _ForkedWorker

    class _SpawnContext(multiprocessing.context.SpawnContext):
        Process = _SpawnedWorker

    _CONTEXTS: dict[str, BaseContext] = {"fork": _ForkContext(), "spawn": _SpawnContext()}
else:  # pragma: no cover - Windows: no signal masks, and no Ctrl-C sent to a process group
    _CONTEXTS = {}


def worker_context(method: str) -> BaseContext:
    """The multiprocessing context of start method ``method`` ("fork" or "spawn") for worker
    processes: its processes start with SIGINT blocked (ignored and unblocked by
    :func:`worker_started`), so that a Ctrl-C sent to the process group while one starts does not
    raise in it before it has become a worker. Where signals cannot be blocked, the plain context."""
    return _CONTEXTS.get(method) or multiprocessing.get_context(method)


def worker_started(run: int) -> None:
    """The first thing a worker process does, in the worker, never in the command's own process:
    leave SIGINT to the command whose process id is ``run`` (its parent), let SIGTERM end the
    worker at once (a forked worker inherits the command's handler, which raises), and on Linux
    have the kernel kill it when the command's process ends. A worker whose command ended before
    the request was made exits at once. SIGINT, blocked while the worker started
    (:func:`worker_context`), is unblocked once ignored: a Ctrl-C that arrived meanwhile is dropped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl to call: the command's finally blocks still stop it
        return
    if os.getppid() != run:  # the command ended before the request was made: this is an orphan
        os._exit(1)


def _start_worker(run: int, initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    """A :func:`worker_pool` worker's initializer: :func:`worker_started`, then the pool's own."""
    worker_started(run)
    if initializer is not None:
        initializer(*initargs)


class _Pool(ProcessPoolExecutor):
    """A process pool whose ``submit``, which starts its processes and its manager thread as it
    needs them, holds Ctrl-C and SIGTERM back until it returns (:func:`signals_deferred`)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with signals_deferred():
            return super().submit(fn, *args, **kwargs)


@contextlib.contextmanager
def worker_pool(
    workers: int,
    *,
    fork: bool,
    initializer: Callable[..., object] | None = None,
    initargs: tuple[Any, ...] = (),
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``workers`` processes for the block, each a child of this
    process that ends with it (:func:`worker_started`, then ``initializer(*initargs)``):
    forked with ``fork`` where the platform forks (the workers inherit what this process has
    set up), else spawned (a fresh interpreter: safe after autograd has run here). When the
    block ends by an exception (Ctrl-C, SIGTERM under :func:`ended_by_sigterm`, an error, a
    generator closed early), the workers are killed, not awaited: their results are no longer
    wanted, and a busy one could take minutes."""
    methods = multiprocessing.get_all_start_methods()
    context = worker_context("fork" if fork and "fork" in methods else "spawn")
    others = set(multiprocessing.active_children())
    started = (os.getpid(), initializer, initargs)
    pool = _Pool(max_workers=workers, mp_context=context, initializer=_start_worker, initargs=started)
    try:
        yield pool
    except BaseException:
        for process in set(multiprocessing.active_children()) - others:
            process.kill()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


__all__ = ["ended_by_sigterm", "signals_deferred", "worker_context", "worker_started", "worker_pool"]

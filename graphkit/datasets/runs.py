"""What every dataset run shares, recipes and zoos alike: its folder's lock, and worker processes
that end with it.

- A run holds ``flock`` on ``.graphkit.lock`` in its folder while it writes there (the kernel
  releases it when the process ends, however it ends): a second run into the folder is refused in
  one line instead of tracing everything again and colliding with the first at the end.
- SIGTERM, like Ctrl-C, unwinds the run instead of ending it where it stands: the ``finally``
  blocks that stop the workers and remove temporary files run, and the folder is left as a resume
  expects (every file is written whole or not at all).
- A worker leaves SIGINT to its run (a terminal's Ctrl-C reaches the whole process group; the
  run stops its workers itself) and, on Linux, is killed by the kernel when the run's process
  ends, however it ends, SIGKILL included: no worker outlives its run, holding its lock or
  blocked writing to a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import GraphkitError

#: held (flock) by every run writing a dataset folder: exclusively by a plain run or a zoo,
#: shared by the shards of a recipe (graphkit.datasets.generate)
LOCK_FILE = ".graphkit.lock"
#: prctl's request for a signal when the parent ends (linux/prctl.h)
PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def flock(path: Path, mode: int, refusal: GraphkitError | None = None) -> Iterator[None]:
    """Hold the ``flock`` ``mode`` (LOCK_SH / LOCK_EX) on ``path`` for the block: wait for it,
    or with ``refusal``, raise that at once if another process holds a conflicting lock. With
    ``refusal`` (no process ever waits on the file), a lock file this call made is removed at the
    end when no other process holds it, so a run leaves its folder as it found it but for what it
    wrote (a refused run: exactly as it found it); a file others may be waiting on stays."""
    made = refusal is not None and not path.exists()
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, mode | (fcntl.LOCK_NB if refusal else 0))
        except BlockingIOError:
            raise refusal from None
        try:
            yield
        finally:
            if made:
                with contextlib.suppress(BlockingIOError):  # another run shares it: it stays for them
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    path.unlink(missing_ok=True)


def folder_lock(out: Path, error: type[GraphkitError], *, shared: bool = False) -> contextlib.AbstractContextManager:
    """The lock a run writing the dataset folder ``out`` holds for as long as it writes:
    exclusive, or ``shared`` with other runs that hold it shared (shards of one recipe). Refused
    at once, as ``error``, while another run holds it."""
    return flock(
        out / LOCK_FILE,
        fcntl.LOCK_SH if shared else fcntl.LOCK_EX,
        error(
            f"{out}: another graphkit generate is writing this folder; wait for it to finish, or choose another --out"
        ),
    )


@contextlib.contextmanager
def ended_by_sigterm() -> Iterator[None]:
    """For the block, SIGTERM raises ``SystemExit(143)`` (128 + SIGTERM, the exit status a
    shell reports for it) where the run stands, as Ctrl-C raises KeyboardInterrupt, so that the
    run's ``finally`` blocks stop its workers before the process ends. Nothing is changed where
    the program installed its own SIGTERM handler, or outside the main thread (which alone
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


def worker_started(run: int) -> None:
    """The first thing a worker process of the run whose process id is ``run`` does: leave
    SIGINT to the run, let SIGTERM end it at once (a forked worker inherits the run's handler,
    which raises), and on Linux have the kernel kill it when the run's process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl to call: the run's finally blocks still stop it
        return
    if os.getppid() != run:  # the run ended before the request was made
        os._exit(1)


__all__ = ["LOCK_FILE", "flock", "folder_lock", "ended_by_sigterm", "worker_started"]

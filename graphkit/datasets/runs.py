"""What every dataset run shares, recipes and zoos alike: its folder's lock. A run holds ``flock``
on ``.graphkit.lock`` in its folder while it writes there (the kernel releases it when the
process ends, however it ends): a second run into the folder is refused in one line instead of
tracing everything again and colliding with the first at the end. Its workers end with it, as
every command's do (:mod:`graphkit.workers`), so none holds the lock after the run.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from graphkit.errors import GraphkitError

#: held (flock) by every run writing a dataset folder: exclusively by a plain run or a zoo,
#: shared by the shards of a recipe (graphkit.datasets.generate)
LOCK_FILE = ".graphkit.lock"


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
            assert refusal is not None, "only a lock taken with a refusal does not wait"
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


__all__ = ["LOCK_FILE", "flock", "folder_lock"]

"""Commands run as a terminal runs them, stopped as a user stops them, and the processes they
leave: what the tests of worker processes share (tests/test_zoo_signals.py, tests/test_workers.py).
Processes are read from /proc: psutil is not a dependency."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from helpers import ROOT

from graphkit.workers import worker_started

#: how the shell reports each way a command is stopped: SIGTERM and Ctrl-C unwind it (143, 130),
#: SIGKILL ends it where it stands
STOPPED = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}
#: what a command's one line says stopped it (graphkit.cli.app.stopped_in_one_line)
STOPPED_BY = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # it ended while we read
            continue
        if ppid == pid:
            found.add(int(stat.parent.name))
    return found


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    found, todo = set(), [pid]
    while todo:
        below = children(todo.pop()) - found
        found |= below
        todo.extend(below)
    return found


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (ended, waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


#: the first lines of every script a test launches: Ctrl-C as a terminal's foreground command has
#: it. A command started in the background of a shell without job control (``make test &``, some
#: CI runners) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt in it nor in
#: anything it starts, pytest and the command under test included.
AS_IN_A_TERMINAL = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


@contextlib.contextmanager
def launcher(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen, set[int]]]]:
    """``launch(script, *args, ready=..., env=...)`` for the block: run the Python ``script``
    with ``args`` in a session of its own, as a terminal runs a command, and wait until
    ``ready()`` holds and it has at least two processes below it; the command and those
    processes. Whatever a failed test leaves running, the command or its workers, is killed
    after the block."""
    started = []

    def launch(
        script: str, *args: object, ready: Callable[[], bool], env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, set[int]]:
        path = tmp_path / f"run-{len(started)}.py"
        path.write_text(AS_IN_A_TERMINAL + script)
        run = subprocess.Popen(
            [sys.executable, str(path), *map(str, args)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(run)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            workers = descendants(run.pid) if ready() else set()
            if len(workers) >= 2:
                return run, workers
            time.sleep(0.2)
        run.kill()
        raise AssertionError(f"the command never had two workers busy: {run.communicate()}")

    try:
        yield launch
    finally:
        for run in started:  # the command's session: itself and any worker it left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.communicate()


def stop(run: subprocess.Popen, workers: set[int], signum: int) -> str:
    """Send ``signum`` as a user would (SIGINT, Ctrl-C, to the whole process group; SIGTERM
    and SIGKILL to the command alone, as ``kill`` does), check that the command ends as the
    shell expects (:data:`STOPPED`) and every worker within seconds; the command's stderr."""
    if signum == signal.SIGINT:
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    run.wait(timeout=60)
    deadline = time.monotonic() + 10  # the kernel delivers a SIGKILL to orphans asynchronously
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in workers), f"workers left running: {workers}"
    _, stderr = run.communicate(timeout=60)  # the pipes close when the last worker ends
    assert run.returncode == STOPPED[signum], stderr
    return stderr


def report_sigint(queue: Any, run: int) -> None:
    """A worker process's target (module-level, so a spawned one finds it): puts whether SIGINT
    was blocked as it started, then, after :func:`graphkit.workers.worker_started`, whether it
    is still blocked and whether it is ignored."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    worker_started(run)
    still = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    queue.put((blocked, still, signal.getsignal(signal.SIGINT) == signal.SIG_IGN))

"""Whether a Ctrl-C that lands while a command's workers start stops it cleanly: exit 130, no
traceback, within seconds. A command that starts a pool of two workers (forked, as ``graphkit
generate`` does, or spawned, as ``eval-ghn`` does) gets SIGINT sent to its process group, as a
terminal sends it, 0-4 ms after its first worker appears, with one core kept busy as under
pytest-xdist. ``graphkit.workers.worker_pool`` against the reference, the same pool as a plain
``ProcessPoolExecutor`` whose initializer is ``worker_started`` (graphkit's pool before Ctrl-C was
held back at a worker's start), in the same run.

    .venv/bin/python benchmarks/ctrl_c_at_start.py               # about 11 min on 2 cores
    .venv/bin/python benchmarks/ctrl_c_at_start.py --write       # and update BENCHMARKS.md
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: the command: a pool of two workers, each asked to sleep 30 s; argv: the pool ("graphkit" or
#: "reference") and the start method
COMMAND = """
import multiprocessing, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from graphkit.workers import worker_pool, worker_started

signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's foreground command has it
pool_kind, method = sys.argv[1:]
try:
    if pool_kind == "graphkit":
        with worker_pool(2, fork=method == "fork") as pool:
            list(pool.map(time.sleep, [30, 30]))
    else:  # graphkit's worker_pool before: kill the workers on an exception, then shut down
        context = multiprocessing.get_context(method)
        pool = ProcessPoolExecutor(2, mp_context=context, initializer=worker_started, initargs=(os.getpid(),))
        try:
            list(pool.map(time.sleep, [30, 30]))
        except BaseException:
            for process in multiprocessing.active_children():
                process.kill()
            raise
        finally:
            pool.shutdown(cancel_futures=True)
except KeyboardInterrupt:
    sys.exit(130)
"""


def first_child(pid: int, timeout: float = 30) -> bool:
    """Wait until process ``pid`` has a child; whether it did within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    return True
            except (OSError, IndexError, ValueError):
                continue
    return False


def outcome(pool: str, method: str, rng: random.Random) -> str:
    """One command stopped as its workers start: "clean", "traceback" or "hung" (not ended in 45 s)."""
    run = subprocess.Popen(
        [sys.executable, "-c", COMMAND, pool, method],
        cwd=common.ROOT,
        env={**os.environ, "PYTHONPATH": str(common.ROOT), "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first_child(run.pid)
    time.sleep(rng.random() * 0.004)
    os.killpg(run.pid, signal.SIGINT)
    try:
        _, stderr = run.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        return "hung"
    return "clean" if run.returncode == 130 and "Traceback" not in stderr else "traceback"


def table(args) -> str:
    rng = random.Random(0)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the other core, as under xdist
    start = time.perf_counter()
    try:
        rows = []
        for method in ("fork", "spawn"):
            counts = {}
            for pool in ("graphkit", "reference"):
                found = [outcome(pool, method, rng) for _ in range(args.runs)]
                counts[pool] = {kind: found.count(kind) for kind in ("clean", "traceback", "hung")}
            rows.append((method, counts))
    finally:
        busy.kill()
        busy.wait()
    minutes = (time.perf_counter() - start) / 60
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {common.cores()} CPU cores ({minutes:.1f} min), "
        f"{args.runs} commands per row, each sent SIGINT 0-4 ms after its first worker appeared.",
        "",
        "| workers | pool | stopped cleanly | with a traceback | hung |",
        "|---|---|---|---|---|",
    ]
    for method, counts in rows:
        for pool, label in (("graphkit", "`worker_pool`"), ("reference", "plain pool, `worker_started`")):
            found = counts[pool]
            lines.append(f"| {method}ed | {label} | {found['clean']} | {found['traceback']} | {found['hung']} |")
    return "\n".join(lines) + "\n"


def options(parser) -> None:
    parser.add_argument("--runs", type=int, default=300, help="commands per pool and start method (default 300)")


if __name__ == "__main__":
    common.main(__doc__, "ctrl_c_at_start", table, options)

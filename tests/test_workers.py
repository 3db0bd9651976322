"""Workers die with their command (issue 44, item 7): ``eval-ghn`` stopped by SIGTERM, Ctrl-C or
SIGKILL leaves no process behind and nothing in its --out folder, and every module that starts
processes does it through :mod:`graphkit.workers`. ``graphkit generate``'s runs are stopped in
tests/test_zoo_signals.py."""

from __future__ import annotations

import ast
import os
import signal
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT
from processes import STOPPED_BY, launcher, report_sigint, stop

from graphkit.datasets.generate import generate
from graphkit.workers import ended_by_sigterm, signals_deferred, worker_context

#: ``graphkit eval-ghn`` with two workers whose every fine-tuning marks itself busy in $BUSY, then
#: takes ten minutes: the command is stopped with both workers busy
EVAL_RUN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from graphkit.cli import main
    from graphkit.ghn import evaluate

    def slow(number):  # a function of the script, which a spawned worker imports by name
        Path(os.environ["BUSY"], str(os.getpid())).touch()
        time.sleep(600)

    if __name__ == "__main__":  # a spawned worker imports the script again: it must not run it
        evaluate._fine_tune_number = slow
        dataset, out = sys.argv[1:]
        sys.argv = ["graphkit", "eval-ghn", "--dataset", dataset, "--out", out, "--workers", "2"]
        sys.argv += ["--archs", "2", "--steps", "1", "--batch-size", "2"]
        main()
    """
)
#: the modules of the standard library and of torch that start processes
STARTS_PROCESSES = {"multiprocessing", "concurrent.futures", "subprocess", "torch.multiprocessing", "torch.utils.data"}
#: modules that start a process without graphkit.workers, and why that is right
ALLOWED = {
    # graphviz's dot, waited for by subprocess.run, which kills it when the command is interrupted
    "graphkit.draw": "subprocess",
}


@pytest.fixture(scope="module")
def gpts(tmp_path_factory):
    out = tmp_path_factory.mktemp("workers") / "tiny-gpts"
    generate(str(ROOT / "tests" / "recipes" / "tiny-gpts.json"), out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_a_stopped_evaluation_ends_its_workers_and_writes_nothing(signum, gpts, tmp_path):
    busy, out = tmp_path / "busy", tmp_path / "eval"
    busy.mkdir()
    with launcher(tmp_path) as launch:
        run, workers = launch(
            EVAL_RUN, gpts, out, ready=lambda: len(list(busy.iterdir())) == 2, env={"BUSY": str(busy)}
        )
        assert {int(p.name) for p in busy.iterdir()} <= workers
        stderr = stop(run, workers, signum)  # its workers, and the resource tracker of their pool
    assert "Traceback" not in stderr and not out.exists()
    if signum != signal.SIGKILL:
        assert "leaked" not in stderr  # the pool's semaphores were released, not left to the tracker
        assert stderr.splitlines()[-1] == (
            f"error: stopped by {STOPPED_BY[signum]}; its workers are stopped and nothing was written to {out}; "
            "run it again to evaluate"
        )


def imported(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, and its parents (``a.b.c``: a, a.b,
    a.b.c); ``from a import b`` names a.b too. Only the files that hold a word of
    :data:`STARTS_PROCESSES` (every way to import those modules spells one) are parsed."""
    text, names = path.read_text(), set()
    if not any(word in text for word in ("multiprocessing", "futures", "subprocess", "utils")):
        return names
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in found:
            parts = name.split(".")
            names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return names


def test_every_module_that_starts_processes_ends_them_with_its_command():
    """A module that can start processes (a pool, a forked process, a DataLoader's workers)
    starts them through graphkit.workers, whose workers end with their command however it
    ends; train-ghn and finetune read their data in their own process."""
    starting = {}
    for path in (ROOT / "graphkit").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names = imported(path)
        if names & STARTS_PROCESSES and name != "graphkit.workers" and "graphkit.workers" not in names:
            starting[name] = ", ".join(sorted(names & STARTS_PROCESSES))
    assert starting == ALLOWED


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_starts_with_ctrl_c_blocked_until_it_ignores_it(method):
    """A Ctrl-C to the process group while a worker starts must not raise in it before
    ``worker_started`` (measured: a traceback from the fork's bookkeeping, a broken pool): the
    worker starts with SIGINT blocked, and unblocks it once ignored; the command's mask is kept."""
    context = worker_context(method)
    queue = context.SimpleQueue()
    process = context.Process(target=report_sigint, args=(queue, os.getpid()))
    process.start()
    process.join(60)
    assert process.exitcode == 0 and queue.get() == (True, False, True)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_a_signal_held_back_while_a_pool_starts_is_raised_after_it(signum):
    """Ctrl-C and SIGTERM (under ``ended_by_sigterm``) that arrive inside ``signals_deferred``
    let the block finish, are raised as they would have been when it ends, and the handlers
    are the command's again."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest may run with it ignored
    finished = []
    try:
        with ended_by_sigterm():
            before = signal.getsignal(signum)
            with pytest.raises((KeyboardInterrupt, SystemExit)) as raised, signals_deferred():
                os.kill(os.getpid(), signum)
                for _ in range(1000):  # bytecode, at which a handler would run
                    pass
                finished.append(signal.getsignal(signum))
            after = signal.getsignal(signum)
        assert finished and finished[0] is not before and after is before
    finally:
        signal.signal(signal.SIGINT, handler)
    assert raised.type is (KeyboardInterrupt if signum == signal.SIGINT else SystemExit)
    assert signum == signal.SIGINT or raised.value.code == 143

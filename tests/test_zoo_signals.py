"""Dataset runs stop cleanly and lock their folder (issue 39, item 4): a signal to ``graphkit
generate`` ends every worker process and leaves the folder for ``--resume``; a second zoo run
into a folder is refused while the first holds it, as a second recipe run is."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT

from graphkit.datasets import zoo as zoo_module
from graphkit.datasets.runs import ended_by_sigterm
from graphkit.datasets.zoo import ZOOS, Zoo, ZooError, generate_zoo

#: a zoo of four models for ``graphkit generate``: "quick" fails to build at once (its outcome is
#: saved), the others build for ten minutes, so that the run is stopped with workers busy
ZOO_RUN = textwrap.dedent(
    """
    import sys, time
    from graphkit.cli import main
    from graphkit.datasets import zoo

    def build(config, device="meta"):
        if config["model"] == "quick":
            raise zoo.ZooError("quick: the library cannot build it")
        time.sleep(600)

    zoo.ZOOS["zoo-test"] = zoo.Zoo("zoo-test", "timm", "a test zoo", lambda: {names}, zoo.ZOOS["zoo-vits"].config)
    zoo.build_zoo_model = build
    zoo._warm_up = lambda: None
    sys.argv = ["graphkit", "generate", "zoo-test", "--out", sys.argv[1], "--workers", "2"]
    main()
    """
)
NAMES = ["quick", "slow-1", "slow-2", "slow-3"]
#: a recipe run whose every trace takes ten minutes: its pool's workers are busy when it is stopped
RECIPE_RUN = textwrap.dedent(
    """
    import sys, time
    from graphkit.cli import main
    from graphkit.datasets import generate

    def slow(keys):  # a function of the script, which a forked worker finds by name
        time.sleep(600)

    generate._trace_group = slow
    generate._warm_up = lambda: None
    sys.argv = ["graphkit", "generate", "gpts-1k", "--num", "4", "--out", sys.argv[1], "--workers", "2"]
    main()
    """
)


def unbuildable(config, device="meta"):
    raise ZooError(f"{config['model']}: the library cannot build it")


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (read from /proc: psutil is not a dependency)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # it ended while we read
            continue
        if ppid == pid:
            found.add(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (ended, waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def launch(tmp_path):
    """``launch(script, out, ready)``: :func:`start`; whatever a failed test leaves running, the
    run or its workers, is killed after it."""
    started = []

    def launch_one(script: str, out: Path, ready) -> tuple[subprocess.Popen, set[int]]:
        run, workers = start(script, out, tmp_path, ready)
        started.append(run)
        return run, workers

    yield launch_one
    for run in started:  # the run's session: itself and any worker it left behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.communicate()


def start(script: str, out: Path, tmp_path: Path, ready) -> tuple[subprocess.Popen, set[int]]:
    """Run ``script`` (``graphkit generate`` into ``out``) in a session of its own, as a terminal
    runs a command, and wait until it has two workers and ``ready()`` holds; the run and its
    workers."""
    path = tmp_path / "run.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(
        [sys.executable, str(path), str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        workers = children(run.pid) if ready() else set()
        if len(workers) >= 2:
            return run, workers
        time.sleep(0.2)
    run.kill()
    raise AssertionError(f"the run never had two workers busy: {run.communicate()}")


def stop(run: subprocess.Popen, workers: set[int], signum: int) -> str:
    """Send ``signum`` as a terminal would (SIGINT, Ctrl-C, to the whole process group; SIGTERM
    and SIGKILL to the run alone, as ``kill`` does), check that the run and every worker end; the
    run's stderr."""
    if signum == signal.SIGINT:
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    _, stderr = run.communicate(timeout=60)
    expected = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}
    assert run.returncode == expected[signum], stderr
    deadline = time.monotonic() + 10  # the kernel delivers a SIGKILL to orphans asynchronously
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in workers), f"workers left running: {workers}"
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_a_stopped_zoo_run_ends_its_workers_and_resumes(signum, tmp_path, monkeypatch, launch):
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: NAMES, ZOOS["zoo-vits"].config))
    monkeypatch.setattr(zoo_module, "_warm_up", lambda: None)
    monkeypatch.setattr(zoo_module, "build_zoo_model", unbuildable)
    out = tmp_path / "zoo"
    cache = out / zoo_module.CACHE_DIR
    run, workers = launch(ZOO_RUN.format(names=NAMES), out, lambda: any(cache.glob("quick-*.json")))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ZooError, match=f"^{out}: another graphkit generate is writing this folder; wait for it"):
        generate_zoo("zoo-test", out, resume=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    stderr = stop(run, workers, signum)
    assert "Traceback" not in stderr
    result = generate_zoo("zoo-test", out, resume=True, workers=2)  # the lock died with the run
    assert (result.resumed, result.traced, result.unbuildable) == (1, 3, 4) and not cache.exists()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_a_stopped_recipe_run_ends_its_pool(signum, tmp_path, launch):
    out = tmp_path / "gpts"
    run, workers = launch(RECIPE_RUN, out, lambda: (out / ".graphkit-run.json").is_file())
    assert "Traceback" not in stop(run, workers, signum)
    assert not list(out.rglob("*.tmp"))


def test_sigterm_unwinds_the_run_and_the_default_comes_back():
    with pytest.raises(SystemExit) as stopped, ended_by_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert stopped.value.code == 143 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

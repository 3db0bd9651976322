"""Dataset runs stop cleanly and lock their folder (issue 39, item 4): a signal to ``graphkit
generate`` ends every worker process and leaves the folder for ``--resume``; a second zoo run
into a folder is refused while the first holds it, as a second recipe run is."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
from processes import STOPPED_BY, launcher, stop

from graphkit.datasets import zoo as zoo_module
from graphkit.datasets.zoo import ZOOS, Zoo, ZooError, generate_zoo
from graphkit.workers import ended_by_sigterm

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

    zoo.ZOOS["zoo-test"] = zoo.Zoo("zoo-test", "timm", "a test zoo", lambda: {names})
    zoo.build_model = build
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


@pytest.fixture
def launch(tmp_path):
    """:func:`processes.launcher`'s ``launch`` for the test."""
    with launcher(tmp_path) as launch_one:
        yield launch_one


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_a_stopped_zoo_run_ends_its_workers_and_resumes(signum, tmp_path, monkeypatch, launch):
    monkeypatch.setitem(ZOOS, "zoo-test", Zoo("zoo-test", "timm", "a test zoo", lambda: NAMES))
    monkeypatch.setattr(zoo_module, "_warm_up", lambda: None)
    monkeypatch.setattr(zoo_module, "build_model", unbuildable)
    out = tmp_path / "zoo"
    cache = out / zoo_module.CACHE_DIR
    run, workers = launch(ZOO_RUN.format(names=NAMES), out, ready=lambda: any(cache.glob("quick-*.json")))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ZooError, match=f"^{out}: another graphkit generate is writing this folder; wait for it"):
        generate_zoo("zoo-test", out, resume=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    stderr = stop(run, workers, signum)
    assert "Traceback" not in stderr
    if signum != signal.SIGKILL:
        assert stderr.splitlines()[-1] == (
            f"error: stopped by {STOPPED_BY[signum]}; its workers are stopped and the outcomes saved are kept; "
            "run it again with --resume to finish the dataset"
        )
    result = generate_zoo("zoo-test", out, resume=True, workers=2)  # the lock died with the run
    assert (result.resumed, result.traced, result.unbuildable) == (1, 3, 4) and not cache.exists()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_a_stopped_recipe_run_ends_its_pool(signum, tmp_path, launch):
    out = tmp_path / "gpts"
    run, workers = launch(RECIPE_RUN, out, ready=lambda: (out / ".graphkit-run.json").is_file())
    stderr = stop(run, workers, signum)
    assert "Traceback" not in stderr and not list(out.rglob("*.tmp"))
    if signum != signal.SIGKILL:
        assert stderr.splitlines()[-1] == (
            f"error: stopped by {STOPPED_BY[signum]}; its workers are stopped and the parts written are kept; "
            "run it again with --resume to finish the dataset"
        )


def test_sigterm_unwinds_the_run_and_the_default_comes_back():
    with pytest.raises(SystemExit) as stopped, ended_by_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert stopped.value.code == 143 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

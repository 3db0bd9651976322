"""The suite's fixtures: process state every test must leave as it found it, and the session's
traced graphs. Shared builders and assertions live in helpers.py."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
from helpers import ExoticLM, gpt2, meta, timm_vit
from process_state import differences, restore, snapshot

import graphkit

# every run that picks its own device (train-ghn, eval-ghn) runs on the CPU, so a GPU machine runs
# the suite as a CPU one does; a test of the GPU names cuda itself (ON_GPU)
os.environ["GRAPHKIT_DEVICE"] = "cpu"


def _import_libraries() -> None:
    """Import the libraries graphkit loads lazily before any test runs: their imports add warnings
    filters and logging handlers, which would otherwise be charged to the first test that loads
    them (:func:`no_leaked_process_state`). The multiprocessing start method is read once for the
    same reason: the first read fixes the platform's default, which is no test's change."""
    import sklearn  # noqa: F401  (the digits data source; it sets KMP_* variables and filters on import)
    import timm  # noqa: F401
    import torch_geometric  # noqa: F401
    import transformers  # noqa: F401

    multiprocessing.get_start_method()


_import_libraries()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow run first, each group in its collection order: under pytest-xdist
    (``make test``) the workers then share the long tests at the start and even out on the short
    ones at the end, where a long test left last would keep one worker busy while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def no_leaked_process_state():
    """Every test leaves the process as it found it: signal handlers, environment, working
    directory, torch's threads, default dtype and device, grad mode and determinism, the
    multiprocessing start method, logging handlers and warnings filters
    (:mod:`process_state`). A test that changes one fails, naming what it changed, and the state is
    put back so that no later test runs in it (a SIGINT left ignored is inherited by every
    subprocess a later test starts)."""
    before = snapshot()
    yield
    changed = differences(before, snapshot())
    if changed:
        restore(before)
        pytest.fail("the test changed process-wide state and left it changed: " + "; ".join(changed), pytrace=False)


@pytest.fixture(scope="session")
def exotic_graph():

    return graphkit.trace(meta(ExoticLM), (torch.zeros(2, 6, dtype=torch.long, device="meta"),))


@pytest.fixture(scope="session")
def vit_graph():

    return graphkit.trace(timm_vit("vit_tiny_patch16_224", depth=3))


@pytest.fixture(scope="session")
def gpt2_graph():

    return graphkit.trace(gpt2())

"""The check behind conftest's ``no_leaked_process_state``: each kind of process-wide state a test
could leave changed is seen, named, and put back."""

from __future__ import annotations

import logging
import os
import signal
import warnings

import pytest
import torch
from process_state import differences, restore, snapshot


def _flip_sigint():
    # a process started in the background of a shell inherits SIGINT ignored
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.SIG_DFL if ignored else signal.SIG_IGN)


def _set_variable():
    os.environ["GRAPHKIT_PROCESS_STATE_TEST"] = "1"


def _one_thread():
    torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)


def _no_grad():
    torch.set_grad_enabled(False)


def _float64():
    torch.set_default_dtype(torch.float64)


def _handler():
    logging.getLogger().addHandler(logging.NullHandler())


def _filter():
    warnings.simplefilter("ignore")


def _chdir():
    os.chdir("/")


@pytest.mark.parametrize(
    "change, named",
    [
        (_flip_sigint, "signal handlers changed: SIGINT"),
        (_set_variable, "environment changed: GRAPHKIT_PROCESS_STATE_TEST"),
        (_one_thread, "torch threads changed"),
        (_no_grad, "torch grad mode changed: True -> False"),
        (_float64, "torch default dtype changed"),
        (_handler, "logging handlers changed: "),
        (_filter, "warnings filters changed"),
        (_chdir, "working directory changed"),
    ],
)
def test_a_change_is_named_and_put_back(change, named):
    before = snapshot()
    try:
        change()
        found = differences(before, snapshot())
    finally:
        restore(before)
    assert len(found) == 1 and found[0].startswith(named), found
    assert differences(before, snapshot()) == []


def test_an_unchanged_process_has_no_differences():
    assert differences(snapshot(), snapshot()) == []

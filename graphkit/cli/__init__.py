"""The graphkit command line (Typer): ``graphkit --help`` lists the commands."""

from graphkit.cli import datasets as _datasets  # noqa: F401  (registers generate, ls, show, stats, compile)
from graphkit.cli import ghn as _ghn  # noqa: F401  (registers train-ghn, predict, eval-ghn)
from graphkit.cli.app import app, main

__all__ = ["app", "main"]

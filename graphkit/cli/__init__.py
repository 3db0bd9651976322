"""The graphkit command line (Typer): ``graphkit --help`` lists the commands."""

from graphkit.cli.app import app, main

__all__ = ["app", "main"]

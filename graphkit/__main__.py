"""``python -m graphkit`` runs the CLI (what ``torchrun -m graphkit train-ghn ...`` needs)."""

from graphkit.cli import main

main()

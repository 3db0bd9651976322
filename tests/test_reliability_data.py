"""Issue #12, datasets: bad recipes and options are refused in one line before anything is
written, output folders that are not ours are never touched, concurrent runs are locked out,
and an interrupted or damaged dataset resumes to exactly what an uninterrupted run makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from graphkit.cli import app

runner = CliRunner()

BASE = {"name": "mini", "family": "vit", "max_params": 3_000_000, "bins": [{"layers": [1, 2], "hidden": [32, 64, 32]}],
        "heads": [{"choices": [2]}], "fixed": {"image_size": 8, "patch_size": 4}, "eval_fraction": 0.25, "num": 6}


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: compared before and after a refused command."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def recipe_file(folder: Path, **changes) -> Path:
    path = folder / "recipe.json"
    path.write_text(json.dumps({**BASE, **changes}))
    return path


def refused(args, message: str):
    """Run a command that must fail with exactly ``error: message`` and exit code 1."""
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: {message}"
    return result


# -- 1, 2: recipes ------------------------------------------------------------------------------

def test_recipe_name_cannot_escape_the_working_folder(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    recipe = recipe_file(work, name="../../escaped-ds")
    before = listing(tmp_path)
    refused(["generate", recipe], "recipe name must be an identifier of at most 100 letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, without '..' (it names the output folder); got '../../escaped-ds'")
    assert listing(tmp_path) == before and not (tmp_path / "escaped-ds").exists()


@pytest.mark.parametrize("changes,message", [
    ({"bins": [{"layers": [1, 2], "hidden": [32, 64, 0]}]},
     "bins[0].hidden must be a list (low, high, step) of integers with 1 <= low <= high <= 1,000,000 and step >= 1; got (32, 64, 0)"),
    ({"bins": [{"layers": [-1, 2], "hidden": [32, 64, 32]}]},
     "bins[0].layers must be a list (low, high) of integers with 1 <= low <= high; got (-1, 2)"),
    ({"heads": [{"choices": [0]}]}, 'heads[0].choices must be "divisors" or a non-empty list of integers >= 1; got (0,)'),
    ({"heads": [{"choices": [2], "min_head_dim": 0}]}, "heads[0].min_head_dim must be an integer >= 1; got 0"),
    ({"eval_fraction": 5}, "eval_fraction must be a number in [0, 1); got 5"),
    ({"max_params": "lots"}, "max_params must be an integer >= 1; got 'lots'"),
    ({"max_params": -5}, "max_params must be an integer >= 1; got -5"),
    ({"num": 0}, "num must be an integer in 1..1,000,000; got 0"),
    ({"fixed": {"image_size": -8}}, "fixed must be a mapping of config keys to null, true/false, strings or finite numbers >= 0; got {'image_size': -8}"),
    ({"sliding_window": [0]}, "sliding_window must be a non-empty list of null or integers >= 1; got (0,)"),
    ({"attention": ["mqa"]}, "attention must be a non-empty list of null or gqa, kdgqa, dgqa, pgqa; got ('mqa',)"),
    ({"kv_heads": "all"}, "kv_heads must be null or \"divisors\"; got 'all'"),
    ({"bins": "wide"}, "bins must be a non-empty list of mappings with keys layers, hidden; got 'wide'"),
    ({"bins": [{"layers": [1, 2]}]}, "bins[0]: missing field 'hidden'"),
    ({"heads": [{"choices": [2], "size": 3}]}, "heads[0]: unknown field 'size'; accepted fields: choices, hidden, min_head_dim"),
    ({"family": "rnn"}, "family: unknown family 'rnn'; known families: gpt2, llama, vit"),
    ({"hidden": [8]}, "unknown field 'hidden'; accepted fields: name, family, bins, heads, max_params, fixed, kv_heads, "
                      "sliding_window, attention, eval_fraction, num, description"),
    # the space is bounded before it is enumerated: these used to hang
    ({"bins": [{"layers": [1, 2], "hidden": [8, 2000000, 8]}]},
     "bins[0].hidden must be a list (low, high, step) of integers with 1 <= low <= high <= 1,000,000 and step >= 1; got (8, 2000000, 8)"),
    ({"bins": [{"layers": [1, 9], "hidden": [8, 200000, 8]}]},
     "bins span 225,000 (layers, hidden) pairs, more than the 10,000 a space may enumerate; use larger hidden steps or fewer layers"),
    ({"bins": [{"layers": [1, 4], "hidden": [8, 8000, 8]}], "heads": [{"choices": "divisors"}]},
     "bins and heads give 74,824 candidate architectures, more than the 10,000 a space may enumerate; "
     "use larger hidden steps, fewer layers or fewer head choices"),
])
def test_bad_recipe_fields_are_named(changes, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = recipe_file(tmp_path, **changes)
    refused(["generate", recipe], f"recipe 'mini': {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.json"]

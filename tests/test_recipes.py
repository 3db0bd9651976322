"""Recipes: the paper's search spaces, declared as data, and how records are drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphkit.datasets.recipes import RECIPES, Recipe, RecipeError, get_recipe
from graphkit.families import num_params

HERE = Path(__file__).resolve().parent


def test_vits_1k_follows_the_paper():
    space = RECIPES["vits-1k"].space
    assert len(space) == 80  # every (L, D, H) the rules allow; see the recipe docs
    for c in space:
        L, D, H = c["num_layers"], c["hidden"], c["heads"]
        low, high = (128, 256) if L > 5 else (256, 384) if L >= 4 else (384, 512)
        assert 3 <= L <= 9 and low <= D <= high and D % 32 == 0 and D % H == 0
        assert H in ((3, 6, 12) if D in (192, 288, 384, 480) else (4, 8))
        assert c["mlp"] == 4 * D and (c["image_size"], c["patch_size"], c["num_classes"]) == (32, 2, 10)
        assert num_params(c) < 10_000_000


def test_gpts_1k_follows_the_paper():
    space = RECIPES["gpts-1k"].space
    assert len(space) == 893
    for c in space:
        L, D = c["num_layers"], c["hidden"]
        low, high = (72, 176) if L > 5 else (128, 176) if L >= 4 else (176, 256)
        assert 3 <= L <= 9 and low <= D <= high and D % 8 == 0 and D % c["heads"] == 0
        assert (c["vocab_size"], c["context"], c["tied"]) == (50257, 1024, False)
    assert max(num_params(c) for c in space) < 30_000_000


def test_llamas_1k_has_gqa_and_windows():
    space = RECIPES["llamas-1k"].space
    assert {c["heads"] % c["kv_heads"] for c in space} == {0}
    assert {c["kv_heads"] == c["heads"] for c in space} == {True, False}
    assert {c["sliding_window"] for c in space} == {None, 256}
    assert all((c["hidden"] // c["heads"]) % 2 == 0 for c in space)


def test_sampling_is_deterministic_and_covers_the_space_before_repeating():
    recipe = Recipe.from_file(HERE / "recipes" / "tiny-vits.json")
    records = recipe.sample(seed=3)
    assert records == recipe.sample(seed=3) and records != recipe.sample(seed=4)
    assert len(records) == 30 and records[0][0] == "tiny-vits-00000"
    first_pass = [str(sorted(c.items())) for _, c, _ in records[: len(recipe.space)]]
    assert len(set(first_pass)) == len(recipe.space) == 18


def test_eval_architectures_are_never_trained_on():
    records = RECIPES["vits-1k"].sample(1000, seed=0)
    key = lambda c: (c["num_layers"], c["hidden"], c["heads"])  # noqa: E731
    train = {key(c) for _, c, s in records if s == "train"}
    held_out = {key(c) for _, c, s in records if s == "eval"}
    assert held_out and not train & held_out and len(held_out) == 8  # 10% of 80 architectures


def test_recipe_files_and_errors(tmp_path):
    assert get_recipe(str(HERE / "recipes" / "tiny-llamas.yaml")).space
    assert Recipe.from_dict(RECIPES["vits-1k"].to_dict()) == RECIPES["vits-1k"]
    with pytest.raises(RecipeError, match="unknown recipe 'vits-2k'; known recipes: gpts-1k, llamas-1k, vits-1k, vits-digits"):
        get_recipe("vits-2k")
    with pytest.raises(RecipeError, match="nope.json: no such recipe file"):
        get_recipe(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "bad", "family": "vit"}')
    with pytest.raises(RecipeError, match="recipe 'bad': missing field 'bins'"):
        get_recipe(str(bad))
    empty = Recipe.from_dict({**RECIPES["vits-1k"].to_dict(), "name": "empty", "max_params": 10})
    with pytest.raises(RecipeError, match="recipe 'empty': no architecture fits"):
        empty.space
    with pytest.raises(RecipeError, match="num must be at least 1"):
        RECIPES["vits-1k"].sample(0)

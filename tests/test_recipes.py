"""Recipes: the paper's search spaces, declared as data, and how records are drawn from them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from graphkit.datasets.recipes import RECIPES, Recipe, RecipeError, get_recipe
from graphkit.families import num_params

HERE = Path(__file__).resolve().parent


def test_vits_1k_follows_the_paper():
    space = RECIPES["vits-1k"].space
    assert len(space) == 160  # every (L, D, H) the rules allow (80), each with patch 2 and 4; see the recipe docs
    for c in space:
        L, D, H = c["num_layers"], c["hidden"], c["heads"]
        low, high = (128, 256) if L > 5 else (256, 384) if L >= 4 else (384, 512)
        assert 3 <= L <= 9 and low <= D <= high and D % 32 == 0 and D % H == 0
        assert H in ((3, 6, 12) if D in (192, 288, 384, 480) else (4, 8))
        assert c["mlp"] == 4 * D and (c["image_size"], c["num_classes"]) == (32, 10) and c["patch_size"] in (2, 4)
        assert num_params(c) < 10_000_000
    by_patch = {p: {(c["num_layers"], c["hidden"], c["heads"]) for c in space if c["patch_size"] == p} for p in (2, 4)}
    assert len(by_patch[2]) == 80 and by_patch[2] == by_patch[4]


def test_vits_digits_keeps_the_space_the_bundled_hypernetwork_trained_on():
    space = RECIPES["vits-digits"].space
    assert len(space) == 80 and {(c["image_size"], c["patch_size"]) for c in space} == {(8, 2)}
    assert "choices" not in RECIPES["vits-digits"].to_dict()  # its manifests read as before the field existed


def test_vits_digits_grids24_is_the_vits_digits_space_at_two_token_grids():
    """Patch 2 and 4 at 8 px (token grids 4 x 4 and 2 x 2) over the very architectures of
    vits-digits, so that a run on it differs from the bundled one in the grids alone."""
    shape = lambda c: (c["num_layers"], c["hidden"], c["heads"], c["mlp"])  # noqa: E731
    digits = {shape(c) for c in RECIPES["vits-digits"].space}
    space = RECIPES["vits-digits-grids24"].space
    assert len(space) == 160 and {c["image_size"] for c in space} == {8}
    assert {p: {shape(c) for c in space if c["patch_size"] == p} for p in (2, 4)} == {2: digits, 4: digits}


def test_gpts_1k_follows_the_paper():
    space = RECIPES["gpts-1k"].space
    assert len(space) == 2 * 893  # every shape twice: the head tied to the token embedding, or not
    for c in space:
        L, D = c["num_layers"], c["hidden"]
        low, high = (72, 176) if L > 5 else (128, 176) if L >= 4 else (176, 256)
        assert 3 <= L <= 9 and low <= D <= high and D % 8 == 0 and D % c["heads"] == 0
        assert (c["vocab_size"], c["context"]) == (50257, 1024)
    untied = [{k: v for k, v in c.items() if k != "tied"} for c in space if not c["tied"]]
    assert untied == [{k: v for k, v in c.items() if k != "tied"} for c in space if c["tied"]]
    assert max(num_params(c) for c in space) < 30_000_000


def test_llamas_1k_has_gqa_and_windows():
    space = RECIPES["llamas-1k"].space
    assert {c["heads"] % c["kv_heads"] for c in space} == {0}
    assert {c["kv_heads"] == c["heads"] for c in space} == {True, False}
    assert {c["sliding_window"] for c in space} == {None, 256}
    assert sum(c["tied"] for c in space) * 2 == len(space)
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
    key = lambda c: (c["num_layers"], c["hidden"], c["heads"], c["patch_size"])  # noqa: E731
    train = {key(c) for _, c, s in records if s == "train"}
    held_out = {key(c) for _, c, s in records if s == "eval"}
    assert held_out and not train & held_out and len(held_out) == 16  # 10% of 160 architectures


def test_recipe_files_and_errors(tmp_path):
    assert get_recipe(str(HERE / "recipes" / "tiny-llamas.yaml")).space
    assert Recipe.from_dict(RECIPES["vits-1k"].to_dict()) == RECIPES["vits-1k"]
    with pytest.raises(
        RecipeError,
        match="unknown recipe .vits-2k.; known recipes: gpts-1k, llamas-1k, vits-1k, vits-digits, vits-digits-grids24",
    ):
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


def test_choices_multiply_the_space_and_round_trip(tmp_path):
    data = json.loads((HERE / "recipes" / "tiny-vits.json").read_text())
    data["fixed"] = {"image_size": 16}
    data["choices"] = {"patch_size": [2, 4], "global_pool": ["token", "avg"]}
    recipe = Recipe.from_dict(data)
    assert len(recipe.space) == 4 * 18
    assert {(c["patch_size"], c["global_pool"]) for c in recipe.space} == {
        (2, "token"),
        (2, "avg"),
        (4, "token"),
        (4, "avg"),
    }
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    file = tmp_path / "r.yaml"
    file.write_text(yaml.safe_dump(data))
    assert Recipe.from_file(file) == recipe
    assert Recipe.from_dict(RECIPES["vits-1k"].to_dict()).to_dict()["choices"] == {"patch_size": [2, 4]}


@pytest.mark.parametrize(
    "choices, message",
    [
        (
            [2, 4],
            "choices must be a mapping of config keys to non-empty lists of distinct null, true/false, strings or "
            "finite numbers >= 0; got (2, 4)",
        ),
        ({"patch_size": []}, "choices must be a mapping of config keys to non-empty lists"),
        ({"patch_size": 4}, "choices must be a mapping of config keys to non-empty lists"),
        ({"patch_size": [2, 2]}, "choices must be a mapping of config keys to non-empty lists of distinct"),
        ({"patch_size": [2, -4]}, "choices must be a mapping"),
        ({"patch_size": [2, float("nan")]}, "choices must be a mapping"),
        ({"patch_size": [[2]]}, "choices must be a mapping"),
        ({"image_size": [16, 32]}, "choices key 'image_size' is also in fixed; a config key is either fixed or chosen"),
        (
            {"hidden": [64]},
            "choices key 'hidden' is drawn by the recipe's own fields; choices takes the family's other "
            "config keys (not family, num_layers, hidden, heads, attention, kv_heads, sliding_window)",
        ),
        ({"colour": ["red"]}, "vit config: unknown key 'colour'"),
        ({"patch_size": [3]}, "vit config: image_size 16 is not divisible by patch_size 3"),
        (
            {"mlp": [0.5]},
            "vit config: mlp must be an integer >= 1 (the MLP's hidden width in units, not a ratio: a 4x MLP "
            "is mlp = 4 * hidden); got 0.5",
        ),
        ({"mlp": [2.0]}, "vit config: mlp must be an integer >= 1 (the MLP's hidden width in units, not a ratio"),
        ({"global_pool": [3]}, "vit config: global_pool must be a string; got 3"),
        ({"num_classes": [True]}, "vit config: num_classes must be an integer >= 1; got True"),
    ],
)
def test_bad_choices_are_refused_naming_the_field(choices, message):
    data = {
        **json.loads((HERE / "recipes" / "tiny-vits.json").read_text()),
        "fixed": {"image_size": 16},
        "choices": choices,
    }
    with pytest.raises(RecipeError, match=re.escape(f"recipe 'tiny-vits': {message}")):
        Recipe.from_dict(data).space


@pytest.mark.parametrize(
    "family, field, value, accepted",
    [
        ("gpt2", "choices", {"tied": ["no", "yes"]}, "tied must be true or false; got 'no'"),
        ("gpt2", "fixed", {"context": 0}, "context must be an integer >= 1; got 0"),
        ("llama", "fixed", {"rms_eps": 0}, "rms_eps must be a finite number > 0; got 0"),
    ],
)
def test_config_values_of_the_wrong_type_are_refused_before_a_library_sees_them(family, field, value, accepted):
    """transformers' own check once answered ``tied: ["no", "yes"]`` with a two-line
    StrictDataclassFieldValidationError."""
    data = {
        "name": "typed",
        "family": family,
        "max_params": 10**8,
        "bins": [{"layers": [2, 2], "hidden": [64, 64, 8]}],
        "heads": [{"choices": [4]}],
        field: value,
    }
    with pytest.raises(RecipeError, match=re.escape(f"recipe 'typed': {family} config: {accepted}")):
        Recipe.from_dict(data).space


def test_choices_count_towards_the_candidate_limit():
    data = {
        **json.loads((HERE / "recipes" / "tiny-vits.json").read_text()),
        "fixed": {"image_size": 16},
        "choices": {"num_classes": list(range(1, 1001))},
    }
    with pytest.raises(
        RecipeError, match="bins, heads and choices give 18,000 candidate architectures, more than the 10,000"
    ):
        Recipe.from_dict(data).space

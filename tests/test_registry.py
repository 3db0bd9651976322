"""One family, one place: a family registered in one call reaches recipes, the hypernetwork's
data and checkpoints, and attention conversion."""

import dataclasses

import pytest

from graphkit.attention.convert import ADAPTERS, TIMM_ATTENTION
from graphkit.datasets.recipes import RECIPES, get_recipe
from graphkit.families import FAMILIES, build_model, get_family, register_family
from graphkit.ghn import BUNDLED
from graphkit.training.data import DEFAULT_SOURCES, default_source

RECIPE = {
    "name": "wide-vits",
    "family": "wide-vit",
    "bins": [{"layers": [2, 3], "hidden": [64, 128, 64]}],
    "heads": [{"choices": [2, 4]}],
    "max_params": 2_000_000,
    "num": 10,
}


@pytest.fixture
def wide_vit():
    """A new family declared the way families/vit.py declares ViTs, removed afterwards."""
    adapter = dataclasses.replace(TIMM_ATTENTION, claims=lambda module: TIMM_ATTENTION.claims(module))  # its own
    family = dataclasses.replace(
        get_family("vit"),
        name="wide-vit",
        mlp_ratio=8.0,
        recipes=(RECIPE,),
        data="digits",
        bundled_ghn="logah-tiny-vits",
        attention_adapter=adapter,
        traced_as=(),
    )
    register_family(family)
    yield family
    del FAMILIES["wide-vit"]
    ADAPTERS.remove(adapter)


def test_one_registration_reaches_every_table(wide_vit):
    assert "wide-vits" in RECIPES and get_recipe("wide-vits").family == "wide-vit"
    assert {c["hidden"] for _, c, _ in get_recipe("wide-vits").sample(10, seed=0)} <= {64, 128}
    assert default_source("wide-vit") == DEFAULT_SOURCES["wide-vit"] == "digits"
    assert BUNDLED["wide-vit"] == "logah-tiny-vits"
    assert ADAPTERS.count(wide_vit.attention_adapter) == 1 and ADAPTERS[-1] is wide_vit.attention_adapter
    model = build_model(
        {"family": "wide-vit", "num_layers": 2, "hidden": 64, "heads": 2, "attention": "gqa", "kv_heads": 1}
    )
    assert model.blocks[0].mlp.fc1.out_features == 512 and model.blocks[0].attn.core.kv_heads == 1


def test_tables_are_live_views():
    before = set(RECIPES), dict(BUNDLED), dict(DEFAULT_SOURCES)
    assert before == (
        {"vits-1k", "vits-digits", "gpts-1k", "llamas-1k"},
        {"vit": "logah-tiny-vits", "gpt2": "logah-tiny-gpts", "llama": "logah-tiny-llamas"},
        {"vit": "digits", "gpt2": "stdlib-text", "llama": "stdlib-text"},
    )
    register_family(
        dataclasses.replace(
            get_family("gpt2"),
            name="gpt2-copy",
            recipes=(),
            data=None,
            bundled_ghn=None,
            attention_adapter=None,
            traced_as=(),
        )
    )
    try:
        assert (set(RECIPES), dict(BUNDLED), dict(DEFAULT_SOURCES)) == before  # nothing declared, nothing added
    finally:
        del FAMILIES["gpt2-copy"]
    with pytest.raises(KeyError):
        BUNDLED["gpt2-copy"]

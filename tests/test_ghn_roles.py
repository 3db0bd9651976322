"""Role maps: each parameter role decodes through its own first rows of the r -> K map."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers import gpt2, llama, meta

import graphkit
from graphkit.families import build_model
from graphkit.ghn import PredictError, predict
from graphkit.ghn.checkpoint import load_checkpoint, save_checkpoint
from graphkit.ghn.config import LoGAHConfig, VariantError
from graphkit.ghn.encoding import frequent_roles, role_of, roles_of, targets
from graphkit.ghn.model import LoGAH

CONFIGS = (
    dict(family="gpt2", num_layers=2, hidden=96, heads=2, vocab_size=300),
    dict(family="vit", num_layers=2, hidden=80, heads=2, image_size=8, patch_size=2),
    dict(family="llama", num_layers=2, hidden=64, heads=4, kv_heads=2, vocab_size=200),
)


@pytest.mark.parametrize(
    "name, role",
    [
        ("transformer.h.11.attn.c_attn.weight", "transformer.h.attn.c_attn.weight"),
        ("blocks.3.mlp.fc1.bias", "blocks.mlp.fc1.bias"),
        ("model.layers.0.self_attn.k_proj.weight", "model.layers.self_attn.k_proj.weight"),
        ("transformer.wte.weight", "transformer.wte.weight"),
        ("stages.1.blocks.2.norm1.weight", "stages.blocks.norm1.weight"),
        ("pos_embed", "pos_embed"),
    ],
)
def test_a_role_is_the_name_without_block_indices(name, role):
    assert role_of(name) == role


@pytest.fixture(scope="module")
def graphs():
    return [graphkit.trace(build_model(c)) for c in CONFIGS]


def pair(graphs, role_rows: int) -> tuple[LoGAH, LoGAH]:
    """A LoGAH with one shared map (K = 64, so that wide parameters span several chunks) and the
    same LoGAH with role maps for every role of ``graphs`` but the ViT's qkv weight."""
    torch.manual_seed(0)
    shared = LoGAH(LoGAHConfig(max_mask=64)).eval()
    roles = sorted({role_of(t.name) for g in graphs for t in targets(g)} - {"blocks.attn.qkv.weight"})
    with_roles = LoGAH(LoGAHConfig(max_mask=64, roles=tuple(roles), role_rows=role_rows)).eval()
    assert with_roles.load_state_dict(shared.state_dict(), strict=False).missing_keys == ["decoder.role_maps"]
    return shared, with_roles


def test_role_maps_replace_the_shared_maps_first_rows(graphs):
    """Role maps that hold the shared map's own first rows decode exactly as the shared map does,
    chunked parameters and parameters longer than ``role_rows`` (which keep the shared rows
    beyond them) included."""
    shared, with_roles = pair(graphs, role_rows=40)
    assert with_roles.decoder.role_maps.shape == (len(with_roles.config.roles), 40, 32)
    with torch.no_grad():
        with_roles.decoder.role_maps.copy_(shared.decoder.low_rank.weight[:40].expand_as(with_roles.decoder.role_maps))
        before = shared([shared.encode(g) for g in graphs])
        after = with_roles([with_roles.encode(g) for g in graphs])
    for a, b in zip(before, after):
        assert a.keys() == b.keys() and all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)


@pytest.mark.parametrize("role_rows", [40, 4096])  # shorter than some parameters (one cat) and longer than all
def test_each_role_decodes_through_its_own_map(graphs, role_rows):
    """A role map changes its own role's parameters and no other; batched, one
    graph alone, and block by block into a model's tensors all agree; the norms training
    penalises are those of the decoded parameters; a role without a map keeps the shared one."""
    shared, with_roles = pair(graphs, role_rows)
    with torch.no_grad():
        before = shared([shared.encode(g) for g in graphs])
    encoded = [with_roles.encode(g) for g in graphs]
    out = with_roles(encoded, details=True)
    explicit = torch.stack([sum(p.norm() for p in params.values()) for params in out.params])
    assert torch.allclose(out.norms, explicit, rtol=1e-5)
    changed = set()
    for graph, e, a, b in zip(graphs, encoded, before, out.params):
        for t, role in zip(e.targets, e.roles):
            assert (role == 0) == (role_of(t.name) == "blocks.attn.qkv.weight")
            if not torch.allclose(a[t.name], b[t.name], atol=1e-6):
                changed.add(t.name)
        with torch.no_grad():
            alone = with_roles.predict(graph)
            decoding = with_roles.decoding(graph)
            assert decoding.first_non_finite() is None
            written = decoding.write_into({t.name: torch.empty(t.shape) for t in e.targets})
        for name in alone:
            assert torch.allclose(alone[name], b[name], atol=1e-5) and torch.allclose(written[name], b[name], atol=1e-5)
    every = {t.name for g in graphs for t in targets(g)}
    assert changed == {n for n in every if role_of(n) != "blocks.attn.qkv.weight"}
    torch.manual_seed(1)
    loss = sum((p * torch.randn_like(p)).sum() for params in out.params for p in params.values())
    (grad,) = torch.autograd.grad(loss, [with_roles.decoder.role_maps])
    assert (grad.flatten(1).norm(dim=1) > 0).all()  # every role's map is trained


def test_a_nan_in_a_role_map_is_caught_before_anything_is_written(graphs):

    _, with_roles = pair(graphs, role_rows=40)
    role = with_roles.config.roles.index("transformer.h.mlp.c_fc.weight")
    with torch.no_grad():
        with_roles.decoder.role_maps[role, 3, 0] = float("nan")
    model = build_model(CONFIGS[0])
    with pytest.raises(PredictError, match="'transformer.h.0.mlp.c_fc.weight'"):
        predict(model, with_roles)
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize(
    "roles, decoder, message",
    [
        (("a.weight", "a.weight"), "low_rank", "roles must be distinct parameter names"),
        (("",), "low_rank", "roles must be distinct parameter names"),
        (("a.weight",), "ghn3", "role maps need the low_rank decoder, not 'ghn3'"),
    ],
)
def test_bad_roles_are_refused(roles, decoder, message):
    with pytest.raises(VariantError, match=message):
        LoGAHConfig(roles=roles, decoder=decoder)


@pytest.mark.parametrize(
    "name, role",
    [
        ("transformer.h.11.attn.c_attn.weight", "c_attn.weight"),
        ("model.layers.0.self_attn.q_proj.weight", "q_proj.weight"),
        ("model.decoder.layers.3.fc1.bias", "fc1.bias"),
        ("blocks.0.mlp.0.weight", "mlp.weight"),  # a Sequential's index is no module name
        ("lm_head.weight", "lm_head.weight"),
        ("pos_embed", "pos_embed"),
    ],
)
def test_a_leaf_role_is_the_last_module_name_and_the_parameter(name, role):
    assert role_of(name, "leaf") == role == role_of(name, "layer")


@pytest.mark.parametrize(
    "name, role",
    [
        ("model.layers.0.self_attn.q_proj.linear.weight", "q_proj.weight"),  # Moshi, Inkling 2
        ("model.layers.1.self_attn.o_proj.base_layer.weight", "o_proj.weight"),  # PEFT's LoRA
        ("model.layers.2.router.layer.weight", "router.weight"),  # JetMoE
        ("model.layers.3.linear.weight", "linear.weight"),  # a block's own layer (Zamba 2)
        ("linear.weight", "linear.weight"),
    ],
)
def test_a_layer_role_skips_a_wrapper_named_for_its_type(name, role):
    # by leaf, as the checkpoints trained with it read them, every wrapped projection is one role
    assert role_of(name, "layer") == role
    assert role_of(name, "leaf") == ".".join(name.split(".")[-2:])


def test_an_unknown_role_key_is_refused():
    with pytest.raises(VariantError, match="unknown role key 'op'; accepted: name, leaf, layer"):
        role_of("lm_head.weight", "op")
    with pytest.raises(VariantError, match="unknown role key 'op'; accepted: name, leaf, layer") as error:
        LoGAHConfig(role_key="op")
    assert error.value.field == "role_key"


def test_a_siblings_role_is_the_leaf_in_its_holding_modules_names():
    """The context is the parameter names of the module that holds the layer, digits as ``*``, so
    every block's attention shares one role, and a leaf that two kinds of module hold is two."""
    names = [
        "pos_embed",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.1.attn.qkv.weight",
        "blocks.1.attn.proj.weight",
        "blocks.1.attn.q_norm.weight",
        "blocks.1.mlp.fc1.weight",
        "patch_embed.proj.weight",
        "head.weight",
    ]
    roles = roles_of(names, "siblings")
    assert roles["blocks.0.attn.qkv.weight"] == "qkv.weight in {proj.weight, qkv.weight}"
    assert roles["blocks.1.attn.qkv.weight"] == "qkv.weight in {proj.weight, q_norm.weight, qkv.weight}"
    assert roles["blocks.1.mlp.fc1.weight"] == "fc1.weight in {fc*.weight}"
    assert roles["patch_embed.proj.weight"] == "proj.weight in {proj.weight}"
    assert roles["blocks.0.attn.proj.weight"] != roles["patch_embed.proj.weight"]  # by leaf, one role
    assert roles["head.weight"] == roles["pos_embed"].replace("pos_embed in", "head.weight in")
    assert roles_of(names, "leaf") == {n: role_of(n, "leaf") for n in names}
    with pytest.raises(VariantError, match="reads all of a model's parameter names: use roles_of") as error:
        role_of("blocks.0.attn.qkv.weight", "siblings")
    assert error.value.field == "role_key"


def test_siblings_roles_tell_timms_modules_apart_across_models(graphs):
    """Over a GPT-2, a ViT and a LLaMA the siblings key has a role for each (leaf, holding module)
    pair: more roles than by leaf, and the ViT's encoded roles are its own module's."""
    leaf, keyed = frequent_roles(graphs, "leaf"), frequent_roles(graphs, "siblings")
    assert len(keyed) > len(leaf)
    assert {role.split(" in ")[0] for role in keyed} == set(leaf)
    vit = graphs[1]
    ghn = LoGAH(LoGAHConfig(max_mask=64, roles=tuple(keyed), role_key="siblings", role_rows=16))
    encoded = ghn.encode(vit)
    expected = roles_of([t.name for t in encoded.targets], "siblings")
    assert [keyed[r - 1] for r in encoded.roles] == [expected[t.name] for t in encoded.targets]


@pytest.fixture(scope="module")
def families():
    """A GPT-2, a LLaMA and a GPT-J, small and on meta: three families with three naming schemes."""
    from transformers import GPTJConfig, GPTJForCausalLM

    gptj = GPTJConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=128, rotary_dim=8, bos_token_id=0, eos_token_id=0)
    return {
        "gpt2": graphkit.trace(gpt2(layers=2)),
        "llama": graphkit.trace(llama(layers=2)),
        "gptj": graphkit.trace(meta(lambda: GPTJForCausalLM(gptj))),
    }


def test_leaf_roles_are_shared_across_families(families):
    """By name, LLaMA shares only the LM head with GPT-2 and GPT-J (``model.layers`` against
    ``transformer.h``); by leaf it shares GPT-J's query, key and value projections too, and the
    three families have fewer roles in all."""
    name = {f: set(frequent_roles([g])) for f, g in families.items()}
    leaf = {f: set(frequent_roles([g], "leaf")) for f, g in families.items()}
    assert name["llama"] & name["gpt2"] == name["llama"] & name["gptj"] == {"lm_head.weight"}
    assert leaf["llama"] & leaf["gptj"] == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "lm_head.weight"}
    assert len(frequent_roles(families.values(), "leaf")) < len(frequent_roles(families.values()))


def test_max_roles_keeps_the_roles_most_graphs_have(families):
    """``limit``: the roles the most graphs have, ties by name, returned sorted by name; a limit
    above the number of roles keeps them all."""
    graphs = list(families.values())
    every = frequent_roles(graphs, "leaf")
    assert frequent_roles(graphs, "leaf", 1) == ["lm_head.weight"]  # the only role all three have
    # then the first three, by name, of the roles two of the three have (LLaMA's and GPT-J's
    # k_proj, GPT-2's and GPT-J's ln_1), ahead of ln_f, q_proj, wte...; all sorted by name
    top = frequent_roles(graphs, "leaf", 4)
    assert top == ["k_proj.weight", "lm_head.weight", "ln_1.bias", "ln_1.weight"]
    assert frequent_roles(graphs, "leaf", len(every) + 5) == every == sorted(every)
    assert frequent_roles(reversed(graphs), "leaf", 4) == top  # the order of the pool does not matter


def test_a_role_unseen_in_training_decodes_through_the_shared_map(families):
    """A LoGAH whose roles are GPT-J's (by leaf) predicts a LLaMA: LLaMA's q, k and v projections
    and head get GPT-J's maps, its other parameters (o_proj, the MLP, the norms: roles it never
    saw) role 0, and those decode exactly as the same LoGAH without role maps decodes them."""
    torch.manual_seed(0)
    roles = frequent_roles([families["gptj"]], "leaf")
    with_roles = LoGAH(LoGAHConfig(max_mask=64, roles=tuple(roles), role_key="leaf", role_rows=40)).eval()
    shared = LoGAH(LoGAHConfig(max_mask=64)).eval()
    shared.load_state_dict(with_roles.state_dict(), strict=False)
    encoded = with_roles.encode(families["llama"])
    own = {t.name for t, role in zip(encoded.targets, encoded.roles) if role}
    assert {role_of(n, "leaf") for n in own} == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "lm_head.weight"}
    assert all(roles[role - 1] == role_of(t.name, "leaf") for t, role in zip(encoded.targets, encoded.roles) if role)
    with torch.no_grad():
        a, b = with_roles.predict(families["llama"]), shared.predict(families["llama"])
    assert all(torch.equal(a[n], b[n]) for n in a if n not in own)
    assert not any(torch.allclose(a[n], b[n]) for n in own)
    by_name = LoGAH(replace(with_roles.config, role_key="name")).encode(families["llama"])
    # by name, only the head (no block, so ``name`` and ``leaf`` agree) is a role GPT-J has
    assert {t.name for t, role in zip(by_name.targets, by_name.roles) if role} == {"lm_head.weight"}


def test_a_checkpoint_with_leaf_roles_loads_and_predicts_identically(families, tmp_path):
    """The role key, the roles and their rows are recorded in config.json, so the loaded LoGAH
    maps a new model's parameters to roles as the saved one did and predicts the same values."""
    torch.manual_seed(0)
    roles = frequent_roles(families.values(), "leaf", 6)
    ghn = LoGAH(LoGAHConfig(roles=tuple(roles), role_key="leaf", role_rows=40)).eval()
    with torch.no_grad():
        ghn.decoder.role_maps.normal_()  # unlike the shared map's rows, so that a lost role would show
    folder = save_checkpoint(tmp_path / "ckpt", ghn, {"variant": "custom"})
    logah = json.loads((folder / "config.json").read_text())["logah"]
    assert (logah["role_key"], logah["roles"], logah["role_rows"]) == ("leaf", roles, 40)
    loaded = load_checkpoint(folder)
    assert loaded.config == ghn.config
    for graph in families.values():
        with torch.no_grad():
            before, after = ghn.predict(graph), loaded.predict(graph)
        assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)

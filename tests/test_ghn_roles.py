"""Role maps: each parameter role decodes through its own first rows of the r -> K map."""

from __future__ import annotations

import pytest
import torch

import graphkit
from graphkit.families import build_model
from graphkit.ghn import PredictError, predict
from graphkit.ghn.config import LoGAHConfig, VariantError
from graphkit.ghn.encoding import role_of, targets
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

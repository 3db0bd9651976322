"""A meta-built model runs after predict (issue 39, item 3): the buffers it computed when it was
built (rotary frequencies, relative-position indices, norm statistics) are recomputed on the
parameters' device, equal to the same model built on the CPU; a buffer no library recomputes is
refused in one line naming it, before anything is written."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from helpers import ON_EVERY_DEVICE, meta
from torch import nn

from graphkit.buffers import BufferRebuildError, materialize_buffers, meta_buffers, rebuilt_buffers
from graphkit.ghn import LoGAH, predict


def decoder(model_type: str, **config) -> nn.Module:
    """A tiny transformers causal LM of ``model_type``, built in the current default device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, num_key_value_heads=2, **sizes, **config))


def vit(name: str, **config) -> nn.Module:
    import timm

    return timm.create_model(name, pretrained=False, **config).eval()


def assert_buffers_as_built_on_cpu(model: nn.Module, build) -> None:
    """Every buffer of ``model`` is on the CPU and equals that of ``build()`` run on the CPU."""
    expected = dict(build().named_buffers())
    found = dict(model.named_buffers())
    assert found.keys() == expected.keys()
    for name, buffer in found.items():
        assert buffer.device.type == "cpu", name
        assert buffer.dtype == expected[name].dtype and torch.equal(buffer, expected[name]), name


@pytest.fixture(scope="module")
def untrained():
    """A hypernetwork with no training record: it accepts every family, where the bundled ones
    accept only theirs (the values it predicts do not matter here, only that the model runs)."""
    torch.manual_seed(0)
    return LoGAH.from_variant("tiny").eval()


def test_rotary_buffers_of_a_meta_llama_are_recomputed():
    """The helper alone, in the everyday lane: LLaMA's inv_freq and original_inv_freq."""
    model = meta(lambda: decoder("llama"))
    assert set(meta_buffers(model)) == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    assert materialize_buffers(model, "cpu") == ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]
    assert not meta_buffers(model)
    assert_buffers_as_built_on_cpu(model, lambda: decoder("llama"))


PREDICTED = {  # through the bundled hypernetwork of the family (None) or the untrained one
    "llama": (lambda: decoder("llama"), None, (1, 8)),
    "gpt2": (lambda: decoder("gpt2"), None, (1, 8)),
    "deit": (lambda: vit("deit_tiny_patch16_224", img_size=32, depth=2), None, (1, 3, 32, 32)),
    "mistral": (lambda: decoder("mistral", sliding_window=4), "untrained", (1, 8)),
    "qwen2": (lambda: decoder("qwen2"), "untrained", (1, 8)),
    "vit_relpos": (lambda: vit("test_vit_relpos"), "untrained", (1, 3, 160, 160)),
    "beit": (
        lambda: vit("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
        "untrained",
        (1, 3, 32, 32),
    ),
    "eva_rope": (lambda: vit("eva02_tiny_patch14_224", img_size=28, depth=2), "untrained", (1, 3, 28, 28)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PREDICTED))
def test_a_predicted_meta_model_runs_with_the_buffers_a_cpu_build_has(name, untrained):
    build, ghn, shape = PREDICTED[name]
    model = meta(build)
    predict(model, untrained if ghn else None)
    assert not any(p.is_meta for p in model.parameters())
    assert_buffers_as_built_on_cpu(model, build)
    inputs = torch.randint(0, 100, shape) if len(shape) == 2 else torch.randn(shape)
    with torch.no_grad():
        out = model(inputs)
    assert torch.isfinite(out.logits if hasattr(out, "logits") else out).all()


@pytest.mark.slow
@pytest.mark.parametrize("device", ON_EVERY_DEVICE)
def test_the_buffers_follow_the_parameters_to_the_hypernetworks_device(device, untrained):
    model = meta(lambda: decoder("llama"))
    predict(model, copy.deepcopy(untrained).to(device))
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {torch.device(device).type}
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 128, (1, 8), device=device)).logits).all()


class Masked(nn.Module):
    """A hand-written module that computes a buffer in ``__init__``: no library knows how."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.arange(4.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x)) * self.scale


def test_a_buffer_no_library_recomputes_is_refused_and_nothing_is_written(untrained):
    model = meta(Masked).eval()
    with pytest.raises(BufferRebuildError, match=r"^Masked: buffer 'scale' \(Masked\) is on the meta device and no"):
        predict(model, untrained, (torch.zeros(2, 4, device="meta"),))
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])


def test_saved_buffers_only_leaves_the_rest_on_meta(untrained):
    """What `graphkit predict --out` asks for: the state dict's buffers (BatchNorm's running
    statistics, reset by torch), not the ones it does not save."""
    model = meta(Masked).eval()
    predict(model, untrained, (torch.zeros(2, 4, device="meta"),), buffers="saved")
    assert model.scale.is_meta and not any(p.is_meta for p in model.parameters())
    assert torch.equal(model.norm.running_var, torch.ones(4)) and int(model.norm.num_batches_tracked) == 0
    with pytest.raises(Exception, match="buffers must be 'all' or 'saved', got 'some'"):
        predict(model, untrained, (torch.zeros(2, 4, device="meta"),), buffers="some")


class HalfFilled(nn.Module):
    """A module whose own rebuild leaves half its buffer as it found it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(4), persistent=False)

    def init_non_persistent_buffers(self) -> None:
        self.table[:2] = 7.0


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(4), persistent=False)

    def init_non_persistent_buffers(self) -> None:
        raise RuntimeError("window size unknown")


def test_a_partial_or_failing_rebuild_is_refused_naming_the_buffer():
    model = meta(lambda: nn.Sequential(nn.Linear(2, 2), HalfFilled()))
    with pytest.raises(BufferRebuildError, match=r"buffer '1.table' \(HalfFilled\) is not recomputed in full by its"):
        rebuilt_buffers(model, "cpu")
    model = meta(lambda: nn.Sequential(Failing()))
    with pytest.raises(BufferRebuildError, match=r"'0.table' \(Failing\) could not be .*RuntimeError: window size"):
        rebuilt_buffers(model, "cpu")
    assert model[0].table.is_meta


def test_transformers_buffer_initialisation_never_touches_a_weight():
    """transformers' buffer initialisation also initialises weights: the parameters of the module
    it fills are flagged as loaded, so that a model with weights keeps them, even when refused."""
    model = decoder("llama")
    proj = model.model.layers[0].mlp.gate_proj
    proj.register_buffer("extra", torch.empty(3, device="meta"))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(BufferRebuildError, match="'model.layers.0.mlp.gate_proj.extra' .* LlamaModel's buffer"):
        rebuilt_buffers(model, "cpu")
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert not any(hasattr(p, "_is_hf_initialized") for p in model.parameters())


def test_without_transformers_buffer_initialisation_rotary_buffers_are_refused(monkeypatch):
    """The private API is guarded (graphkit.compat): where it is gone, the buffer is refused by
    name, never left with a made-up value."""
    model = meta(lambda: decoder("llama"))
    monkeypatch.delattr(importlib.import_module("transformers.initialization"), "guard_torch_init_functions")
    with pytest.raises(BufferRebuildError, match=r"'model.rotary_emb.inv_freq' \(LlamaRotaryEmbedding\) is on the"):
        rebuilt_buffers(model, "cpu")

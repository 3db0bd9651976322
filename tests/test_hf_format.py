"""Converted attention as folders stock transformers loads (graphkit.attention.hf_format, `convert
--format hf`): a small random checkpoint saved with save_pretrained, loaded back, converted, written
and loaded again with AutoModelForCausalLM.from_pretrained; logits where the conversion is exact,
cached decoding against a whole-sequence pass, the KV cache per token, and the refusals."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from helpers import ROOT, assert_decodes_from_its_cache
from typer.testing import CliRunner

from graphkit.attention import convert
from graphkit.attention.hf_format import (
    ExportError,
    check_deepseek,
    check_hf_export,
    check_hf_output,
    default_fold,
    principal_directions,
    save_hf,
    to_deepseek,
)
from graphkit.attention.mla import kv_cache_bytes
from graphkit.cli import app
from graphkit.fileio import OutputError

TOKENS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
CALIBRATION = [torch.randint(0, 300, (4, 16), generator=torch.Generator().manual_seed(2)) for _ in range(2)]


def checkpoint(tmp_path, model_type: str, kv_heads: int = 2, **overrides):
    """A random 2-layer, width-64 decoder of ``model_type`` (4 heads of 16), its norms and biases
    moved off their initial values so that folding them wrongly shows, saved with save_pretrained
    and loaded back as a user's checkpoint is."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=kv_heads,
        head_dim=16, intermediate_size=96, vocab_size=300, max_position_embeddings=64, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "source")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "source").eval()


def load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def logits(model, tokens=TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, use_cache=False).logits


def cached_bytes_per_token(model, tokens=TOKENS) -> int:
    """What the model's own cache holds per token, summed over layers, in bytes: a decoding
    pass's keys and values (DeepSeek's: the latent and the shared rotary key)."""
    with torch.no_grad():
        cache = model(tokens[:1], use_cache=True).cache
    size = next(model.parameters()).element_size()
    return sum(layer.keys[0, :, 0].numel() + layer.values[0, :, 0].numel() for layer in cache.layers) * size


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma"])
def test_gqa_is_saved_as_the_models_own_class_with_fewer_kv_heads(model_type, tmp_path):
    """GQA with measured groups (query heads and o_proj's columns reordered into them) loads as
    the source's class with num_key_value_heads 2 and computes what graphkit's converted model
    does; Qwen2's biases and Qwen3's per-head norms go along."""
    source = checkpoint(tmp_path, model_type, kv_heads=4)
    converted = convert(copy.deepcopy(source), "gqa", 2, grouping="similarity", calibration=CALIBRATION)
    save_hf(converted, tmp_path / "gqa", {"attention": "gqa"})
    loaded = load(tmp_path / "gqa")
    assert type(loaded) is type(source) and loaded.config.num_key_value_heads == 2
    assert loaded.config._attn_implementation != "graphkit"  # stock attention, no graphkit code
    assert (logits(loaded) - logits(converted)).abs().max() < 1e-5
    assert_decodes_from_its_cache(loaded, TOKENS[:1])
    assert cached_bytes_per_token(loaded) == kv_cache_bytes(converted) == kv_cache_bytes(source) // 2


def test_gqa_with_every_head_its_own_group_is_the_source(tmp_path):
    source = checkpoint(tmp_path, "llama", kv_heads=4)
    save_hf(convert(copy.deepcopy(source), "gqa", 4), tmp_path / "gqa", {"attention": "gqa"})
    assert (logits(load(tmp_path / "gqa")) - logits(source)).abs().max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "gemma"])
def test_mla_in_deepseeks_format_is_exact_where_nothing_is_dropped(model_type, tmp_path):
    """One K/V head (its principal direction is itself), every rotary dimension kept and a latent
    as wide as the model: stock DeepSeek-V3 gives the source's logits, with Qwen2's biases (the
    query's through the rank width + 1 query path), Gemma's scaled embeddings and 1 + weight norms.
    The source's RMSNorm eps is set tiny: DeepSeek renormalises the latent, which drops the eps a
    unit-RMS input carries (a 1e-3 effect on random weights, whose hidden states are small)."""
    source = checkpoint(tmp_path, model_type, kv_heads=1, rms_norm_eps=1e-12)
    save_hf(to_deepseek(source, 64, 16, CALIBRATION), tmp_path / "mla", {"attention": "mla"})
    loaded = load(tmp_path / "mla")
    assert type(loaded).__name__ == "DeepseekV3ForCausalLM"
    assert (logits(loaded) - logits(source)).abs().max() < 1e-5


def test_a_source_that_names_a_pad_token_converts_to_deepseeks_format(tmp_path):
    """Most real configs name a pad token; the rotary check's bare DeepSeek model (a one-token
    vocabulary) once kept it and failed in torch's embedding ("Padding_idx must be within
    num_embeddings"). The pad row is zero as transformers initialises it, and the calibration
    holds it: a zero hidden state once pulled the latent norm's weight below 1 (logits 6e-3 off)."""
    assert any((batch == 299).any() for batch in CALIBRATION)
    source = checkpoint(tmp_path, "llama", kv_heads=1, rms_norm_eps=1e-12, pad_token_id=299)
    converted = to_deepseek(source, 64, 16, CALIBRATION)
    assert converted.config.pad_token_id == 299
    assert (logits(converted) - logits(source)).abs().max() < 1e-5


def test_rorope_is_exact_when_the_kv_heads_share_their_keys(tmp_path):
    """Two K/V heads whose keys are multiples of one another: RoRoPE's principal direction holds
    every head's rotary key, so the shared rotary key loses nothing (at full rank)."""
    source = checkpoint(tmp_path, "llama", kv_heads=2, rms_norm_eps=1e-12)
    with torch.no_grad():
        for layer in source.model.layers:
            k = layer.self_attn.k_proj.weight.view(2, 16, 64)
            k[1] = -0.5 * k[0]
    converted = to_deepseek(source, 64, 16, CALIBRATION)
    assert (logits(converted) - logits(source)).abs().max() < 1e-5


def test_freqfold_turns_the_neighbouring_pairs_with_the_kept_one(tmp_path):
    """FreqFold (each rotary pair holds its kept frequency and the next ones): with the keys'
    components at the folded neighbours zeroed, the principal directions hold none of them and
    folding changes nothing; with them present it does. A fold above head_dim / D is refused."""
    source = checkpoint(tmp_path, "llama", kv_heads=2)
    folded = to_deepseek(source, 64, 4, CALIBRATION, fold=4)
    assert (logits(folded) - logits(to_deepseek(source, 64, 4, CALIBRATION, fold=1))).abs().max() > 1e-3
    neighbours = [d + offset for d in (1, 2, 3, 5, 6, 7) for offset in (0, 8)]  # pairs 1-3, 5-7 of 8, both halves
    with torch.no_grad():
        for layer in source.model.layers:
            layer.self_attn.k_proj.weight.view(2, 16, 64)[:, neighbours] = 0
    unfolded = logits(to_deepseek(source, 64, 4, CALIBRATION, fold=1))
    assert (logits(to_deepseek(source, 64, 4, CALIBRATION, fold=4)) - unfolded).abs().max() < 1e-5
    with pytest.raises(ExportError, match=r"^fold 5: must be an integer from 1 to head_dim / rope_dims = 4$"):
        to_deepseek(source, 64, 4, fold=5)


def test_kv_balancing_changes_only_a_latent_that_binds(tmp_path):
    """BKV (K scaled to V's size before the latent's SVD): at full rank the latent is exact either
    way; at rank 16 of 64 stacked rows, with keys 30x louder than values, it changes the basis."""
    source = checkpoint(tmp_path, "llama", kv_heads=2, rms_norm_eps=1e-12)
    with torch.no_grad():
        for layer in source.model.layers:
            layer.self_attn.k_proj.weight.mul_(30)

    def converted(kv_rank: int, balance: bool) -> torch.Tensor:
        return logits(to_deepseek(source, kv_rank, 16, CALIBRATION, balance_kv=balance))

    assert (converted(64, True) - converted(64, False)).abs().max() < 1e-5
    assert (converted(16, True) - converted(16, False)).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("head_dim", "rope_dims", "fold"), [(16, 8, 1), (16, 4, 1), (64, 32, 2), (64, 16, 4), (64, 8, 4)]
)
def test_the_default_fold_holds_the_pairs_turning_at_least_0_4_times_as_fast(head_dim, rope_dims, fold):
    """RoPE's neighbouring pairs turn 10000 ** (-2 / head_dim) times as fast as each other: 0.32 at
    head_dim 16 (never folded), 0.75 at 64 (up to four pairs, 1 to 0.42)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=1, hidden_size=128, num_attention_heads=128 // head_dim, num_key_value_heads=1,
        head_dim=head_dim, intermediate_size=32, vocab_size=16,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    assert default_fold(model, check_deepseek(model, 64, rope_dims), rope_dims) == fold


def test_the_principal_direction_of_each_pair_is_the_top_eigenvector():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=generator, dtype=torch.float64)
    covariances = x @ x.transpose(1, 2)
    mix = principal_directions(covariances)
    top = torch.linalg.eigvalsh(covariances)[:, -1]
    assert torch.allclose(torch.einsum("pg,pgh,ph->p", mix, covariances, mix), top)
    assert torch.allclose(mix.norm(dim=-1), torch.ones(3, dtype=torch.float64))
    assert (mix.gather(1, mix.abs().argmax(1, keepdim=True)) > 0).all()  # the same sign every time


@pytest.mark.slow
def test_a_lossy_deepseek_checkpoint_loads_decodes_and_caches_the_latent_and_one_rotary_key(tmp_path):
    source = checkpoint(tmp_path, "qwen2", kv_heads=2)
    save_hf(to_deepseek(source, 24, 8, CALIBRATION), tmp_path / "mla", {"attention": "mla"})
    loaded = load(tmp_path / "mla")
    config = json.loads((tmp_path / "mla" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["graphkit"]["attention"] == "mla"
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["qk_nope_head_dim"]) == (24, 8, 16)
    assert config["first_k_dense_replace"] == 2 and config["q_lora_rank"] == 65  # Qwen2's query bias
    assert all(type(layer.mlp).__name__ == "DeepseekV3MLP" for layer in loaded.model.layers)  # no MoE
    assert_decodes_from_its_cache(loaded, TOKENS[:1])
    assert cached_bytes_per_token(loaded) == kv_cache_bytes(loaded) == 2 * (24 + 8) * 4
    error = (logits(loaded) - logits(source)).abs().max() / logits(source).abs().max()
    assert error < 0.5  # changed (RoRoPE drops rotary components, the latent is rank 24), not broken


@pytest.mark.parametrize(
    ("model_type", "overrides", "variant", "message"),
    [
        ("qwen3", {}, "mla", r"module 'model.layers.0.self_attn.q_norm': per-head query/key norms"),
        ("mistral", {"sliding_window": 8}, "mla", r"attends within a sliding window of 8 tokens"),
        ("gemma2", {}, "mla", r"config attn_logit_softcapping=50.0"),
        ("llama", {}, "kdgqa", r"--format hf writes gqa or mla: no stock transformers class computes kdgqa"),
    ],
)
def test_what_no_stock_class_holds_is_refused_in_one_line(model_type, overrides, variant, message):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, intermediate_size=48, vocab_size=300, max_position_embeddings=64, **overrides,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ExportError, match=message):
        check_deepseek(model, 16, 8) if variant == "mla" else check_hf_export(model, variant)


@pytest.mark.slow
def test_vits_and_gpt2_have_no_stock_gqa_or_mla_class():
    import timm
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1)
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ExportError, match=r"VisionTransformer: a ViT has no stock GQA or MLA class"):
        check_hf_export(vit, "gqa")
    with pytest.raises(ExportError, match=r"GPT2LMHeadModel: GPT-2 has no stock GQA or MLA class"):
        check_hf_export(gpt2, "mla")


@pytest.mark.parametrize(
    ("rank", "rope", "message"),
    [
        (32, 6, r"--rope-dims 6: .* must be even and divide head_dim 16; accepted: 2, 4, 8, 16"),
        (65, 8, r"--kv-rank 65: must be an integer from 1 to the width 64"),
        (0, 8, r"--kv-rank 0"),
    ],
)
def test_a_rank_or_rotary_width_deepseek_cannot_take_is_refused(rank, rope, message):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=96)
    model = LlamaForCausalLM(config)
    with pytest.raises(ExportError, match=message):
        check_deepseek(model, rank, rope)


def test_a_folder_graphkit_did_not_write_is_never_replaced(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(OutputError, match=r"exists and was not written by graphkit"):
        check_hf_output(theirs)
    assert check_hf_output(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_hf_output(tmp_path / "empty") == tmp_path / "empty"


def test_a_folder_graphkit_wrote_is_replaced_whole(tmp_path):
    source = checkpoint(tmp_path, "llama", kv_heads=4)
    save_hf(source, tmp_path / "out", {"attention": "gqa"})
    (tmp_path / "out" / "stale.safetensors").write_bytes(b"")  # an earlier save's file of another name
    check_hf_output(tmp_path / "out")
    save_hf(source, tmp_path / "out", {"attention": "gqa", "kv_heads": 4})
    assert not (tmp_path / "out" / "stale.safetensors").exists()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["graphkit"]["kv_heads"] == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


runner = CliRunner()


def model_file(tmp_path, source) -> str:
    """A MODEL.py that loads the checkpoint folder ``source``."""
    path = tmp_path / "model.py"
    loader = f"AutoModelForCausalLM.from_pretrained({str(source)!r})"
    path.write_text(f"from transformers import AutoModelForCausalLM\nmodel = {loader}\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_convert_writes_a_folder_stock_transformers_loads_and_prints_its_cache(attention, tmp_path):
    checkpoint(tmp_path, "llama", kv_heads=4)
    options = ["-k", "2"] if attention == "gqa" else ["--kv-rank", "24", "--rope-dims", "8"]
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "convert",
            model_file(tmp_path, tmp_path / "source"),
            "-a",
            attention,
            *options,
            "--format",
            "hf",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    loaded = load(out)
    printed = re.search(r"KV cache per token: ([\d,]+) bytes before, ([\d,]+) after", result.stdout).groups()
    before, after = (int(n.replace(",", "")) for n in printed)
    assert cached_bytes_per_token(loaded) == after < before
    assert json.loads((out / "config.json").read_text())["graphkit"]["attention"] == attention


def test_convert_refuses_hf_for_a_vit_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "convert",
            str(ROOT / "examples" / "vit_tiny_cifar.py"),
            "-a",
            "gqa",
            "-k",
            "2",
            "--format",
            "hf",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: VisionTransformer: a ViT has no stock GQA or MLA class in transformers (module 'blocks.0.attn'); "
        "--format graphkit writes its converted attention"
    ]
    assert not out.exists()


def test_convert_refuses_a_folder_it_did_not_write_before_loading_the_model(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(
        app, ["convert", str(tmp_path / "missing.py"), "-a", "gqa", "--format", "hf", "--out", str(out)]
    )
    assert result.exit_code == 1 and "exists and was not written by graphkit" in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "pgqa"], "--format hf writes gqa or mla: no stock transformers class computes pgqa"),
        (["-a", "mla", "--kv-rank", "8"], "-a mla --format hf needs --rope-dims"),
    ],
)
def test_convert_refuses_hf_options_before_loading_the_model(args, message, tmp_path):
    result = runner.invoke(
        app, ["convert", str(tmp_path / "missing.py"), *args, "--format", "hf", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and message in result.stderr

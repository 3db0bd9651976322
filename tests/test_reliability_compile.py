"""Bad input to compile, convert, predict and MODEL.py files: every bad option, parameter file
or model file ends as one line naming it, exit 1, and nothing written; predict writes into a
model's own storage."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from typer.testing import CliRunner

import graphkit
import graphkit.compiler as compile_module
import graphkit.params as params_module
from graphkit.attention import ConvertError, convert
from graphkit.cli import app
from graphkit.compiler import CompileError, compile_model
from graphkit.datasets import load
from graphkit.datasets.generate import generate
from graphkit.families import build_model
from graphkit.fileio import OutputError
from graphkit.ghn import LoGAH, LoGAHConfig, PredictError, predict
from graphkit.ghn.predict import first_non_finite, scale_residuals, should_scale_residuals
from graphkit.modelfile import load_model_file
from graphkit.params import ParamsError, load_params, read_params, save_params

runner = CliRunner()
VIT_FILE = ROOT / "examples" / "vit_tiny_cifar.py"  # 6 heads, real weights


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def refused(result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: {message}" or message in result.stderr.splitlines()[0], result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reliability") / "tiny"
    generate(str(ROOT / "tests" / "recipes" / "tiny-vits.json"), out, num=4)
    return out


@pytest.fixture(scope="module")
def record(dataset):
    """A record with 4 heads (divisors 1, 2, 4)."""
    return next(r for r in load(dataset) if r.config["heads"] == 4)


@pytest.fixture()
def params(record) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {n: p.detach().clone() for n, p in compile_model(record).named_parameters()}


# -- compile -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "break_it",
    [lambda t: t.fill_(float("nan")), lambda t: t.view(-1)[3:5].fill_(float("-inf"))],
    ids=["all-nan", "some-inf"],
)
@pytest.mark.slow
def test_compile_refuses_non_finite_parameters(dataset, record, params, tmp_path, break_it):
    name = list(params)[2]
    break_it(params[name])
    path = save_params(params, tmp_path / "params.safetensors")
    before = listing(tmp_path)
    result = run("compile", dataset, record.id, "--params", path, "--out", tmp_path / "model.safetensors")
    refused(result, f"{path}: parameter '{name}' holds NaN or Inf; nothing was loaded")
    assert listing(tmp_path) == before


@pytest.mark.slow
def test_compile_refuses_integer_tensors_but_casts_float_ones(dataset, record, params, tmp_path):
    name = list(params)[0]
    params[name] = (params[name] * 100).to(torch.int8)
    path = save_params(params, tmp_path / "int8.safetensors")
    before = listing(tmp_path)
    result = run("compile", dataset, record.id, "--params", path, "--out", tmp_path / "model.safetensors")
    refused(
        result,
        f"{path}: parameter '{name}' is int8 but the model's is float32: integer values are not cast "
        "to floating-point (a float-to-float cast such as float16 -> float32 is)",
    )
    assert listing(tmp_path) == before
    params[name] = torch.zeros(params[name].shape, dtype=torch.bool)
    with pytest.raises(ParamsError, match="is bool but the model's is float32: bool values are not cast"):
        load_params(compile_model(record), params)
    halves = {n: t.half() for n, t in params.items() if n != name} | {
        name: torch.ones(params[name].shape, dtype=torch.bfloat16)
    }
    model = compile_model(record)
    assert load_params(model, halves).coverage == 1.0
    assert model.get_parameter(name).dtype == torch.float32 and bool((model.get_parameter(name) == 1).all())


def test_a_dgqa_state_buffer_must_stay_an_integer():

    model = convert(
        build_model(dict(family="vit", num_layers=1, hidden=32, heads=2, image_size=8, patch_size=4), device="cpu"),
        "dgqa",
        1,
    )
    state = dict(model.state_dict())
    state["blocks.0.attn.core.counts"] = state["blocks.0.attn.core.counts"].float()
    with pytest.raises(ParamsError, match="buffer 'blocks.0.attn.core.counts' is float32 but the model's is int64"):
        load_params(model, state)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["-k", "2"],
            "--kv-heads 2 needs --attention (gqa, kdgqa, dgqa, pgqa): "
            "K/V heads change only when the attention is converted",
        ),
        (["-a", "gqa", "-k", "0"], "--kv-heads 0: must divide the 4 heads; accepted: 1, 2, 4"),
        (["-a", "gqa", "-k", "-2"], "--kv-heads -2: must divide the 4 heads; accepted: 1, 2, 4"),
        (["-a", "gqa", "-k", "3"], "--kv-heads 3: must divide the 4 heads; accepted: 1, 2, 4"),
        (["-a", "bogus"], "--attention 'bogus': accepted: gqa, kdgqa, dgqa, pgqa"),
        (["-a", "MHA"], "--attention 'MHA': accepted: gqa, kdgqa, dgqa, pgqa"),
    ],
)
def test_compile_checks_attention_options(dataset, record, tmp_path, args, message):
    result = run("compile", dataset, record.id, *args, "--out", tmp_path / "model.safetensors")
    refused(result, message)
    assert listing(tmp_path) == {}


def test_compile_converts_with_valid_options(dataset, record, tmp_path):
    result = run("compile", dataset, record.id, "-a", "kdgqa", "-k", "2", "--out", tmp_path / "model.safetensors")
    assert result.exit_code == 0, result.output
    assert "attention converted to kdgqa with 2 K/V heads" in result.stdout
    config = json.loads(read_params(tmp_path / "model.safetensors")[1]["graphkit_config"])
    assert (config["attention"], config["kv_heads"]) == ("kdgqa", 2)  # the file says what it holds


def test_compile_refuses_an_output_that_is_a_folder_or_not_ours(dataset, record, tmp_path):
    folder = tmp_path / "existing"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    refused(run("compile", dataset, record.id, "--out", folder), f"--out {folder}: is a folder; give a file name")
    assert listing(folder) == {"keep.txt": b"mine"}
    readme = tmp_path / "README.md"
    readme.write_text("# my project\n")
    refused(
        run("compile", dataset, record.id, "--out", readme),
        f"--out {readme}: exists and was not written by graphkit; "
        "refusing to overwrite it (remove it, or choose another name)",
    )
    assert readme.read_text() == "# my project\n"
    earlier = tmp_path / "model.safetensors"  # one of ours is replaced
    assert run("compile", dataset, record.id, "--out", earlier).exit_code == 0
    assert run("compile", dataset, record.id, "--out", earlier).exit_code == 0


def test_compile_measures_before_allocating(dataset, record, tmp_path, monkeypatch):
    monkeypatch.setattr(params_module, "available_memory", lambda device: 1000)
    total = sum(p.numel() for p in compile_model(record, memory_limit=10**12).parameters())
    buffers = sum(b.numel() for b in build_model(record.config).buffers())
    result = run("compile", dataset, record.id, "--out", tmp_path / "model.safetensors")
    refused(
        result,
        f"the vit model of {record.id}: its {total + buffers:,} parameters and buffers need "
        f"{4 * (total + buffers) / 1e9:.2f} GB but 0.00 GB are "
        "available on cpu; free memory or compile on another device",
    )
    assert listing(tmp_path) == {}


def test_a_model_larger_than_memory_is_refused_before_anything_is_allocated(monkeypatch):
    def meta_only(config, device="meta", **kwargs):  # a regression fails here instead of exhausting memory
        assert torch.device(device).type == "meta", "compile allocated before measuring"
        return build_model(config, device, **kwargs)

    monkeypatch.setattr(compile_module, "build_model", meta_only)
    huge = dict(family="gpt2", num_layers=48, hidden=16384, heads=16)  # about 155B parameters, 620 GB
    with pytest.raises(CompileError, match=r"its [\d,]+ parameters and buffers need 6\d\d\.\d\d GB but"):
        compile_model(huge)


def test_truncated_and_corrupt_parameter_files_are_named(dataset, record, params, tmp_path):
    whole = save_params(params, tmp_path / "whole.safetensors").read_bytes()
    for name, data in {"truncated": whole[: len(whole) // 2], "corrupt": whole[:8] + b"{oops" + whole[13:]}.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(data)
        result = run("compile", dataset, record.id, "--params", path, "--out", tmp_path / "model.safetensors")
        refused(result, f"{path}: not a safetensors file, or truncated (")
        assert not (tmp_path / "model.safetensors").exists()
    with pytest.raises(CompileError, match="not a safetensors file, or truncated"):  # ParamsError is a CompileError
        read_params(tmp_path / "truncated.safetensors")


def test_compile_names_a_params_path_that_is_not_a_file(dataset, record, tmp_path):
    refused(
        run("compile", dataset, record.id, "--params", tmp_path, "--out", tmp_path / "model.safetensors"),
        f"{tmp_path}: is a folder; give a safetensors file",
    )
    refused(
        run(
            "compile",
            dataset,
            record.id,
            "--params",
            tmp_path / "nope.safetensors",
            "--out",
            tmp_path / "model.safetensors",
        ),
        f"{tmp_path / 'nope.safetensors'}: no such parameter file",
    )
    assert listing(tmp_path) == {}


def test_compile_library_checks_kv_heads_types(record):
    for kv_heads in (2.0, True, "2"):
        with pytest.raises(CompileError, match=f"kv_heads {kv_heads}: must divide the 4 heads; accepted: 1, 2, 4"):
            compile_model(record, attention="gqa", kv_heads=kv_heads)


def test_save_params_refuses_a_folder_or_a_file_it_did_not_write(params, tmp_path):

    with pytest.raises(OutputError, match=f"parameter file {tmp_path}: is a folder; give a file name"):
        save_params(params, tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(
        OutputError, match=r"notes.txt: exists and was not written by graphkit; refusing to overwrite it"
    ):
        save_params(params, notes)
    assert listing(tmp_path) == {"notes.txt": b"mine"}


def test_public_imports_keep_working():

    for name in ("save_params", "load_params", "read_params", "LoadReport", "CompileError"):
        assert getattr(compile_module, name) is getattr(params_module, name)

    assert first_non_finite is params_module.first_non_finite


# -- convert -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,message",
    [
        (["-a", "dgqa", "--window", "0"], "--window 0: must be a whole number of training steps >= 1"),
        (["-a", "dgqa", "--window", "-5"], "--window -5: must be a whole number of training steps >= 1"),
        (
            ["-a", "dgqa", "--alpha", "7"],
            "--alpha 7.0: must be a number in [0, 1] (the weight of the current key norms)",
        ),
        (
            ["-a", "dgqa", "--alpha", "-0.1"],
            "--alpha -0.1: must be a number in [0, 1] (the weight of the current key norms)",
        ),
        (
            ["-a", "dgqa", "--alpha", "nan"],
            "--alpha nan: must be a number in [0, 1] (the weight of the current key norms)",
        ),
        (["-a", "dgqa", "--evolution", "linear"], "--evolution 'linear': accepted: ema, difference"),
        (
            ["-a", "dgqa", "--evolution", "difference", "--alpha", "0.3"],
            "--alpha applies only to --evolution ema, not difference",
        ),
        (["-a", "gqa", "--window", "10"], "--window applies only to dgqa, not gqa"),
        (["-a", "kdgqa", "--evolution", "ema"], "--evolution applies only to dgqa, not kdgqa"),
        (["-a", "pgqa", "--alpha", "0.5"], "--alpha applies only to dgqa, not pgqa"),
        (
            ["-a", "gqa", "-k", "0"],
            "kv_heads 0 does not divide the 6 heads of module 'blocks.0.attn'; accepted: 1, 2, 3, 6",
        ),
        (
            ["-a", "gqa", "-k", "-3"],
            "kv_heads -3 does not divide the 6 heads of module 'blocks.0.attn'; accepted: 1, 2, 3, 6",
        ),
        (
            ["-a", "kdgqa", "--grouping", "similarity"],
            "--grouping similarity applies to gqa; kdgqa allocates its own groups",
        ),
        (
            ["-a", "gqa", "--data", "digits"],
            "--data applies to --grouping keynorm, similarity, search and to --rope-dims, not --grouping mean",
        ),
        (["-a", "gqa", "--rope-dims", "4"], "--rope-dims applies to -a mla, not gqa"),
        (
            ["-a", "mla", "--kv-rank", "8", "--rope-dims", "4"],
            "rope_dims 4 for module 'blocks.0.attn' (Attention): it has no RoPE",
        ),
        (["-a", "mla"], "-a mla needs --kv-rank"),
        (["-a", "gqa", "--kv-rank", "8"], "--kv-rank applies to -a mla, not gqa"),
        (
            ["-a", "mla", "--kv-rank", "8", "-k", "2"],
            "--kv-heads applies to gqa and the key-driven variants; MLA's cache is set by --kv-rank",
        ),
        (["-a", "mla", "--kv-rank", "8", "--grouping", "search"], "--grouping search applies to gqa; mla has no K/V"),
        (
            ["-a", "mla", "--kv-rank", "0"],
            "kv_rank 0 for module 'blocks.0.attn': must be an integer from 1 to 192",
        ),
        (["-a", "mla", "--kv-rank", "8", "--window", "3"], "--window applies only to dgqa, not mla"),
        (["-a", "gqa", "--grouping", "keynorm", "--data", "bogus"], "unknown data source 'bogus'; accepted: digits"),
        (
            ["-a", "gqa", "-k", "3", "--grouping", "similarity", "--data", "stdlib-text"],
            "stdlib-text is text data but a vit model takes image",
        ),
    ],
)
def test_convert_checks_every_option(tmp_path, args, message):
    result = run("convert", VIT_FILE, *args, "--out", tmp_path / "out.safetensors")
    refused(result, message)
    assert listing(tmp_path) == {}


@pytest.mark.slow
def test_convert_saves_what_dgqa_used(tmp_path):
    out = tmp_path / "dgqa.safetensors"
    assert (
        run("convert", VIT_FILE, "-a", "dgqa", "-k", "2", "--window", "7", "--alpha", "0.25", "-o", out).exit_code == 0
    )
    metadata = read_params(out)[1]
    assert {k: metadata[k] for k in metadata if k.startswith("graphkit_")} == {
        "graphkit_attention": "dgqa",
        "graphkit_kv_heads": "2",
        "graphkit_window": "7",
        "graphkit_evolution": "ema",
        "graphkit_alpha": "0.25",
    }
    assert run("convert", VIT_FILE, "-a", "dgqa", "--evolution", "difference", "-o", out).exit_code == 0
    metadata = read_params(out)[1]
    assert (metadata["graphkit_kv_heads"], metadata["graphkit_window"], metadata["graphkit_evolution"]) == (
        "6",
        "300",
        "difference",
    )
    assert "graphkit_alpha" not in metadata
    assert run("convert", VIT_FILE, "-a", "pgqa", "-k", "3", "-o", out).exit_code == 0
    metadata = read_params(out)[1]
    assert (metadata["graphkit_attention"], metadata["graphkit_kv_heads"]) == (
        "pgqa",
        "3",
    ) and "graphkit_window" not in metadata


@pytest.mark.slow
@pytest.mark.parametrize("grouping", ["keynorm", "similarity", "search"])
def test_convert_saves_the_measured_groups(tmp_path, grouping):
    out = tmp_path / f"{grouping}.safetensors"
    assert run("convert", VIT_FILE, "-a", "gqa", "-k", "3", "--grouping", grouping, "-o", out).exit_code == 0
    metadata = read_params(out)[1]
    groups = json.loads(metadata["graphkit_groups"])
    assert len(groups) == 4 and metadata["graphkit_kv_heads"] == "3"  # the example: 4 blocks of 6 heads
    assert all(sorted(h for g in layer for h in g) == list(range(6)) and len(layer) == 3 for layer in groups.values())


@pytest.mark.slow
def test_convert_to_mla_says_what_the_cache_saves(tmp_path):
    out = tmp_path / "mla.safetensors"
    result = run("convert", VIT_FILE, "-a", "mla", "--kv-rank", "48", "-o", out)
    assert result.exit_code == 0, result.output
    metadata = read_params(out)[1]
    assert (metadata["graphkit_attention"], metadata["graphkit_kv_rank"]) == ("mla", "48")
    line = next(line for line in result.output.splitlines() if line.startswith("KV cache per token"))
    before, after = (int(x.replace(",", "")) for x in re.findall(r"([\d,]+) (?:bytes before|after)", line))
    assert after * 8 == before  # 2 x 192 values a layer become 48


@pytest.mark.slow
def test_a_converted_file_compiles_back_with_its_attention_and_groups(dataset, record, tmp_path):
    model_file = tmp_path / "record_model.py"
    model_file.write_text(
        f"import torch\nfrom graphkit.datasets import load\n\ntorch.manual_seed(0)\n"
        f"model = load({str(dataset)!r})[{record.id!r}].build_model('cpu')\n"
    )
    converted = tmp_path / "converted.safetensors"
    assert (
        run("convert", model_file, "-a", "gqa", "-k", "2", "--grouping", "similarity", "-o", converted).exit_code == 0
    )
    out = tmp_path / "compiled.safetensors"
    result = run("compile", dataset, record.id, "--params", converted, "-o", out)  # no -a / -k: the file says
    assert result.exit_code == 0, result.output
    (before, written), (after, carried) = read_params(converted), read_params(out)
    assert all(torch.equal(before[name], after[name]) for name in before) and set(before) <= set(after)
    for key in ("graphkit_attention", "graphkit_kv_heads", "graphkit_groups"):
        assert carried[key] == written[key]
    refused(
        run("compile", dataset, record.id, "--params", converted, "-a", "kdgqa", "-o", tmp_path / "other.safetensors"),
        f"--params {converted}: converted to gqa with 2 K/V heads (its metadata), not kdgqa with 2; leave "
        "--attention and --kv-heads out to use its own",
    )
    mla = tmp_path / "mla.safetensors"
    assert run("convert", model_file, "-a", "mla", "--kv-rank", "16", "-o", mla).exit_code == 0
    result = run("compile", dataset, record.id, "--params", mla, "-o", out)
    assert result.exit_code == 0 and "attention converted to MLA with a rank-16 latent" in result.output
    (before, written), (after, carried) = read_params(mla), read_params(out)
    assert all(torch.equal(before[name], after[name]) for name in before) and set(before) == set(after)
    assert (carried["graphkit_attention"], carried["graphkit_kv_rank"]) == ("mla", "16")
    refused(
        run("compile", dataset, record.id, "--params", mla, "-k", "2", "-o", tmp_path / "other.safetensors"),
        f"--params {mla}: converted to MLA (its metadata); leave --attention and --kv-heads out",
    )
    refused(
        run("compile", dataset, record.id, "-a", "mla", "-o", tmp_path / "other.safetensors"),
        "--attention mla: compile builds MLA from the --params file `graphkit convert -a mla` wrote",
    )


@pytest.mark.slow
def test_convert_refuses_an_output_that_is_a_folder_or_not_ours(tmp_path):
    folder = tmp_path / "existing"
    folder.mkdir()
    refused(run("convert", VIT_FILE, "-a", "gqa", "-o", folder), f"--out {folder}: is a folder; give a file name")
    assert listing(folder) == {}
    model_file = tmp_path / "model.py"
    model_file.write_text(VIT_FILE.read_text())
    refused(
        run("convert", model_file, "-a", "gqa", "-o", model_file),
        f"--out {model_file}: is a Python file name; graphkit never writes over model sources",
    )
    assert model_file.read_text() == VIT_FILE.read_text()


def test_the_library_convert_refuses_options_its_variant_ignores():

    model = build_model(dict(family="vit", num_layers=1, hidden=32, heads=2, image_size=8, patch_size=4), device="cpu")
    before = {n: p.clone() for n, p in model.state_dict().items()}
    for variant, options, message in [
        ("gqa", dict(window=5), "window applies only to dgqa, not gqa"),
        ("dgqa", dict(alpha=math.inf), "alpha inf: must be a number in"),
        ("dgqa", dict(window=2.5), "window 2.5: must be a whole number"),
        ("dgqa", dict(windw=5), "unknown attention option 'windw'; accepted: window,"),
    ]:
        with pytest.raises(ConvertError, match=message):
            convert(model, variant, 1, **options)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[n], before[n]) for n in before)


# -- MODEL.py ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source,message",
    [
        ("import sys\nsys.exit(3)\n", "{path}:2: running the file called sys.exit(3)"),
        (
            "import sys\n\ndef build_model():\n    sys.exit('no GPU')\n",
            "{path}:4: build_model() called sys.exit('no GPU')",
        ),
        ("exit()\n", "{path}:1: running the file called sys.exit()"),
    ],
)
def test_a_model_file_that_exits_is_an_error(tmp_path, source, message):
    path = tmp_path / "MODEL.py"
    path.write_text(source)
    refused(run("trace", path), message.format(path=path))


def test_ctrl_c_in_a_model_file_still_interrupts(tmp_path):

    path = tmp_path / "MODEL.py"
    path.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_model_file(path)


# -- predict -----------------------------------------------------------------------------------
def test_predict_checks_its_output_before_predicting(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    refused(
        run("predict", ROOT / "examples" / "gpt2.py", "-o", folder), f"--out {folder}: is a folder; give a file name"
    )
    assert listing(folder) == {}


VIT = dict(family="vit", num_layers=2, hidden=32, heads=2, image_size=8, patch_size=4)
GPT = dict(family="gpt2", num_layers=2, hidden=32, heads=2, vocab_size=100, context=16, tied=True)


def small_chunks(decoder: str = "low_rank"):
    """A LoGAH whose decoder chunk K is 16: every parameter here spans several row and column
    chunks, 4-D patch embeddings included."""

    torch.manual_seed(0)
    return LoGAH(LoGAHConfig(max_mask=16, decoder=decoder)).eval()


@pytest.mark.parametrize("config", [VIT, GPT], ids=["vit", "gpt2-tied"])
@pytest.mark.parametrize("decoder", ["low_rank", "ghn3"])
def test_predict_writes_into_the_models_own_storage(config, decoder):
    ghn = small_chunks(decoder)
    model = build_model(config, device="cpu")
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    graph = graphkit.trace(build_model(config))
    with torch.no_grad():
        expected = ghn.predict(graph)
    if should_scale_residuals(graph):  # GPT-2: predict scales the branch ends as GPT-2's init does, in place
        scale_residuals(graph, expected)
    if decoder == "low_rank":  # never all parameters at once (forward's way): block by block into the model
        ghn.forward = None
    params = predict(model, ghn, keep_init=False)  # the prediction alone (test_ghn_keep_init: added onto the init)
    for name, p in model.named_parameters():
        assert p.data_ptr() == before[name][0], name  # the same memory, no new tensor
        assert not torch.equal(p, before[name][1]), name  # with new values
        assert torch.allclose(p, expected[name], atol=1e-6, rtol=1e-4), name  # the values forward() gives
        assert params[name].data_ptr() == p.data_ptr()
    if config is GPT:
        assert model.lm_head.weight is model.transformer.wte.weight


def test_predict_into_a_meta_model_gives_real_tied_tensors():
    ghn = small_chunks()
    model = build_model(GPT)
    predict(model, ghn, keep_init=False)
    assert not any(p.is_meta for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight
    graph = graphkit.trace(build_model(GPT))
    with torch.no_grad():
        expected = scale_residuals(graph, ghn.predict(graph))  # as predict does for GPT-2
    assert all(torch.allclose(p, expected[n], atol=1e-6, rtol=1e-4) for n, p in model.named_parameters())


def test_predict_into_a_half_precision_model_casts_in_place():
    model = build_model(VIT, device="cpu").half()
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    predict(model, small_chunks(), graph=graphkit.trace(build_model(VIT)))  # float inputs do not trace a half model
    assert all(p.dtype == torch.float16 and p.data_ptr() == pointers[n] for n, p in model.named_parameters())
    assert torch.isfinite(model.float()(torch.randn(2, 3, 8, 8))).all()


@pytest.mark.parametrize(
    "poison",
    [
        lambda ghn: ghn.encoder.norm.bias.fill_(float("nan")),  # NaN everywhere
        lambda ghn: ghn.decoder.low_rank.weight[5].fill_(float("inf")),  # Inf in some blocks only
        lambda ghn: ghn.decoder.low_rank.weight.mul_(1e16),  # finite factors whose products would overflow
    ],
    ids=["nan", "inf", "overflow"],
)
@pytest.mark.parametrize("build", ["cpu", "meta"])
def test_a_bad_prediction_leaves_the_model_unchanged(poison, build):

    ghn = small_chunks()
    with torch.no_grad():
        poison(ghn)
    model = build_model(VIT, device=build)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(PredictError, match=r"predicted NaN or Inf for '[\w.]+'; the model was left unchanged"):
        predict(model, ghn)
    after = dict(model.named_parameters())
    assert all(after[n].is_meta if build == "meta" else torch.equal(after[n], before[n]) for n in before)


def test_predict_refuses_a_graph_of_another_model():
    model = build_model(VIT, device="cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    other = graphkit.trace(build_model(dict(VIT, hidden=64)))
    with pytest.raises(
        ParamsError, match=r"VisionTransformer: parameter '[\w.]+' has shape \[64\] but the model expects \[32\]"
    ):
        predict(model, small_chunks(), graph=other)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_predict_counts_only_what_it_allocates():
    ghn, graph = small_chunks(), graphkit.trace(build_model(GPT))
    in_place = build_model(GPT, device="cpu")
    predict(in_place, ghn, graph=graph, memory_limit=0)  # float32 weights: decoded straight into them, nothing new
    half = build_model(GPT, device="cpu").half()  # decoded through one float32 buffer the size of its largest parameter
    largest = 4 * max(p.numel() for p in half.parameters())
    before = {n: p.clone() for n, p in half.state_dict().items()}
    with pytest.raises(
        PredictError, match=r"GPT2LMHeadModel: its [\d,]+ predicted parameters need 0\.00 GB but 0\.00 GB"
    ):
        predict(half, ghn, graph=graph, memory_limit=largest - 1)
    assert all(torch.equal(p, before[n]) for n, p in half.state_dict().items())
    predict(half, ghn, graph=graph, memory_limit=largest)

"""Bad input to datasets: bad recipes and options are refused in one line before anything is
written, output folders that are not ours are never touched, concurrent runs are locked out,
and an interrupted or damaged dataset resumes to exactly what an uninterrupted run makes."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT
from typer.testing import CliRunner

import graphkit.datasets.generate as module
import graphkit.workers
from graphkit.cli import app
from graphkit.datasets import load, write_dataset
from graphkit.datasets.generate import GenerateError, generate, incomplete
from graphkit.datasets.store import StoreError, open_shard

runner = CliRunner()

BASE = {
    "name": "mini",
    "family": "vit",
    "max_params": 3_000_000,
    "bins": [{"layers": [1, 2], "hidden": [32, 64, 32]}],
    "heads": [{"choices": [2]}],
    "fixed": {"image_size": 8, "patch_size": 4},
    "eval_fraction": 0.25,
    "num": 6,
}


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
    refused(
        ["generate", recipe],
        "recipe name must be an identifier of at most 100 letters, digits, '.', '_' and '-', "
        "starting with a letter or digit, without '..' (it names the output folder); got '../../escaped-ds'",
    )
    assert listing(tmp_path) == before and not (tmp_path / "escaped-ds").exists()


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"bins": [{"layers": [1, 2], "hidden": [32, 64, 0]}]},
            "bins[0].hidden must be a list (low, high, step) of integers with "
            "1 <= low <= high <= 1,000,000 and step >= 1; got (32, 64, 0)",
        ),
        (
            {"bins": [{"layers": [-1, 2], "hidden": [32, 64, 32]}]},
            "bins[0].layers must be a list (low, high) of integers with 1 <= low <= high; got (-1, 2)",
        ),
        (
            {"heads": [{"choices": [0]}]},
            'heads[0].choices must be "divisors" or a non-empty list of integers >= 1; got (0,)',
        ),
        ({"heads": [{"choices": [2], "min_head_dim": 0}]}, "heads[0].min_head_dim must be an integer >= 1; got 0"),
        ({"eval_fraction": 5}, "eval_fraction must be a number in [0, 1); got 5"),
        ({"max_params": "lots"}, "max_params must be an integer >= 1; got 'lots'"),
        ({"max_params": -5}, "max_params must be an integer >= 1; got -5"),
        ({"num": 0}, "num must be an integer in 1..1,000,000; got 0"),
        (
            {"fixed": {"image_size": -8}},
            "fixed must be a mapping of config keys to null, true/false, "
            "strings or finite numbers >= 0; got {'image_size': -8}",
        ),
        ({"sliding_window": [0]}, "sliding_window must be a non-empty list of null or integers >= 1; got (0,)"),
        ({"attention": ["mqa"]}, "attention must be a non-empty list of null or gqa, kdgqa, dgqa, pgqa; got ('mqa',)"),
        ({"kv_heads": "all"}, "kv_heads must be null or \"divisors\"; got 'all'"),
        ({"bins": "wide"}, "bins must be a non-empty list of mappings with keys layers, hidden; got 'wide'"),
        ({"bins": [{"layers": [1, 2]}]}, "bins[0]: missing field 'hidden'"),
        (
            {"heads": [{"choices": [2], "size": 3}]},
            "heads[0]: unknown field 'size'; accepted fields: choices, hidden, min_head_dim",
        ),
        ({"family": "rnn"}, "family: unknown family 'rnn'; known families: gpt2, llama, timm, transformers, vit"),
        (
            {"hidden": [8]},
            "unknown field 'hidden'; accepted fields: name, family, bins, heads, max_params, fixed, choices, "
            "kv_heads, sliding_window, attention, eval_fraction, num, description",
        ),
        # the space is bounded before it is enumerated: these used to hang
        (
            {"bins": [{"layers": [1, 2], "hidden": [8, 2000000, 8]}]},
            "bins[0].hidden must be a list (low, high, step) of integers with "
            "1 <= low <= high <= 1,000,000 and step >= 1; got (8, 2000000, 8)",
        ),
        (
            {"bins": [{"layers": [1, 9], "hidden": [8, 200000, 8]}]},
            "bins span 225,000 (layers, hidden) pairs, more than the 10,000 "
            "a space may enumerate; use larger hidden steps or fewer layers",
        ),
        (
            {"bins": [{"layers": [1, 4], "hidden": [8, 8000, 8]}], "heads": [{"choices": "divisors"}]},
            "bins, heads and choices give 74,824 candidate architectures, more than the 10,000 a space may enumerate; "
            "use larger hidden steps, fewer layers, fewer head choices or fewer choices values",
        ),
        (
            {"choices": {"patch_size": [2, 2]}},
            "choices must be a mapping of config keys to non-empty lists of distinct null, "
            "true/false, strings or finite numbers >= 0; got {'patch_size': (2, 2)}",
        ),
        (
            {"choices": {"image_size": [8, 16]}},
            "choices key 'image_size' is also in fixed; a config key is either fixed or chosen",
        ),
    ],
)
def test_bad_recipe_fields_are_named(changes, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = recipe_file(tmp_path, **changes)
    refused(["generate", recipe], f"recipe 'mini': {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.json"]


# -- generate: options, folders, locks, identity, repair -------------------------------------


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    return recipe_file(tmp_path_factory.mktemp("recipe"))


@pytest.fixture(scope="module")
def reference(recipe, tmp_path_factory) -> Path:
    """An uninterrupted run: 6 records in 3 parts of 2."""
    out = tmp_path_factory.mktemp("reference") / "mini"
    result = generate(recipe, out, part_size=2)
    assert (result.records, result.parts_written) == (6, 3)
    return out


def dataset_rows(path: Path) -> list[dict]:
    return sorted((r.to_dict() for r in load(path)), key=lambda r: r["id"])


def content_hash(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["content_hash"]


def copy_of(reference: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    return out


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--workers", 0, "--workers must be an integer of at least 1, got 0"),
        ("--num", -5, "--num must be an integer of at least 1 and at most 1,000,000, got -5"),
        ("--num", 2_000_000, "--num must be an integer of at least 1 and at most 1,000,000, got 2000000"),
        ("--num-shards", 0, "--num-shards must be an integer of at least 1, got 0"),
        ("--shard-index", -1, "--shard-index must be in 0..0 for --num-shards 1, got -1"),
    ],
)
def test_bad_generate_options(option, value, message, recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(["generate", recipe, option, value], message)
    assert not any(tmp_path.iterdir())


def test_workers_are_capped_at_the_tasks(recipe, tmp_path, monkeypatch):

    pools = []

    class Pool:  # records the size asked for; traces in this process
        def __init__(self, max_workers, mp_context, **worker_setup):
            pools.append(max_workers)

        map = staticmethod(map)

        def shutdown(self, cancel_futures):
            pass

    monkeypatch.setattr(graphkit.workers, "_Pool", Pool)
    monkeypatch.setattr(module, "_warm_up", lambda: None)
    generate(recipe, tmp_path / "out", workers=1000)
    assert pools == [2]  # 4 architectures in 2 depth groups: 2 tasks, not 1,000 processes


@pytest.mark.parametrize("where", ["named", "cwd"])
def test_a_folder_that_is_not_a_dataset_is_never_written(where, recipe, tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n")
    (project / "manifest.json").write_text('{"mine": true}\n')
    before = listing(project)
    monkeypatch.chdir(project if where == "cwd" else tmp_path)
    out = "." if where == "cwd" else "project"
    refused(
        ["generate", recipe, "--out", out],
        f"--out {out}: is not empty and holds no graphkit dataset "
        "(no .graphkit-run.json or manifest.json); choose a new or empty folder",
    )
    assert listing(project) == before


def test_out_under_a_file_is_refused(recipe, tmp_path):
    (tmp_path / "file").write_text("x")
    refused(
        ["generate", recipe, "--out", tmp_path / "file" / "ds"],
        f"--out {tmp_path / 'file' / 'ds'}: {tmp_path / 'file'} is a file, not a folder",
    )


@pytest.mark.slow
def test_a_second_run_into_a_locked_folder_is_refused(reference, recipe, tmp_path):
    out = copy_of(reference, tmp_path)
    (out / "data" / "train-00001-of-00003.parquet").unlink()  # work the second run would do
    assert not (out / ".graphkit.lock").exists()  # a finished run leaves no lock file behind
    with open(out / ".graphkit.lock", "a") as held:  # the first run, still writing
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = listing(out)
        refused(
            ["generate", recipe, "--out", out, "--resume"],
            f"{out}: another graphkit generate is writing this folder; wait for it to finish, or choose another --out",
        )
        refused(
            ["generate", recipe, "--out", out, "--num-shards", 3, "--shard-index", 1],
            f"{out}: another graphkit generate is writing this folder; wait for it to finish, or choose another --out",
        )
        assert listing(out) == before
    with open(out / ".graphkit-shard-1-of-3.lock", "a") as held:  # shard 1 of 3, still running
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = listing(out)
        with pytest.raises(GenerateError, match=f"^{out}: another graphkit generate is making shard 1 of 3 here"):
            generate(recipe, out, part_size=2, num_shards=3, shard_index=1)
        assert listing(out) == before
    # the lock dies with its holder: the same run now finishes the dataset
    assert generate(recipe, out, part_size=2, resume=True).parts_written == 1
    assert content_hash(out) == content_hash(reference)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--num", 8], "made with --num 6; this run asks for --num 8"),
        (["--seed", 7], "made with --seed 0; this run asks for --seed 7"),
        (["--attention", "gqa"], "made with recipe mini; this run asks for recipe mini-gqa"),
        (["--num-shards", 2, "--num", 5], "made with --num 6; this run asks for --num 5"),
    ],
)
def test_resume_and_shards_must_match_the_recorded_run(args, message, reference, recipe, tmp_path):
    out = copy_of(reference, tmp_path)
    before = listing(out)
    refused(
        ["generate", recipe, "--out", out, "--resume", *args],
        f"{out} holds a dataset {message}. Rerun with the same options to finish it, or choose another --out",
    )
    with pytest.raises(GenerateError, match="made with part_size 2; this run asks for part_size 3"):
        generate(recipe, out, part_size=3, resume=True)
    assert listing(out) == before


def test_another_recipe_is_refused_even_as_a_shard(reference, tmp_path):
    out = copy_of(reference, tmp_path)
    before = listing(out)
    with pytest.raises(
        GenerateError, match=f"^{out} holds a dataset made with recipe mini; this run asks for recipe tiny-vits"
    ):
        generate(str(ROOT / "tests" / "recipes" / "tiny-vits.json"), out, part_size=2, num_shards=2, shard_index=1)
    with pytest.raises(
        GenerateError,
        match=f"^{out} holds a dataset made with recipe 'mini' with max_params 3000000; "
        "this run asks for recipe 'mini' with max_params 2000000",
    ):
        generate(recipe_file(tmp_path, max_params=2_000_000), out, part_size=2, resume=True)
    assert listing(out) == before


@pytest.mark.slow
def test_an_interrupted_first_run_records_what_it_makes(reference, recipe, tmp_path):
    out = tmp_path / "interrupted"

    def interrupt(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(recipe, out, part_size=2, progress=interrupt)
    assert not (out / "manifest.json").exists() and (out / ".graphkit-run.json").is_file()
    with pytest.raises(GenerateError, match="made with --seed 0; this run asks for --seed 3"):
        generate(recipe, out, part_size=2, seed=3, resume=True)
    generate(recipe, out, part_size=2, resume=True)
    assert dataset_rows(out) == dataset_rows(reference) and content_hash(out) == content_hash(reference)


@pytest.mark.slow
def test_resume_continues_the_recorded_num_and_part_size(recipe, tmp_path):
    out = tmp_path / "four"
    generate(recipe, out, num=4, part_size=2)  # the recipe draws 6 records, the part size is 100 by default
    (out / "data" / "eval-00001-of-00002.parquet").unlink()
    result = generate(recipe, out, resume=True)  # neither given: the recorded run's
    assert (result.parts_written, result.parts_skipped) == (1, 1) and len(load(out)) == 4


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100:400] = bytes(300)  # inside the column data, the footer intact
    path.write_bytes(bytes(data))


def swap_in_another_part(path: Path) -> None:
    shutil.copy(path.with_name("train-00000-of-00003.parquet"), path)


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda p: p.unlink(), None),  # killed before the part was written: redone quietly
        (truncate, "not a readable Parquet file"),
        (corrupt, "corrupted Parquet data"),
        (swap_in_another_part, "holds other rows than this part's (1 found, 2 expected)"),
    ],
)
@pytest.mark.slow
def test_resume_redoes_damaged_parts_to_the_uninterrupted_result(damage, reason, reference, recipe, tmp_path):
    out = copy_of(reference, tmp_path)
    (out / "manifest.json").unlink()  # the run was interrupted before its end
    part = out / "data" / "train-00001-of-00003.parquet"
    damage(part)
    result = run("generate", recipe, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    warnings = result.stderr.strip().splitlines()
    if reason is None:
        assert warnings == []
    else:
        assert (
            len(warnings) == 1
            and warnings[0].startswith(f"warning: redoing part 1: {part}: ")
            and reason in warnings[0]
        )
    assert "wrote 2 records" in result.stdout and "1 parts, 2 already there" in result.stdout
    assert dataset_rows(out) == dataset_rows(reference) and content_hash(out) == content_hash(reference)
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted(p.name for p in (reference / "data").iterdir())


# -- ls, stats, shards ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["ls", "{ds}", "--limit", -1], "--limit must be at least 0, got -1"),
        (["ls", "{ds}", "--layers", 0], "--layers must be at least 1, got 0"),
        (["ls", "{ds}", "--heads", -2], "--heads must be at least 1, got -2"),
        (["ls", "{ds}", "--min-params", -1], "--min-params must be at least 0, got -1"),
        (["ls", "{ds}", "--min-params", 5, "--max-params", 4], "--min-params 5 is above --max-params 4"),
        (["ls", "{ds}", "--split", "bogus"], "--split bogus: {ds} has no such split; its splits: eval, train"),
        (["stats", "{ds}", "--bins", 0], "--bins must be in 1..1000, got 0"),
        (["stats", "{ds}", "--bins", 10**9], "--bins must be in 1..1000, got 1000000000"),
        (["stats", "{ds}", "--png", "existdir"], "--png existdir: is a folder; give a file name"),
        (
            ["stats", "{ds}", "--png", "out.xyz"],
            "--png out.xyz: unsupported extension '.xyz'; accepted: .png, .svg, .pdf",
        ),
        (
            ["stats", "{ds}", "--png", "note.txt/fig.png"],
            "--png note.txt/fig.png: {tmp}/note.txt is a file, not a folder",
        ),
    ],
)
def test_ls_and_stats_options(args, message, reference, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existdir").mkdir()
    (tmp_path / "note.txt").write_text("x")
    before = listing(tmp_path)
    refused([str(a).format(ds=reference) for a in args], message.format(ds=reference, tmp=tmp_path))
    assert listing(tmp_path) == before


def test_stats_writes_the_figure_format_asked_for(reference, tmp_path):
    result = run("stats", reference, "--png", tmp_path / "fig.svg")
    assert result.exit_code == 0 and result.stderr == ""
    assert (tmp_path / "fig.svg").read_text().lstrip().startswith("<?xml") and not list(tmp_path.glob(".*"))


def test_ls_and_stats_warn_about_an_interrupted_dataset(reference, recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = copy_of(reference, tmp_path)
    complete = run("ls", out)
    assert complete.exit_code == 0 and complete.stderr == ""
    (out / "manifest.json").unlink()
    (out / "data" / "train-00002-of-00003.parquet").unlink()
    (out / "data" / "eval-00002-of-00003.parquet").unlink()
    warning = (
        f"warning: {out} is incomplete (4 of 6 records, no manifest.json): its graphkit generate was "
        f"interrupted; finish it with `graphkit generate RECIPE_FILE --out {out} --num 6 --seed 0 --resume`"
    )
    for args in (["ls", out], ["stats", out, "--png", "fig.png"]):
        result = run(*args)
        assert result.exit_code == 0 and result.stderr.strip() == warning
    assert "4 of 4 matching records" in run("ls", out).stdout


@pytest.mark.slow
def test_the_warning_names_a_built_in_recipe(tmp_path):
    out = tmp_path / "ds"
    generate("vits-digits", out, num=1, part_size=1, attention="gqa")
    (out / "manifest.json").unlink()

    assert incomplete(out, 1) == (
        f"{out} is incomplete (no manifest.json): its graphkit generate was interrupted; "
        f"finish it with `graphkit generate vits-digits --out {out} --num 1 --seed 0 --attention gqa --resume`"
    )


def test_a_shard_missing_columns_is_named(tmp_path):

    shard = tmp_path / "ds" / "data" / "train-00000-of-00001.parquet"
    shard.parent.mkdir(parents=True)
    table = pa.table({"id": ["a"]}).replace_schema_metadata({"graphkit_schema_version": "1"})
    pq.write_table(table, shard)
    refused(
        ["ls", tmp_path / "ds"],
        f"{shard}: not a complete graphkit dataset shard: missing columns family, split, "
        "num_params, num_layers, hidden, heads, kv_heads, attention, mlp, num_nodes, num_edges, fingerprint, config, "
        "node_op, node_name, node_module, node_param_names, "
        "node_param_shapes, node_attrs, edge_src, edge_dst, graph_meta",
    )
    table = pa.table({"id": [1]}).replace_schema_metadata({"graphkit_schema_version": "1"})
    pq.write_table(table, shard)

    with pytest.raises(StoreError, match="missing columns family"):
        open_shard(shard)


def test_an_empty_selection_to_pyg_is_a_clear_error(reference):

    with pytest.raises(
        StoreError, match=r"^no records to convert to torch_geometric \(the dataset or its filter is empty\)$"
    ):
        load(reference).filter(num_layers=99).to_pyg()


def test_write_dataset_never_overwrites_a_project(tmp_path):

    (tmp_path / "README.md").write_text("# my project\n")
    before = listing(tmp_path)
    with pytest.raises(StoreError, match=f"^dataset folder {tmp_path}: is not empty and holds no graphkit dataset"):
        write_dataset([], tmp_path, name="demo")
    assert listing(tmp_path) == before


def test_a_hand_edited_run_file_does_not_break_the_warning(reference, tmp_path):

    out = copy_of(reference, tmp_path)
    (out / "manifest.json").unlink()
    (out / ".graphkit-run.json").write_text(
        json.dumps({"recipe": {"name": "vits-1k"}, "attention": "zzz", "num": "many"})
    )
    assert incomplete(out, 6) == (
        f"{out} is incomplete (no manifest.json): its graphkit generate was interrupted; "
        f"finish it with `graphkit generate RECIPE_FILE --out {out} --num many --attention zzz --resume`"
    )


def test_a_shard_with_no_parts_says_so(recipe, tmp_path):
    result = run("generate", recipe, "--out", tmp_path / "ds", "--num-shards", 2, "--shard-index", 1)
    assert result.exit_code == 0, result.output
    assert (
        "wrote 0 records" in result.stdout
        and "dataset now holds no records yet (other shards to come)" in result.stdout
    )

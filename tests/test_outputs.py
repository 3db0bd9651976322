"""The rule for outputs, for every command that writes (graphkit.fileio): a file is graphkit's only
when its format carries graphkit's mark naming its kind; a command replaces only its own kind and
refuses another, naming both; a symbolic link, live or dangling, is never written through or
over; a folder holding another kind of graphkit output is refused. Every refusal comes before
any work (the commands below would fail at their first step: a model that raises, a dataset
that does not exist) and leaves everything as it was."""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat

import pytest
import torch
from helpers import MODEL_FILES, ROOT, one_line_error
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

import graphkit.fileio as fileio
from graphkit import ArchGraph
from graphkit.cli import app
from graphkit.fileio import (
    KINDS,
    OutputError,
    check_output_file,
    describe_kind,
    folder_kind,
    graphkit_kind,
    mark,
    marked_json,
    marked_svg,
    marked_text,
    save_figure,
    save_safetensors,
    write_text_atomic,
)
from graphkit.ghn.checkpoint import save_checkpoint
from graphkit.ghn.config import LoGAHConfig
from graphkit.ghn.model import LoGAH

runner = CliRunner()
RAISES = MODEL_FILES / "build_raises.py"  # fails when it runs: a refusal before it is a check before any work
TINY_RECIPE = ROOT / "tests" / "recipes" / "tiny-vits.json"
FILE_KINDS = [kind for kind in KINDS if kind != "dataset"]  # a dataset is a folder
FIGURE_KINDS = ("drawing", "histogram", "evaluation-figure", "training-figure")
OUT, FOLDER, NOWHERE = "{out}", "{folder}", "{nowhere}"


def run(args, **paths):
    """``graphkit args``, the placeholders replaced by ``paths``."""
    return runner.invoke(app, [str(paths.get(a.strip("{}"), a)) if isinstance(a, str) else str(a) for a in args])


def assert_kind_rule(line: str, place: str, found: str, kind: str, refusal: str) -> None:
    """``line`` refuses ``place`` (an option and a path) holding graphkit's ``found`` where the
    command writes ``kind``; or, for its own kind, is about something else: the command went on."""
    if found == kind:
        assert "holds graphkit's" not in line, line
    else:
        assert line == (
            f"error: {place}: holds graphkit's {describe_kind(found, article=False)}, not {describe_kind(kind)}; "
            f"{refusal}"
        )


def link_refusal(place: str, dangling: bool) -> str:
    """The error line for ``place`` (an option and a path) naming a symbolic link."""
    state = " (dangling)" if dangling else ""
    return (
        f"error: {place}: is a symbolic link{state}; graphkit never writes through or over a link "
        "(give the path it points to, or another name)"
    )


def listing(folder):
    """Every path under ``folder``: the bytes of a file, where a link points, or "folder"."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path)] = f"-> {os.readlink(path)}"
        else:
            found[str(path)] = path.read_bytes() if path.is_file() else "folder"
    return found


@pytest.fixture(scope="module")
def figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1), dpi=20)
    fig.add_subplot().plot([0, 1])
    return fig


@pytest.fixture(scope="module")
def samples(tmp_path_factory, figure):
    """The bytes of a small file of every kind, written by the writers the commands use."""
    folder = tmp_path_factory.mktemp("samples")
    made = {}
    for kind in FILE_KINDS:
        if kind in FIGURE_KINDS:
            path = save_figure(figure, folder / f"{kind}.png", kind)
        elif kind.endswith("weights"):
            path = save_safetensors({"w": torch.ones(2)}, folder / f"{kind}.safetensors", kind)
        elif kind == "summary":
            path = write_text_atomic(folder / "summary.txt", marked_text(kind, "Net: 20 parameters\n"))
        else:
            path = write_text_atomic(folder / f"{kind}.json", marked_json(kind, {"nodes": [], "edges": []}))
        made[kind] = path.read_bytes()
    return made


def unproven_files():
    """Files graphkit cannot prove it wrote, by what they are."""
    fingerprint = b"fingerprint 0123456789abcdef0123456789abcdef\n"
    return {
        "notes": b"my notes\n",
        # `graphkit trace m.py >> notes.md`: a summary pasted at the end used to count as graphkit's
        "notes ending in a pasted summary": b"my notes\n\nNet: 20 parameters, 3 nodes\n" + fingerprint,
        # a graph's keys are any JSON's to hold
        "a user's JSON with a graph's keys": json.dumps({"nodes": [], "edges": [], "meta": {}}).encode(),
        "a user's JSON with graphkit inside": json.dumps({"run": {"graphkit": {"kind": "graph"}}}).encode(),
        "a user's text naming graphkit on its second line": b"notes\n# graphkit 0.1.0 summary\n",
        # lookalikes: a word where the version goes, a kind graphkit never writes, a loose stamp
        "notes headed like a summary": b"# graphkit usage summary\nhow I use it\n",
        "notes naming a kind graphkit never writes": b"# graphkit 0.1.0 notes\n",
        "an SVG headed like a drawing": b'<!-- graphkit logo drawing -->\n<svg xmlns="http://www.w3.org/2000/svg"/>\n',
        "settings with a graphkit section": json.dumps({"graphkit": {"kind": "graph"}, "theme": "dark"}).encode(),
        "settings whose graphkit section says more": json.dumps(
            {"graphkit": {"kind": "evaluation", "version": "0.1.0", "colour": "blue"}}
        ).encode(),
        "settings whose graphkit version is a word": json.dumps(
            {"graphkit": {"kind": "graph", "version": "mine"}}
        ).encode(),
        "settings whose graphkit kind is a list": json.dumps(
            {"graphkit": {"kind": ["graph"], "version": "1.0"}}
        ).encode(),
    }


def old_graphkit_files(tmp_path, figure):
    """Files a graphkit from before marks wrote: a version and no kind. Refused like a user's."""
    weights = tmp_path / "old.safetensors"
    save_file({"w": torch.ones(2)}, str(weights), metadata={"graphkit": "0.1.0"})
    lookalike = tmp_path / "lookalike.safetensors"  # a word where the version goes
    save_file({"w": torch.ones(2)}, str(lookalike), metadata={"graphkit": "graphkit my-run weights"})
    picture = tmp_path / "old.png"
    figure.savefig(picture, format="png", metadata={"Software": "graphkit 0.1.0"})
    return {
        "old weights": weights.read_bytes(),
        "an old drawing": picture.read_bytes(),
        "weights headed like graphkit's": lookalike.read_bytes(),
    }


# -- what each format's mark is, and is not ---------------------------------------------------
def test_every_writer_marks_its_kind_and_the_reader_finds_it(samples, figure, tmp_path):
    for kind, data in samples.items():
        (tmp_path / kind).write_bytes(data)
        assert graphkit_kind(tmp_path / kind) == kind
    for suffix in (".svg", ".pdf"):
        assert graphkit_kind(save_figure(figure, tmp_path / f"f{suffix}", "histogram")) == "histogram"
    svg = tmp_path / "hand.svg"
    svg.write_text(marked_svg("drawing", '<svg xmlns="http://www.w3.org/2000/svg"></svg>\n'))
    assert graphkit_kind(svg) == "drawing" and svg.read_text().startswith("<!-- graphkit ")
    assert (tmp_path / "f.svg").read_text().startswith('<?xml version="1.0"')  # the declaration stays first


def test_no_other_file_counts_as_graphkits(tmp_path, figure):
    files = {**unproven_files(), **old_graphkit_files(tmp_path, figure)}
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><!-- graphkit 0.1.0 drawing --></svg>\n'
    files["an SVG naming graphkit inside"] = svg.encode()
    for name, data in files.items():
        path = tmp_path / "file"
        path.write_bytes(data)
        assert graphkit_kind(path) is None, name
    assert graphkit_kind(tmp_path / "missing") is None and graphkit_kind(tmp_path) is None


def test_graphkits_files_get_the_umasks_mode(tmp_path, figure):
    """safetensors' save_file creates 0600 files; graphkit's writers give what open() would."""
    previous = os.umask(0o022)
    try:
        written = [
            save_safetensors({"w": torch.ones(1)}, tmp_path / "w.safetensors", "weights"),
            save_figure(figure, tmp_path / "f.png", "drawing"),
        ]
        # train-ghn's final hypernetwork (its optimizer state goes through the same save_safetensors;
        # a torch optimizer is left out: the first one built in a process costs seconds)
        ghn = LoGAH(LoGAHConfig(hidden=32, layers=1, heads=2, rank=8, max_mask=4096))
        checkpoint = save_checkpoint(tmp_path / "run", ghn, {"variant": "custom"})
        written.append(checkpoint / "model.safetensors")
    finally:
        os.umask(previous)
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in written} == {path.name: 0o644 for path in written}
    assert graphkit_kind(checkpoint / "model.safetensors") == "hypernetwork" == folder_kind(checkpoint)


def test_library_writers_check_the_same_way(tmp_path):
    """check_output_file is what graphkit.draw and graphkit.params.save_params call too."""
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(OutputError, match=r"link.json: is a symbolic link \(dangling\)"):
        check_output_file(link, "draw path", kind="drawing")
    with pytest.raises(ValueError, match="unknown kind of output 'picture'"):
        check_output_file(tmp_path / "new.png", kind="picture")


# -- every command that writes a file ---------------------------------------------------------
#: command: (its arguments, the file it writes relative to {folder}, the option naming it, its kind)
FILE_WRITERS = {
    "trace": (["trace", RAISES, "--out", OUT], "out.json", "--out", "graph"),
    "trace --format text": (["trace", RAISES, "--format", "text", "--out", OUT], "out.txt", "--out", "summary"),
    "draw": (["draw", RAISES, "--out", OUT], "out.png", "--out", "drawing"),
    "stats --png": (["stats", NOWHERE, "--png", OUT], "out.png", "--png", "histogram"),
    "predict": (["predict", RAISES, "--out", OUT], "out.safetensors", "--out", "predicted-weights"),
    "convert": (
        ["convert", RAISES, "-a", "gqa", "-k", "1", "--out", OUT],
        "out.safetensors",
        "--out",
        "converted-weights",
    ),
    "compile": (["compile", NOWHERE, "some-id", "--out", OUT], "out.safetensors", "--out", "compiled-weights"),
    "eval-ghn's eval.json": (["eval-ghn", "--dataset", NOWHERE, "--out", FOLDER], "eval.json", "--out", "evaluation"),
    "eval-ghn's eval.png": (
        ["eval-ghn", "--dataset", NOWHERE, "--out", FOLDER],
        "eval.png",
        "--out",
        "evaluation-figure",
    ),
}


def invoke(command, tmp_path):
    """Run ``command`` of FILE_WRITERS against tmp_path/out; returns its result, the output path,
    the option and the kind."""
    args, name, option, kind = FILE_WRITERS[command]
    out = tmp_path / "out" / name
    return run(args, out=out, folder=out.parent, nowhere=tmp_path / "no-dataset"), out, option, kind


@pytest.fixture
def out_folder(tmp_path):
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


@pytest.mark.parametrize(
    "case", list(unproven_files()) + ["old weights", "an old drawing", "weights headed like graphkit's"]
)
@pytest.mark.parametrize("command", FILE_WRITERS)
def test_a_file_graphkit_cannot_prove_it_wrote_is_never_replaced(command, case, out_folder, tmp_path, figure):
    data = {**unproven_files(), **old_graphkit_files(tmp_path, figure)}[case]
    (out_folder / FILE_WRITERS[command][1]).write_bytes(data)
    before = listing(out_folder)
    result, out, option, _ = invoke(command, tmp_path)
    assert one_line_error(result) == (
        f"error: {option} {out}: exists and was not written by graphkit; refusing to overwrite it "
        "(remove it, or choose another name)"
    )
    assert listing(out_folder) == before


@pytest.mark.parametrize("other", FILE_KINDS)
@pytest.mark.parametrize("command", FILE_WRITERS)
def test_a_graphkit_file_of_another_kind_is_refused_naming_both(command, other, samples, out_folder, tmp_path):
    """`trace --out p.safetensors` over compiled weights wrote a JSON graph there and exited 0;
    so did `predict --out` over a graph and `compile --out` over a drawing."""
    (out_folder / FILE_WRITERS[command][1]).write_bytes(samples[other])
    before = listing(out_folder)
    result, out, option, kind = invoke(command, tmp_path)
    refusal = "refusing to replace it (remove it, or choose another name)"
    assert_kind_rule(one_line_error(result), f"{option} {out}", other, kind, refusal)
    assert listing(out_folder) == before


@pytest.mark.parametrize("dangling", [False, True], ids=["live", "dangling"])
@pytest.mark.parametrize("command", FILE_WRITERS)
def test_a_symbolic_link_is_never_written_through_or_over(command, dangling, samples, out_folder, tmp_path):
    """`--out` naming a dangling link replaced the link with a file; a live one wrote through it."""
    kind = FILE_WRITERS[command][3]
    target = tmp_path / "elsewhere"
    if not dangling:
        target.write_bytes(samples[kind])  # even graphkit's own kind: the link is what is refused
    (out_folder / FILE_WRITERS[command][1]).symlink_to(target)
    before = listing(tmp_path)
    result, out, option, _ = invoke(command, tmp_path)
    assert one_line_error(result) == link_refusal(f"{option} {out}", dangling)
    assert listing(tmp_path) == before


# -- trace's text and JSON on stdout and in --out ---------------------------------------------
@pytest.fixture
def tiny_model(tmp_path):
    model = tmp_path / "tiny.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\nmodel = nn.Sequential(nn.Linear(4, 4), nn.ReLU())\n\n\n"
        "def example_inputs():\n    return (torch.ones(1, 4),)\n"
    )
    return model


@pytest.mark.slow
def test_a_summary_piped_into_notes_leaves_them_the_users(tiny_model, tmp_path):
    """`graphkit trace m.py >> notes.md`, then `trace --format text --out notes.md`, wiped the
    notes: their last line was the summary's fingerprint. Only --out marks a summary, at its top."""
    printed = run(["trace", tiny_model])
    assert printed.exit_code == 0 and "# graphkit" not in printed.stdout
    appended, started = tmp_path / "appended.md", tmp_path / "started.md"
    appended.write_text("my notes\n" + printed.stdout)
    started.write_text(printed.stdout + "my notes\n")  # `graphkit trace m.py > notes.md`, then written on
    for notes in (appended, started):
        before = notes.read_text()
        assert one_line_error(run(["trace", tiny_model, "--format", "text", "--out", notes])).endswith(
            "exists and was not written by graphkit; refusing to overwrite it (remove it, or choose another name)"
        )
        assert notes.read_text() == before
    written = tmp_path / "summary.md"
    assert run(["trace", tiny_model, "--format", "text", "--out", written]).exit_code == 0
    assert written.read_text().splitlines()[0] == f"# {mark('summary')}"
    assert graphkit_kind(written) == "summary"


def test_a_graph_on_stdout_is_the_marked_document_trace_writes(tiny_model, tmp_path):
    """`trace -f json > g.json` is the graph `--out g.json` writes, so a later --out replaces it."""
    printed = run(["trace", tiny_model, "--format", "json"])
    marked = json.loads(printed.stdout)
    assert printed.exit_code == 0 and marked["graphkit"]["kind"] == "graph"
    unmarked = json.dumps({key: value for key, value in marked.items() if key != "graphkit"})  # as before marks
    assert ArchGraph.from_json(printed.stdout).to_dict() == ArchGraph.from_json(unmarked).to_dict()
    redirected = tmp_path / "g.json"
    redirected.write_text(printed.stdout)
    assert run(["trace", tiny_model, "--out", redirected]).exit_code == 0
    assert graphkit_kind(redirected) == "graph"


# -- every command that writes a folder -------------------------------------------------------
#: command: (its arguments, the kind of folder it writes)
FOLDER_WRITERS = {
    "generate": (["generate", TINY_RECIPE, "--out", FOLDER, "--num-shards", "2", "--shard-index", "5"], "dataset"),
    "generate zoo-vits": (["generate", "zoo-vits", "--out", FOLDER], "dataset"),
    "train-ghn": (["train-ghn", "--dataset", NOWHERE, "--out", FOLDER, "--resume"], "hypernetwork"),
    "eval-ghn": (["eval-ghn", "--dataset", NOWHERE, "--out", FOLDER], "evaluation"),
}


def make_folder(kind, folder):
    """A folder as graphkit leaves it for ``kind``: the file that tells its kind (fileio.FOLDER_MARKERS)."""
    folder.mkdir()
    if kind == "dataset":
        (folder / ".graphkit-run.json").write_text("{}")
    else:
        write_text_atomic(folder / ("config.json" if kind == "hypernetwork" else "eval.json"), marked_json(kind, {}))


@pytest.mark.parametrize("other", ["dataset", "hypernetwork", "evaluation"])
@pytest.mark.parametrize("command", FOLDER_WRITERS)
def test_a_folder_holding_another_kind_of_graphkit_output_is_refused(command, other, tmp_path):
    args, kind = FOLDER_WRITERS[command]
    folder = tmp_path / "out"
    make_folder(other, folder)
    before = listing(tmp_path)
    line = one_line_error(run(args, folder=folder, nowhere=tmp_path / "no-dataset"))
    # its own kind: the folder's own checks come next (resume, identity, ...)
    assert_kind_rule(line, f"--out {folder}", other, kind, "refusing to write into it (choose another folder)")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("dangling", [False, True], ids=["live", "dangling"])
@pytest.mark.parametrize("command", FOLDER_WRITERS)
def test_a_folder_that_is_a_symbolic_link_is_refused(command, dangling, tmp_path):
    args, _ = FOLDER_WRITERS[command]
    target, link = tmp_path / "elsewhere", tmp_path / "out"
    if not dangling:
        target.mkdir()
    link.symlink_to(target)
    before = listing(tmp_path)
    line = one_line_error(run(args, folder=link, nowhere=tmp_path / "no-dataset"))
    assert line == link_refusal(f"--out {link}", dangling)
    assert listing(tmp_path) == before


def test_the_same_tensors_save_to_the_same_bytes(tmp_path):
    """safetensors orders its metadata by a hash map's whim; graphkit sorts it, so a checkpoint's
    hash says whether two runs agree (the resume test compares them), and the file still loads."""
    tensors = {"b": torch.arange(3.0), "a": torch.ones(2, 2)}
    metadata = {f"graphkit_{i}": str(i) for i in range(8)} | {"format": "pt"}
    paths = [save_safetensors(tensors, tmp_path / f"{i}.safetensors", "weights", metadata) for i in range(6)]
    saved = [path.read_bytes() for path in paths]
    assert len(set(saved)) == 1
    with safe_open(tmp_path / "0.safetensors", "pt") as f:
        assert f.metadata() == {**metadata, "graphkit": mark("weights")}
        assert torch.equal(f.get_tensor("a"), tensors["a"])


def test_a_source_checkout_that_is_not_installed_records_its_own_version(monkeypatch):
    """Run with ``PYTHONPATH=.`` (a lent GPU machine), graphkit is not installed: its marks and
    checkpoints record the checkout's pyproject.toml version, not "unknown"."""
    installed = fileio.version()

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(fileio, "installed", not_installed)
    assert fileio.version() == installed == importlib.metadata.version("graphkit") != "unknown"


def test_a_registered_kind_is_marked_recognised_and_kept_apart(monkeypatch, tmp_path):
    """register_kind makes a new output kind one call: its marks are recognised, a command
    writing it replaces its own files and refuses another kind's, and its folders are told by
    their marker file; an unregistered word in a mark is not graphkit's."""
    monkeypatch.setattr(fileio, "KINDS", dict(fileio.KINDS))
    monkeypatch.setattr(fileio, "FOLDER_MARKERS", dict(fileio.FOLDER_MARKERS))
    report = write_text_atomic(tmp_path / "report.md", marked_text("summary", "x").replace("summary", "report-card"))
    assert graphkit_kind(report) is None  # not a kind yet: a user's comment
    fileio.register_kind("report-card", "a report card", folder_marker="card.md")
    fileio.register_kind("report-card", "a report card", folder_marker="card.md")  # the same again: a no-op
    assert graphkit_kind(report) == "report-card"
    assert check_output_file(report, kind="report-card") == report
    with pytest.raises(OutputError, match="holds graphkit's report card, not a graph summary"):
        check_output_file(report, kind="summary")
    (tmp_path / "cards").mkdir()
    write_text_atomic(tmp_path / "cards" / "card.md", marked_text("report-card", "y"))
    assert folder_kind(tmp_path / "cards") == "report-card"
    for kind, words, error in [("Report", "x", "lower-case"), ("report-card", "a card", "registered already")]:
        with pytest.raises(ValueError, match=error):
            fileio.register_kind(kind, words)

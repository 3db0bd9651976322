"""The hypernetwork's data sources: batches shaped for any config, built only from local files."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from graphkit.errors import GraphkitError
from graphkit.families import build_model, resolve_config
from graphkit.training import data as sources
from graphkit.training.data import DEFAULT_SOURCES, DataError, default_source, load_source, output_loss


def vit(**kw):
    return resolve_config(
        {"family": "vit", "num_layers": 1, "hidden": 32, "heads": 2, "image_size": 32, "patch_size": 4, **kw}
    )


def gpt2(**kw):
    return resolve_config(
        {"family": "gpt2", "num_layers": 1, "hidden": 32, "heads": 2, "vocab_size": 300, "context": 32, **kw}
    )


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def unnormalise(x, scale=255):
    """Batch pixels back to the source's integer values (the inverse of mean 0.5 / std 0.5 on [0, 1])."""
    return ((x * 0.5 + 0.5) * scale).round().long()


@pytest.fixture(scope="module")
def digits():
    return load_source("digits")


def test_digits_batch_is_resized_repeated_and_normalised(digits):
    x, y = digits.batch(vit(), 16, gen())
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64 and 0 <= y.min() and y.max() < 10
    assert x.min() == -1 and x.max() <= 1  # digit backgrounds are 0 -> -1 after normalisation
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])  # the one channel, repeated
    small, _ = digits.batch(vit(image_size=8, patch_size=4, in_chans=1), 16, gen())
    assert torch.allclose(x[:, :1], F.interpolate(small, size=(32, 32), mode="bilinear", antialias=False), atol=1e-6)


def test_digits_native_batch_matches_sklearn_images_and_labels(digits):
    from sklearn.datasets import load_digits

    data = load_digits()
    pixels = torch.from_numpy(data.data).long()  # values 0..16
    x, y = digits.batch(vit(image_size=8, patch_size=4, in_chans=1), 32, gen(3), split="eval")
    assert x.shape == (32, 1, 8, 8)
    for image, label in zip(unnormalise(x, 16).view(32, 64), y):
        rows = (pixels == image).all(1).nonzero().flatten()
        assert len(rows) and (torch.from_numpy(data.target)[rows] == label).any()


def test_digits_split_sizes_and_determinism(digits):
    assert digits.task == "image" and digits.spec == "digits" and digits.num_classes == 10
    assert digits.describe() == "digits: 1,437 train / 360 eval images, 10 classes, 8x8x1"
    again = load_source("digits")
    for split in ("train", "eval"):
        a, b = digits.batch(vit(), 8, gen(5), split), again.batch(vit(), 8, gen(5), split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(digits.batch(vit(), 8, gen(5))[0], digits.batch(vit(), 8, gen(6))[0])
    assert not torch.equal(digits.batch(vit(), 8, gen(5))[0], digits.batch(vit(), 8, gen(5), "eval")[0])


def test_bad_split_names_the_accepted_ones(digits):
    with pytest.raises(ValueError, match="train, eval.*'test'"):
        digits.batch(vit(), 2, gen(), split="test")


def _cifar_batch(labels, coarse=False):
    """A CIFAR pickle as torchvision reads it: rows of 1024 R, 1024 G, 1024 B; R = 10 * label."""
    data = np.empty((len(labels), 3, 1024), dtype=np.uint8)
    data[:, 0] = np.array(labels)[:, None] * 10
    data[:, 1], data[:, 2] = 100, 200
    key = "fine_labels" if coarse else "labels"
    return {
        "batch_label": "test",
        key: list(labels),
        "data": data.reshape(len(labels), 3072),
        "filenames": [f"{i}.png" for i in range(len(labels))],
    }


def write_cifar(root, per_batch=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(_cifar_batch([(i + j) % 10 for j in range(per_batch)])))
    (folder / "test_batch").write_bytes(pickle.dumps(_cifar_batch(list(range(per_batch)))))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072})
    )
    return folder


def test_cifar10_folder_loads_from_root_or_batches_folder(tmp_path):
    folder = write_cifar(tmp_path)
    for spec in (f"cifar10:{tmp_path}", f"cifar10:{folder}"):
        source = load_source(spec)
        assert source.describe() == f"{spec}: 20 train / 4 eval images, 10 classes, 32x32x3"
        x, y = source.batch(vit(), 12, gen())
        assert x.shape == (12, 3, 32, 32) and y.dtype == torch.int64
        pixels = unnormalise(x)
        assert (pixels[:, 0] == 10 * y[:, None, None]).all()  # channel order and labels survive the HWC round trip
        assert (pixels[:, 1] == 100).all() and (pixels[:, 2] == 200).all()


def test_cifar_resize_and_grey_follow_the_config(tmp_path):
    source = load_source(f"cifar10:{write_cifar(tmp_path)}")
    x, _ = source.batch(vit(), 6, gen(1), "eval")
    small, _ = source.batch(vit(image_size=16), 6, gen(1), "eval")
    assert torch.allclose(small, F.interpolate(x, size=(16, 16), mode="bilinear", antialias=False), atol=1e-6)
    grey, _ = source.batch(vit(in_chans=1), 6, gen(1), "eval")
    assert grey.shape == (6, 1, 32, 32) and torch.allclose(grey, x.mean(1, keepdim=True), atol=1e-6)


def test_cifar100_class_count_is_checked(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps(_cifar_batch([1, 2, 3], coarse=True)))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"c{i}" for i in range(100)]}))
    source = load_source(f"cifar100:{tmp_path}")
    assert source.num_classes == 100 and source.batch(vit(num_classes=100), 2, gen())[0].shape == (2, 3, 32, 32)
    with pytest.raises(DataError, match="100 classes but the vit config has num_classes 10"):
        source.batch(vit(), 2, gen())


def test_bad_cifar_folders_name_the_path_and_files(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path}.*cifar-10-batches-py/ with data_batch_1.*batches.meta"):
        load_source(f"cifar10:{tmp_path}")
    folder = write_cifar(tmp_path)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="UnpicklingError"):
        load_source(f"cifar10:{tmp_path}")


def write_images(folder, per_class, size=(20, 12)):
    """PNGs of two classes told apart by colour: ``red`` is (255, 0, 0), ``blue`` (0, 0, 255)."""
    for name, colour in (("blue", (0, 0, 255)), ("red", (255, 0, 0))):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, colour).save(folder / name / f"{i}.png")


def test_imagefolder_single_folder_is_split_90_10(tmp_path):
    write_images(tmp_path, 10)
    source = load_source(f"imagefolder:{tmp_path}")
    assert source.sizes == {"train": 18, "eval": 2} and source.num_classes == 2
    x, y = source.batch(vit(image_size=16), 8, gen())
    assert x.shape == (8, 3, 16, 16) and y.dtype == torch.int64
    red = (x[:, 0] > 0.9).all(-1).all(-1)
    assert torch.equal(red, y == 1) and torch.equal(
        ~red, (x[:, 2] > 0.9).all(-1).all(-1)
    )  # classes sorted: blue 0, red 1
    assert torch.equal(
        load_source(f"imagefolder:{tmp_path}").batch(vit(), 4, gen(2), "eval")[0],
        source.batch(vit(), 4, gen(2), "eval")[0],
    )


def test_imagefolder_train_val_layout(tmp_path):
    write_images(tmp_path / "train", 3)
    write_images(tmp_path / "val", 2)
    source = load_source(f"imagefolder:{tmp_path}")
    assert source.describe() == f"imagefolder:{tmp_path}: 6 train / 4 eval images, 2 classes, RGB files"
    x, y = source.batch(vit(in_chans=1), 4, gen(), "eval")
    assert x.shape == (4, 1, 32, 32) and set(y.tolist()) <= {0, 1}


def test_bad_imagefolders(tmp_path):
    with pytest.raises(DataError, match=f"no images in {tmp_path}"):
        load_source(f"imagefolder:{tmp_path}")
    write_images(tmp_path / "train", 1)
    (tmp_path / "eval" / "green").mkdir(parents=True)
    Image.new("RGB", (4, 4), (0, 255, 0)).save(tmp_path / "eval" / "green" / "0.png")
    with pytest.raises(DataError, match="class 'green'"):
        load_source(f"imagefolder:{tmp_path}")


def assert_text_batch(x, y, length, batch=4):
    assert x.shape == y.shape == (batch, length) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.max() < 256 and x.min() >= 0


def test_text_file_holds_out_the_last_tenth(tmp_path):
    path = tmp_path / "story.txt"
    path.write_bytes(b"a" * 900 + b"z" * 100)
    source = load_source(f"text:{path}", seq_len=16)
    assert source.task == "text" and source.sizes == {"train": 900, "eval": 100}
    x, y = source.batch(gpt2(), 4, gen())
    assert_text_batch(x, y, 16)
    assert (x == ord("a")).all()
    assert (source.batch(gpt2(), 4, gen(), "eval")[0] == ord("z")).all()
    assert source.describe() == f"text:{path}: 900 train / 100 eval bytes, UTF-8 byte tokens, windows of 16"


def test_text_directory_is_recursive_sorted_and_filtered(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("b" * 50)
    (tmp_path / "sub" / "a.md").write_text("é" * 25)  # 50 UTF-8 bytes
    (tmp_path / "c.raw").write_text("c" * 49)
    (tmp_path / "ignored.bin").write_bytes(b"\xff" * 1000)
    source = load_source(f"text:{tmp_path}", seq_len=8)
    assert sum(source.sizes.values()) == 50 + 50 + 49 + 2  # files joined by newlines
    stream = torch.cat([source.tokens["train"], source.tokens["eval"]])
    assert bytes(stream.tolist()).decode() == "b" * 50 + "\n" + "c" * 49 + "\n" + "é" * 25  # b.txt, c.raw, sub/a.md


def test_wikitext_in_a_subfolder_raw_or_tokens(tmp_path):
    for kind, folder in (("tokens", tmp_path / "a" / "wikitext-2"), ("raw", tmp_path / "b")):
        folder.mkdir(parents=True)
        (folder / f"wiki.train.{kind}").write_text(" = Valkyria = \n" * 20)
        (folder / f"wiki.valid.{kind}").write_text(" = Robert = \n" * 5)
        (folder / f"wiki.test.{kind}").write_text("unused")
        source = load_source(f"wikitext:{folder.parent}", seq_len=32)
        assert source.sizes == {"train": 300, "eval": 65}
        x, y = source.batch(gpt2(), 4, gen(), "eval")
        assert_text_batch(x, y, 32)


def test_stdlib_text_is_byte_tokens_clipped_to_context():
    source = load_source("stdlib-text")
    assert 400_000 < source.sizes["train"] and source.sizes["eval"] == pytest.approx(
        sum(source.sizes.values()) / 10, abs=1
    )
    x, y = source.batch(gpt2(), 4, gen())
    assert_text_batch(x, y, 32)  # seq_len 64 clipped to context 32
    x, y = source.batch(gpt2(context=128), 4, gen(), "eval")
    assert_text_batch(x, y, 64)
    assert torch.equal(x, load_source("stdlib-text").batch(gpt2(context=128), 4, gen(), "eval")[0])
    assert "function" in bytes(source.tokens["train"].tolist()).decode("utf-8")


def test_output_loss_on_logits_and_hf_outputs():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]], requires_grad=True)
    targets = torch.tensor([0, 0, 0])
    loss, acc = output_loss("image", logits, targets)
    assert torch.allclose(loss, F.cross_entropy(logits, targets)) and acc.item() == pytest.approx(2 / 3)
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    text = torch.randn(2, 5, 7)
    ids = text.argmax(-1).clone()
    ids[0, 0] = (ids[0, 0] + 1) % 7  # one token of ten wrong
    loss, acc = output_loss("text", SimpleNamespace(logits=text), ids)
    assert torch.allclose(loss, F.cross_entropy(text.view(10, 7), ids.view(10))) and acc.item() == pytest.approx(0.9)
    first = {"last_hidden_state": logits, "hidden_states": (torch.zeros(3, 4),)}  # PP-LCNet's classifier
    for output in (first, (logits, torch.zeros(1))):  # the first field or element is the main output
        assert torch.allclose(output_loss("image", output, targets)[0], F.cross_entropy(logits, targets))
    with pytest.raises(ValueError, match="returns SimpleNamespace, with no logits"):
        output_loss("image", SimpleNamespace(pooler_output=logits), targets)
    with pytest.raises(ValueError, match="image, text"):
        output_loss("audio", logits, targets)
    with pytest.raises(ValueError, match=r"text logits \(3, 2\)"):
        output_loss("text", logits, targets)


def test_bad_specs_name_what_is_accepted(tmp_path):
    cases = {
        "mnist": "accepted: digits, cifar10:DIR, cifar100:DIR, imagefolder:DIR, stdlib-text, text:PATH, wikitext:DIR",
        "cifar10": "write cifar10:DIR",
        "digits:extra": "'digits' takes no argument",
        f"text:{tmp_path}/missing.txt": f"{tmp_path}/missing.txt does not exist",
        f"wikitext:{tmp_path}": "wiki.train.tokens \\+ wiki.valid.tokens or wiki.train.raw",
        f"text:{tmp_path}": rf"no text files \(\*.txt, \*.tokens, \*.raw, \*.md\) under {tmp_path}",
    }
    for spec, message in cases.items():
        with pytest.raises(DataError, match=message):
            load_source(spec)
    (tmp_path / "empty.txt").write_bytes(b"")
    cases = {
        f"text:{tmp_path}/empty.txt": "no text \\(0 bytes\\)",
        f"imagefolder:{tmp_path}/empty.txt": "empty.txt is not a folder",
    }
    for spec, message in cases.items():
        with pytest.raises(DataError, match=message):
            load_source(spec)
    with pytest.raises(DataError, match="seq_len must be >= 1"):
        load_source("stdlib-text", seq_len=0)
    assert issubclass(DataError, GraphkitError)


def test_defaults():
    assert default_source("vit") == "digits" and default_source("llama") == DEFAULT_SOURCES["gpt2"] == "stdlib-text"
    with pytest.raises(DataError, match=r"'bert'.*gpt2, llama, vit; name the data instead \(--data\): digits, "):
        default_source("bert")


def test_check_rejects_data_the_model_cannot_take(digits, tmp_path):
    text = load_source("stdlib-text")
    llama = resolve_config({"family": "llama", "num_layers": 1, "hidden": 32, "heads": 2, "vocab_size": 512})
    text.check(llama)
    digits.check(vit())
    for source, config, message in [
        (digits, gpt2(), "digits is image data but a gpt2 model takes text"),
        (text, vit(), "stdlib-text is text data but a vit model takes image"),
        (digits, vit(num_classes=5), "10 classes but the vit config has num_classes 5"),
        (text, gpt2(vocab_size=200), "vocab_size 200, needs >= 256"),
        (text, {"family": "custom"}, "custom config has neither image_size nor vocab_size"),
    ]:
        with pytest.raises(DataError, match=message):
            source.check(config)
    folder = write_cifar(tmp_path)
    with pytest.raises(DataError, match="3 channels; in_chans 4 needs 1 or 3"):
        load_source(f"cifar10:{folder}").check(vit(in_chans=4))
    (tmp_path / "short.txt").write_bytes(b"x" * 100)
    with pytest.raises(DataError, match="eval split has 10 bytes, too few for a window of 32"):
        load_source(f"text:{tmp_path}/short.txt").batch(gpt2(), 2, gen())


def test_batches_run_through_real_tiny_models(digits):
    torch.manual_seed(0)
    model = build_model(vit(), "cpu")
    x, y = digits.batch(vit(), 4, gen())
    loss, acc = output_loss("image", model(x), y)
    assert model(x).shape == (4, 10) and torch.isfinite(loss) and 0 <= acc <= 1
    model = build_model(gpt2(), "cpu")
    x, y = load_source("stdlib-text").batch(gpt2(), 2, gen())
    output = model(x)
    loss, acc = output_loss("text", output, y)
    assert output.logits.shape == (2, 32, 300) and loss.item() == pytest.approx(np.log(300), rel=0.1)


def test_a_registered_source_is_one_call_away(monkeypatch, tmp_path):
    """register_source adds a source every loader and error message knows; its argument is
    checked as the built-in ones' are."""
    monkeypatch.setattr(sources, "_TEXT", dict(sources._TEXT))
    monkeypatch.setattr(sources, "_ARGS", dict(sources._ARGS))
    seen = []

    def poems(path):
        seen.append(path)
        return b"roses are red " * 200, b"violets are blue " * 50

    sources.register_source("poems", poems, task="text", arg="PATH")
    assert "poems:PATH" in sources.accepted_sources()
    with pytest.raises(DataError, match=r"data source 'poems': write poems:PATH"):
        load_source("poems")
    with pytest.raises(DataError, match="does not exist"):
        load_source(f"poems:{tmp_path / 'missing.txt'}")
    (tmp_path / "book.txt").write_text("x")
    source = load_source(f"poems:{tmp_path / 'book.txt'}", seq_len=16)
    assert seen == [tmp_path / "book.txt"] and source.spec == f"poems:{tmp_path / 'book.txt'}"
    for bad, message in [({"task": "audio"}, "task 'audio'; accepted: image, text"), ({"arg": "URL"}, "arg 'URL'")]:
        with pytest.raises(DataError, match=message):
            sources.register_source("other", poems, **{"task": "text", **bad})
    with pytest.raises(DataError, match="unknown data source 'other'; accepted: digits, "):
        load_source("other")

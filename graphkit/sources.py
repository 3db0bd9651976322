"""Where a model comes from: the MODEL argument of every command that takes one.

A model source is one of

- ``MODEL.py``: a Python file defining ``model`` or ``build_model()`` (:mod:`graphkit.modelfile`);
- a Hugging Face model folder, as ``save_pretrained`` writes it: ``config.json`` and the weights
  as ``model.safetensors`` or shards listed in ``model.safetensors.index.json``;
- ``timm:NAME[?key=value&...]``: ``timm.create_model(NAME, pretrained=False, **keys)``;
- ``hf:MODEL_TYPE[?field=value&...]``: transformers' config of that model type with these fields,
  and its causal LM (its image classifier for a vision type such as ``vit``).

A path that exists is read as a path, whatever its name (a folder literally named ``timm:x`` is
a model folder); only a name that is not there is read as a ``timm:`` or ``hf:`` spec.

Nothing is fetched from a hub or unpickled, and no remote code runs: a folder is read with
``local_files_only=True``, its weights from safetensors only, and its model class is one
transformers itself defines. ``weights=False`` builds on the meta device without reading a
weight (what tracing needs, in about a second for billions of parameters); ``weights=True`` builds
real tensors, loaded from the folder's safetensors where it has them, else initialised by the
library, after the meta build has shown they fit in memory.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import inspect
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from graphkit.errors import ModelSourceError

if TYPE_CHECKING:  # torch is imported where a model is built: the command line's --help reads this module
    from torch import nn

    from graphkit.modelfile import ModelFile
#: weight files a folder may hold that graphkit never reads: pickles (which can run code on load)
#: and other frameworks' formats
UNREADABLE_WEIGHTS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
    "model.ckpt.index",
)
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
#: files that belong inside a model folder: given alone, the folder is what was meant
FOLDER_FILES = ("config.json", *SAFETENSORS_WEIGHTS, *UNREADABLE_WEIGHTS)
#: timm keywords that would download or unpickle weights
TIMM_REFUSED_KEYS = ("pretrained", "checkpoint_path")
#: config entries that describe a saved file, not the architecture: not settable from hf:
CONFIG_BOOKKEEPING = ("model_type", "transformers_version", "_name_or_path", "architectures", "auto_map")
#: value starts that promise a Python literal: a value starting so that does not parse is refused
#: rather than passed on as a string ("[2,2" is a typo, not a name)
LITERAL_OPENERS = ("[", "(", "{", "'", '"')
#: JSON's spellings, accepted beside Python's
JSON_CONSTANTS = {"true": True, "false": False, "null": None}


def load_model_source(source: str | Path, *, weights: bool = True) -> ModelFile:
    """The model that ``source`` names (a MODEL.py, a Hugging Face model folder, ``timm:NAME?k=v``
    or ``hf:MODEL_TYPE?k=v``; see the module's docstring), with its example inputs where MODEL.py
    defines them (else None: the tracer guesses them).

    ``weights=False`` is for callers that need the architecture only (tracing, drawing,
    predicting parameters): folders and specs are built on the meta device and no weight file is
    opened. ``weights=True`` gives real tensors on the CPU, in float32: a folder's safetensors
    loaded (all of them: a missing or unexpected tensor is refused), or the library's random
    initialisation where a folder has no weights and for ``timm:`` and ``hf:``. A MODEL.py runs
    as written either way; its file decides the device.

    Every failure is a one-line :class:`~graphkit.errors.ModelSourceError` (a
    :class:`~graphkit.errors.ModelFileError` for a MODEL.py) that names the source and what is
    accepted."""
    from graphkit.modelfile import load_model_file  # noqa: PLC0415 (imports torch)

    text = str(source)
    path = Path(text)
    if _exists(path):
        if path.is_dir():
            return _load_folder(path, weights)
        if path.name in FOLDER_FILES or path.suffix == ".safetensors":
            raise ModelSourceError(
                f"{path}: a file of a Hugging Face model folder; give the folder that holds it and its config.json"
            )
        return load_model_file(path)
    prefix, colon, spec = text.partition(":")
    if colon and prefix in PREFIXES:
        return PREFIXES[prefix].load(text, spec, weights)
    if path.suffix == ".py":
        return load_model_file(path)  # its own "no such file"
    raise ModelSourceError(f"{text}: no such file or folder; a model is one of {FORMS}")


def parse_value(text: str) -> Any:
    """A ``key=value`` value of a ``timm:`` or ``hf:`` spec as Python sees it: a literal that
    ``ast.literal_eval`` reads (``32``, ``1e-5``, ``True``, ``None``, ``[2, 2]``, ``(7, 7)``,
    ``'gelu'``), JSON's ``true``, ``false`` and ``null``, else the text itself as a string
    (``gelu``). Text that opens a literal (a bracket or a quote) and does not parse raises
    ValueError."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    if text in JSON_CONSTANTS:
        return JSON_CONSTANTS[text]
    if text.strip().startswith(LITERAL_OPENERS):
        raise ValueError(f"{text!r} opens a literal that does not parse")
    return text


def parse_spec(source: str, spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME?key=value&...`` as the name and its keyword arguments (values by :func:`parse_value`);
    ``source`` is the whole argument, for the error lines."""
    name, _, query = spec.partition("?")
    keywords: dict[str, Any] = {}
    for pair in query.split("&") if query else ():
        key, equals, text = pair.partition("=")
        if not equals or not key.isidentifier():
            raise ModelSourceError(f"{source}: {pair!r} is not key=value (keys are Python names, pairs joined by &)")
        if key in keywords:
            raise ModelSourceError(f"{source}: {key} is given twice")
        try:
            keywords[key] = parse_value(text)
        except ValueError as e:
            raise ModelSourceError(
                f"{source}: the value of {key} does not parse: {e} (values are Python or JSON literals: 32, 1e-5, "
                "true, [2, 2], 'text'; or plain text)"
            ) from None
    return name, keywords


def _exists(path: Path) -> bool:
    """Whether ``path`` is there; a name no file system accepts (a NUL byte, too long) is not."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _suggest(word: str, accepted: list[str] | tuple[str, ...], listing: str) -> str:
    """'; did you mean a, b?' for the close matches of ``word`` among ``accepted``, else ``listing``
    (how to see every accepted one, or all of them when they are few)."""
    close = difflib.get_close_matches(word, accepted, n=5, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else f"; {listing}"


# ---------------------------------------------------------------------------------------------
# timm:NAME?key=value


def _load_timm(source: str, spec: str, weights: bool) -> ModelFile:
    """``timm.create_model(NAME, pretrained=False, **keys)``; an unknown name, a key the model
    does not take and a value it refuses each become one line."""
    import timm  # noqa: PLC0415

    name, keywords = parse_spec(source, spec)
    if not name:
        raise ModelSourceError(f"{source}: timm: needs a model name, e.g. timm:vit_tiny_patch16_224?img_size=32")
    refused = [key for key in TIMM_REFUSED_KEYS if key in keywords]
    if refused:
        raise ModelSourceError(
            f"{source}: {', '.join(refused)} is not accepted: graphkit never downloads or unpickles weights "
            "(give a Hugging Face model folder with safetensors to load trained weights)"
        )
    if not timm.is_model(name):
        raise ModelSourceError(
            f"{source}: timm has no model {name!r}"
            + _suggest(name, timm.list_models(), "timm.list_models('vit_*') lists its names")
        )

    input_size = _timm_input_size(keywords)
    if input_size is not None and "pretrained_cfg_overlay" not in keywords:
        keywords["pretrained_cfg_overlay"] = {"input_size": input_size}

    def build() -> nn.Module:
        return timm.create_model(name, pretrained=False, **keywords)

    def describe(error: Exception) -> ModelSourceError:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(error))
        if not isinstance(error, TypeError) or unexpected is None:
            return _library_error(source, "timm", name + _with(keywords), error)
        key = unexpected.group(1)
        accepted = _constructor_keys(lambda: timm.create_model(name, pretrained=False))
        return ModelSourceError(
            f"{source}: {name} takes no key {key!r}"
            + _suggest(key, accepted, f"it takes: {', '.join(accepted)}" if accepted else "see its constructor")
        )

    from graphkit.modelfile import ModelFile  # noqa: PLC0415

    return ModelFile(path=None, model=_built(build, weights, source, describe), source=source)


def _timm_input_size(keywords: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The ``input_size`` (channels, height, width) of a timm model built with ``keywords``'
    ``img_size``: timm keeps its published one in ``pretrained_cfg`` whatever the model was built
    for, and that is where the tracer and the data read a model's images from (an EfficientFormerV2
    built at 32 px was traced on 224-px inputs, which its attention-bias tables cannot read). None
    without an ``img_size``, or with a value that is no size (left for timm to refuse)."""
    from graphkit.validation import is_count  # noqa: PLC0415 - it imports torch, which --help must not

    size, channels = keywords.get("img_size"), keywords.get("in_chans", 3)
    if not is_count(channels):
        return None
    sides = (size, size) if is_count(size) else tuple(size) if isinstance(size, (tuple, list)) else ()
    if len(sides) != 2 or not all(is_count(s) for s in sides):
        return None
    return int(channels), int(sides[0]), int(sides[1])


def _constructor_keys(build_default: Callable[[], nn.Module]) -> list[str]:
    """The keyword arguments of the class that ``build_default()`` builds (on meta), for
    suggestions; empty where it cannot be built or takes none by name."""
    import torch  # noqa: PLC0415

    try:
        with _quiet(), torch.device("meta"):
            model_class = type(build_default())
        parameters = inspect.signature(model_class.__init__).parameters.values()
    except Exception:  # only suggestions are lost
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return sorted(p.name for p in parameters if p.kind in named and p.name != "self")


# ---------------------------------------------------------------------------------------------
# hf:MODEL_TYPE?field=value


def _load_transformers_type(source: str, spec: str, weights: bool) -> ModelFile:
    """transformers' config of a model type, with the given fields, and the model class that type
    builds by default (:func:`_default_class`)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: PLC0415

    model_type, fields = parse_spec(source, spec)
    if "/" in model_type:
        raise ModelSourceError(
            f"{source}: hf: takes a transformers model type (llama, qwen2, gpt2, vit, ...), not a hub repository; "
            "graphkit never downloads: give the folder of a downloaded checkpoint"
        )
    buildable = _buildable_types()
    if model_type not in CONFIG_MAPPING:
        raise ModelSourceError(
            f"{source}: transformers has no model type {model_type!r}"
            + _suggest(model_type, buildable, f"hf: takes one of {len(buildable)} types, e.g. llama, qwen2, gpt2, vit")
        )
    model_class = _default_class(model_type)
    if model_class is None:
        raise ModelSourceError(
            f"{source}: transformers has neither a causal LM nor an image classifier for {model_type!r} "
            f"(what hf: builds); for another head write a MODEL.py or give a model folder"
        )
    config_class = CONFIG_MAPPING[model_type]
    accepted = _config_fields(config_class)
    for field in fields:
        if field not in accepted:
            raise ModelSourceError(
                f"{source}: {config_class.__name__} has no field {field!r}"
                + _suggest(field, accepted, f"its fields: {', '.join(accepted)}")
            )
    labels = fields.get("num_labels", 0)
    if isinstance(labels, bool) or not isinstance(labels, int) or labels < 0:  # transformers reads -1 as 0
        raise ModelSourceError(f"{source}: num_labels must be an integer >= 0 (0: no classifier); got {labels!r}")
    try:
        with _quiet():
            config = config_class(**fields)
    except Exception as e:  # transformers validates its fields (types, ranges, combinations)
        raise _library_error(source, "transformers", config_class.__name__, e) from e
    model = _built(lambda: model_class(config), weights, source, _describer(source, model_class))
    from graphkit.modelfile import ModelFile  # noqa: PLC0415

    return ModelFile(path=None, model=model, source=source)


def _buildable_types() -> list[str]:
    """Model types that hf: builds: those with a causal LM or an image classifier."""
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    return sorted(
        set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        | set(modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)
    )


def _default_class(model_type: str) -> Any:  # a transformers model class, or None
    """The class hf: builds for ``model_type`` (and a folder whose config names none): its causal
    LM, else its image classifier (ViT, DeiT, Swin), else None."""
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    for mapping in (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    ):
        if model_type in mapping:  # a name, or names (DeiT's classifier, then its distilled one): the first
            names = mapping[model_type]
            return _transformers_class(cast(str, names if isinstance(names, str) else names[0]))
    return None


def _transformers_class(name: str) -> Any:  # a transformers model class, or None
    """The model class transformers defines under ``name``, or None: a name from a config file
    is only ever looked up, never imported from elsewhere."""
    import transformers  # noqa: PLC0415

    model_class = getattr(transformers, name, None) if name.isidentifier() else None
    if isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel):
        return model_class
    return None


def _config_fields(config_class: Any) -> list[str]:  # a transformers PretrainedConfig subclass
    """The fields a config class takes: its defaults' entries, its aliases (GPT-2's
    ``hidden_size`` for ``n_embd``), its constructor's named arguments and ``num_labels`` (every
    config's class count, which its defaults hold only as ``id2label``: an image classifier's is 2
    unless set), less those that describe a saved file."""
    try:
        with _quiet():
            defaults = set(config_class().to_dict())
    except Exception:  # defaults its own validation refuses (Gemma 4's assistant): the constructor names them
        defaults = set()
    names = defaults | set(getattr(config_class, "attribute_map", {})) | {"num_labels"}
    names |= {
        p.name
        for p in inspect.signature(config_class.__init__).parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return sorted(names - {"self", *CONFIG_BOOKKEEPING})


# ---------------------------------------------------------------------------------------------
# the prefixes


@dataclass(frozen=True)
class SourceForm:
    """A model source named by a prefix (``timm:``, ``hf:``): how --help writes it, in full
    (``usage``) and short (``metavar``), what it builds (``meaning``), and the loader,
    ``load(source, spec, weights)`` with ``spec`` the text after the prefix's colon."""

    usage: str
    metavar: str
    meaning: str
    load: Callable[[str, str, bool], ModelFile]


#: every prefix a model source may start with, and how to load it
PREFIXES: dict[str, SourceForm] = {
    "timm": SourceForm("timm:NAME?key=value&...", "timm:NAME?k=v", "timm.create_model", _load_timm),
    "hf": SourceForm(
        "hf:MODEL_TYPE?field=value&...",
        "hf:TYPE?k=v",
        "transformers' causal LM, or image classifier, of that model type",
        _load_transformers_type,
    ),
}
#: the forms of a model source, as the commands' --help shows them: in full, and as a metavar
FORMS = " | ".join(["MODEL.py", "FOLDER", *(form.usage for form in PREFIXES.values())])
METAVAR = "|".join(["MODEL.py", "FOLDER", *(form.metavar for form in PREFIXES.values())])


# ---------------------------------------------------------------------------------------------
# Hugging Face model folders


def _load_folder(folder: Path, weights: bool) -> ModelFile:
    """A folder that ``save_pretrained`` wrote: the model class its config names, built on meta,
    or with the folder's safetensors loaded (``from_pretrained``, offline, float32)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelSourceError(
            f"{folder}: no config.json, so not a Hugging Face model folder (save_pretrained writes config.json "
            "beside the weights)"
        )
    raw = _read_config(config_file)
    config_class, model_class = _folder_classes(config_file, raw)
    try:
        with _quiet():
            config = config_class.from_dict(raw)
    except Exception as e:
        raise _library_error(str(config_file), "transformers", config_class.__name__, e) from e
    present = {name for name in (*SAFETENSORS_WEIGHTS, *UNREADABLE_WEIGHTS) if (folder / name).is_file()}
    if weights and present and not present & set(SAFETENSORS_WEIGHTS):
        raise ModelSourceError(
            f"{folder}: its weights are only in {', '.join(sorted(present))}, which graphkit never loads "
            "(a pickle can run code); save them as safetensors (transformers' save_pretrained writes model.safetensors)"
        )
    load = None
    if weights and present:  # else a config alone: the library's initialisation, as from_config gives
        load = lambda: _read_weights(folder, model_class, config)  # noqa: E731
    model = _built(lambda: model_class(config), weights, str(folder), _describer(str(folder), model_class), load)
    from graphkit.modelfile import ModelFile  # noqa: PLC0415

    return ModelFile(path=folder, model=model, source=str(folder))


def _read_config(config_file: Path) -> dict[str, Any]:
    """config.json as a dict; unreadable, not JSON or not an object is one line."""
    try:
        raw = json.loads(config_file.read_text())
    except OSError as e:
        raise ModelSourceError(f"{config_file}: cannot read: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSourceError(f"{config_file}: not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ModelSourceError(f"{config_file}: not a JSON object")
    return raw


def _folder_classes(config_file: Path, raw: dict[str, Any]) -> tuple[Any, Any]:  # config and model classes
    """The config class of the folder's ``model_type`` and the model class its ``architectures``
    names (where it names none, the one hf: would build). A type or class that transformers does
    not define is refused: it needs remote code, which graphkit never runs."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: PLC0415

    model_type = raw.get("model_type")
    remote = " and names remote code (auto_map), which graphkit never runs" if raw.get("auto_map") else ""
    if not isinstance(model_type, str) or not model_type:
        raise ModelSourceError(f"{config_file}: no model_type, so transformers cannot tell which model it configures")
    if model_type not in CONFIG_MAPPING:
        if remote:
            raise ModelSourceError(f"{config_file}: model_type {model_type!r} is not one transformers defines{remote}")
        raise ModelSourceError(
            f"{config_file}: transformers has no model type {model_type!r}"
            + _suggest(model_type, list(CONFIG_MAPPING.keys()), "a newer transformers may know it")
        )
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelSourceError(f"{config_file}: architectures must be a list of class names, got {architectures!r}")
    if architectures:
        model_class = _transformers_class(architectures[0])
        if model_class is None:
            raise ModelSourceError(
                f"{config_file}: transformers defines no model class {architectures[0]!r}{remote or ''}"
            )
    else:
        model_class = _default_class(model_type)
        if model_class is None:
            raise ModelSourceError(
                f"{config_file}: names no architectures, and {model_type!r} has neither a causal LM nor an image "
                "classifier to default to; add the class to architectures"
            )
    return CONFIG_MAPPING[model_type], model_class


def _read_weights(folder: Path, model_class: Any, config: Any) -> nn.Module:
    """``from_pretrained`` on the folder: offline, safetensors only, float32, and every tensor
    the model has read from the files, at the shape config.json gives it (and none left over).
    A shape mismatch is named here, with both shapes: transformers raises it as "look at the
    above report", a report its logging printed and graphkit keeps quiet."""
    import torch  # noqa: PLC0415

    model, info = model_class.from_pretrained(
        folder,
        config=config,
        local_files_only=True,
        use_safetensors=True,
        trust_remote_code=False,
        dtype=torch.float32,
        output_loading_info=True,
        ignore_mismatched_sizes=True,  # listed in the loading info, refused below
    )
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda entry: entry[0])
    if mismatched:
        name, stored, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise ModelSourceError(
            f"{folder}: the weights do not match config.json: {name} is {list(stored)} in the weights but "
            f"{list(expected)} in the model config.json describes{more}"
        )
    for what, key in (("lack", "missing_keys"), ("hold tensors the model does not have:", "unexpected_keys")):
        names = sorted(info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ModelSourceError(f"{folder}: the weights do not match config.json: they {what} {shown}")
    return model


# ---------------------------------------------------------------------------------------------
# building, on meta or for real


def _built(
    build: Callable[[], nn.Module],
    weights: bool,
    source: str,
    describe: Callable[[Exception], ModelSourceError],
    load: Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """``build()`` on meta; with ``weights``, then ``load()`` (default: ``build()``) on the CPU
    once the meta build shows that its tensors fit in memory. What the library raises becomes
    ``describe(error)``, one line."""
    try:
        meta = _on_meta(build)
        return _materialised(source, meta, load or build) if weights else meta
    except ModelSourceError:
        raise
    except Exception as e:  # whatever the library raises for this configuration
        raise describe(e) from e


def _describer(source: str, model_class: type) -> Callable[[Exception], ModelSourceError]:
    """How :func:`_built` words what transformers raises building ``model_class``."""
    return lambda error: _library_error(source, "transformers", model_class.__name__, error)


def _on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` on the meta device without running weight initialisation (nothing to fill),
    input embeddings tied to the output where the config says so, in eval mode."""
    import torch  # noqa: PLC0415

    from graphkit.compat import skip_weight_init  # noqa: PLC0415

    with _quiet(), torch.device("meta"), skip_weight_init():
        model = build()
    if callable(tie := getattr(model, "tie_weights", None)):
        tie()
    return model.eval()


def _materialised(source: str, meta: nn.Module, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` on the CPU, refused before it allocates when ``meta``'s float32 tensors do not
    fit in the memory available."""
    import torch  # noqa: PLC0415

    from graphkit.params import memory_shortfall  # noqa: PLC0415

    needed = sum(t.numel() * 4 for t in (*meta.parameters(), *meta.buffers()))
    available = memory_shortfall(needed, torch.device("cpu"))
    if available is not None:
        raise ModelSourceError(
            f"{source}: its weights need {needed / 2**30:.1f} GiB and {available / 2**30:.1f} GiB are free; "
            "a smaller configuration fits"
        )
    with _quiet(), torch.device("cpu"):
        return build().eval()


def _with(keywords: dict[str, Any]) -> str:
    """' with a=1, b=[2, 2]' for the keywords a build was given (none: '')."""
    return " with " + ", ".join(f"{key}={value!r}" for key, value in keywords.items()) if keywords else ""


def _library_error(source: str, library: str, what: str, error: BaseException) -> ModelSourceError:
    """``error``, raised by ``library`` building ``what``, as one line naming ``source``."""
    message = " ".join(str(error).split()) or "(no message)"
    return ModelSourceError(f"{source}: {library} cannot build {what}: {type(error).__name__}: {message}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The libraries' own warnings, log lines and progress bars silenced while they build: what
    goes wrong is raised and named, what is the library's business is not the user's."""
    with contextlib.ExitStack() as restore:
        restore.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        if "transformers" in sys.modules:  # timm builds without it, and importing it costs seconds
            from transformers.utils import logging as hf_logging  # noqa: PLC0415

            restore.callback(hf_logging.set_verbosity, hf_logging.get_verbosity())
            if hf_logging.is_progress_bar_enabled():
                restore.callback(hf_logging.enable_progress_bar)
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        yield


__all__ = ["FORMS", "load_model_source", "parse_spec", "parse_value"]

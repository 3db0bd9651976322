"""Converting a model's attention and saving it: the library behind ``graphkit convert``.

:class:`ConvertConfig` holds a conversion's options and checks the rules between them when it is
made (an option that needs another, an option the variant would silently ignore, a format that
cannot hold the variant), so a Python user gets the one-line errors the command prints, before any
model is loaded. Its messages name the options as the command spells them (``--kv-rank``).
:func:`convert_attention` converts a model that holds weights (refusing one on the meta device or
with non-finite weights, and a model the format cannot hold before any calibration), and
:func:`save_conversion` writes the result in the config's format: a safetensors file of the
parameters (``graphkit compile`` rebuilds the model) or a folder stock transformers loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from graphkit.attention import convert
from graphkit.attention.convert import check_grouping, check_variant_options, conversion_metadata
from graphkit.attention.core import ATTENTION_VARIANTS
from graphkit.attention.grouping import MEASURED
from graphkit.attention.hf_format import (
    HF_VARIANTS,
    check_deepseek,
    check_hf_export,
    check_hf_output,
    hf_info,
    save_hf,
    to_deepseek,
)
from graphkit.attention.mla import kv_cache_bytes, mla_metadata, to_mla
from graphkit.errors import ConfigError, ConvertError
from graphkit.params import check_params_output, first_non_finite, save_params
from graphkit.training.data import calibration_inputs, data_config, load_source


def conversions() -> tuple[str, ...]:
    """What a model's attention converts to: GQA and its key-driven variants (every registered
    :data:`~graphkit.attention.core.ATTENTION_VARIANTS`), and MLA."""
    return (*ATTENTION_VARIANTS, "mla")


#: the formats a conversion is saved in: graphkit's parameters file, or a Hugging Face folder
FORMATS = ("graphkit", "hf")
#: the kind of parameters file a conversion in graphkit's format is (:func:`~graphkit.params.save_params`)
CONVERTED = "converted-weights"


@dataclass(frozen=True)
class ConvertConfig:
    """A conversion to ``attention`` (:func:`conversions`) saved in ``format`` (:data:`FORMATS`):
    ``kv_heads`` K/V heads per layer (GQA and the key-driven variants; None: as many as heads),
    DGQA's ``window``, ``evolution`` and ``alpha``, the ``grouping`` of GQA's heads, ``data`` for
    calibration (a ``--data`` spec; None: the family's bundled data), and MLA's ``kv_rank`` and
    ``rope_dims``. Every rule between them is checked when the config is made."""

    attention: str
    kv_heads: int | None = None
    format: str = "graphkit"
    window: int | None = None
    evolution: str | None = None
    alpha: float | None = None
    grouping: str = "mean"
    data: str | None = None
    kv_rank: int | None = None
    rope_dims: int | None = None

    def __post_init__(self) -> None:
        if self.attention not in conversions():
            raise ConvertError(f"unknown attention {self.attention!r}; accepted: {', '.join(conversions())}")
        if self.format not in FORMATS:
            raise ConvertError(f"unknown --format {self.format!r}; accepted: {', '.join(FORMATS)}")
        mla = self.attention == "mla"
        if self.hf:
            if self.attention not in HF_VARIANTS:
                raise ConvertError(
                    f"--format hf writes {' or '.join(HF_VARIANTS)}: no stock transformers class computes "
                    f"{self.attention}; --format graphkit writes it"
                )
            if mla and self.rope_dims is None:
                raise ConvertError(
                    "-a mla --format hf needs --rope-dims: DeepSeek's format caches a rotary key of D dimensions, "
                    "shared by all heads, beside the latent"
                )
        if mla != (self.kv_rank is not None):
            raise ConvertError(
                "-a mla needs --kv-rank" if mla else f"--kv-rank applies to -a mla, not {self.attention}"
            )
        if self.rope_dims is not None and not mla:
            raise ConvertError(f"--rope-dims applies to -a mla, not {self.attention}")
        if mla and self.kv_heads is not None:
            raise ConvertError("--kv-heads applies to gqa and the key-driven variants; MLA's cache is set by --kv-rank")
        check_variant_options(self.attention, self.variant_options, prefix="--")
        check_grouping(self.attention, self.grouping, prefix="--")
        if self.data is not None:
            if not self.calibrates:
                raise ConvertError(
                    f"--data applies to --grouping {', '.join(MEASURED)} and to --rope-dims, "
                    f"not --grouping {self.grouping}"
                )
            load_source(self.data)  # a bad spec fails before the model is loaded

    @property
    def hf(self) -> bool:
        """Whether the conversion is saved as a folder stock transformers loads."""
        return self.format == "hf"

    @property
    def variant_options(self) -> dict[str, Any]:
        """DGQA's options that were given, by name (what :func:`~graphkit.attention.convert` takes)."""
        given = dict(window=self.window, evolution=self.evolution, alpha=self.alpha)
        return {name: value for name, value in given.items() if value is not None}

    @property
    def calibrates(self) -> bool:
        """Whether the conversion reads calibration data: a measured grouping, or MLA's partial RoPE."""
        return self.grouping in MEASURED or self.rope_dims is not None


def check_convert_output(out: str | Path, format: str) -> Path:
    """Check, before any work, that a conversion in ``format`` can be written at ``out`` (a
    folder for ``hf``, else a parameters file graphkit may write)."""
    return check_hf_output(out) if format == "hf" else check_params_output(out, kind=CONVERTED)


@dataclass
class Conversion:
    """A converted model, the metadata that describes its conversion, and its KV cache per token
    in bytes before and after."""

    model: nn.Module
    metadata: dict[str, Any]
    before: int
    after: int


def convert_attention(
    model: nn.Module, config: ConvertConfig, *, example_inputs: Any = None, source: str | None = None
) -> Conversion:
    """``model`` (holding finite weights) converted as ``config`` says, calibrated on data
    shaped for it where the config calibrates; ``source`` names the model in error lines
    (default: its class). ``model`` may be changed in place (GQA); the result's model is the one
    to use. Nothing is returned with a NaN or Inf in it."""
    name = source or type(model).__name__
    if any(p.is_meta for p in model.parameters()):
        raise ConvertError(
            f"{name}: the model is on the meta device; convert needs its weights (build it on a real device)"
        )
    bad = first_non_finite(dict(model.named_parameters()))
    if bad is not None:  # a conversion mixes heads: one NaN would spread to every weight it touches, silently
        raise ConvertError(f"{name}: its parameter {bad!r} holds NaN or Inf; convert needs finite weights")
    mla = config.attention == "mla"
    if config.hf:  # a model the format cannot hold is refused before calibration or conversion
        check_hf_export(model, config.attention)
        if mla:
            check_deepseek(model, config.kv_rank, config.rope_dims)
    before = kv_cache_bytes(model)
    calibration = []
    if config.calibrates:
        try:
            shape = data_config(model, example_inputs)
        except ConfigError as e:
            option = "--rope-dims" if mla else f"--grouping {config.grouping}"
            raise ConvertError(
                f"{name}: {option} draws calibration data shaped for one of "
                f"graphkit's families or a language model, and this model is neither ({e})"
            ) from None
        calibration = calibration_inputs(shape, config.data)
    if mla and config.hf:
        assert config.kv_rank is not None and config.rope_dims is not None, "ConvertConfig requires both here"
        model = to_deepseek(model, config.kv_rank, config.rope_dims, calibration)
        metadata: dict[str, Any] = {
            "attention": "mla",
            "kv_rank": config.kv_rank,
            "rope_dims": config.rope_dims,
            "rope": "shared (RoRoPE)",
        }
    elif mla:
        assert config.kv_rank is not None, "ConvertConfig requires kv_rank with mla"
        model = to_mla(model, config.kv_rank, rope_dims=config.rope_dims, calibration=calibration)
        metadata = mla_metadata(model)
    else:
        model = convert(
            model, config.attention, config.kv_heads, grouping=config.grouping, calibration=calibration,
            **config.variant_options,
        )  # fmt: skip
        metadata = conversion_metadata(model)
    bad = first_non_finite(dict(model.named_parameters()))
    if bad is not None:  # from finite weights: a calibration that overflowed; nothing is written
        raise ConvertError(
            f"{name}: the converted parameter {bad!r} holds NaN or Inf (the source's are finite); nothing was written"
        )
    return Conversion(model, metadata, before, kv_cache_bytes(model))


def save_conversion(conversion: Conversion, out: str | Path, config: ConvertConfig) -> Path:
    """Write ``conversion`` at ``out`` in ``config``'s format (checked first, as
    :func:`check_convert_output` does): its parameters with the metadata, or a folder stock
    transformers loads. Returns the path written."""
    check_convert_output(out, config.format)
    if config.hf:
        return save_hf(conversion.model, out, hf_info(conversion.metadata))
    save_params(conversion.model, out, metadata=conversion.metadata, kind=CONVERTED)
    return Path(out)


__all__ = [
    "CONVERTED",
    "FORMATS",
    "conversions",
    "Conversion",
    "ConvertConfig",
    "check_convert_output",
    "convert_attention",
    "save_conversion",
]

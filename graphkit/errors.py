"""Every error graphkit raises, in one place: one base class (:class:`GraphkitError`, which the CLI
prints as one line), and below it one class per kind of bad input, each message one line that
names the cause. The module that raises an error also exports it (``from graphkit.attention.hf_format
import ExportError`` works as before)."""


class GraphkitError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero (tracebacks with --debug)."""


class GraphError(GraphkitError):
    """A graph is malformed or fails validation."""


class TraceError(GraphkitError):
    """A model could not be turned into a graph."""


class NeedsValuesError(TraceError):
    """A model on the meta device could not be traced because the tracer needs a value it does
    not hold (a causal-mask buffer made in ``__init__``): built on a real device, it can be."""


class UnusedParameterError(TraceError):
    """A parameter was never read by the forward with the example inputs (a spare module, or a
    branch those inputs do not take): other inputs may take it."""


class ModelSourceError(GraphkitError):
    """A model source (a Hugging Face model folder, ``timm:NAME?k=v``, ``hf:MODEL_TYPE?k=v``) could
    not be loaded; raised by :func:`graphkit.sources.load_model_source`."""


class ModelFileError(ModelSourceError):
    """A user's MODEL.py could not be loaded (the model source that is a Python file)."""


class TrainError(GraphkitError):
    """Training a hypernetwork, or up-training a model, cannot start or continue (bad dataset,
    data, option, resume folder or loss); raised by ``graphkit.ghn.training``,
    ``graphkit.finetune`` and the pool and run folder they read."""


class CheckpointError(GraphkitError):
    """A checkpoint is missing, unreadable or does not fit what it is asked to do: a
    hypernetwork's (:mod:`graphkit.ghn.checkpoint`) or a training run's optimizer state
    (:mod:`graphkit.training.state`)."""


# raised by graphkit.fileio


class OutputError(GraphkitError):
    """An output path is unusable: a folder where a file goes, under a file, or not ours to overwrite."""


# raised by graphkit.buffers


class BufferRebuildError(GraphkitError):
    """A buffer of a meta-built model cannot be recomputed on a real device."""


# raised by graphkit.draw


class DrawError(GraphkitError):
    """A graph could not be drawn (a layout or writer failure, named with the file)."""


# raised by graphkit.params


class CompileError(GraphkitError):
    """A model cannot be built from what was given, or its parameters do not fit it. (It lives
    here, below :mod:`graphkit.compiler`, because every :class:`ParamsError` is one.)"""


class ParamsError(CompileError):
    """A parameter file or dict that cannot be read, saved or loaded into a model."""


# raised by graphkit.families.registry


class ConfigError(GraphkitError):
    """A model config names an unknown family or key, or has inconsistent values."""


# raised by graphkit.attention.convert


class ConvertError(GraphkitError):
    """A model, variant or head count that convert() cannot handle."""


# raised by graphkit.attention.mla


class MLAError(GraphkitError):
    """A model or rank ``to_mla`` cannot convert."""


# raised by graphkit.attention.hf_format


class ExportError(GraphkitError):
    """A model or option ``--format hf`` cannot write as a checkpoint stock transformers loads."""


# raised by graphkit.training.data.source


class DataError(GraphkitError):
    """A data source cannot be loaded, or cannot feed the model it is asked to."""


# raised by graphkit.datasets.store


class StoreError(GraphkitError):
    """A dataset file is missing, unreadable or of an unknown schema."""


# raised by graphkit.datasets.dataset


class RecordNotFound(StoreError, KeyError):
    """No record has that id: a KeyError for Python code, a one-line error for the CLI."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


# raised by graphkit.datasets.recipes


class RecipeError(GraphkitError):
    """A recipe is unknown, malformed or describes an empty space."""


# raised by graphkit.datasets.shrink


class ShrinkError(GraphkitError):
    """A zoo model cannot be shrunk by these rules: the reason is a report line."""


# raised by graphkit.families.libraries (a library cannot build a model) and graphkit.datasets.zoo


class ZooError(GraphkitError):
    """A zoo cannot be generated: an unknown zoo, bad options or an output folder in the way."""


# raised by graphkit.datasets.generate


class GenerateError(GraphkitError):
    """Bad generation options or an output folder in the way."""


# raised by graphkit.ghn.config


class VariantError(GraphkitError, ValueError):
    """An unknown LoGAH variant or decoder, or bad role maps; ``field`` names the config field."""

    def __init__(self, message: str, field: str = "decoder") -> None:
        super().__init__(message)
        self.field = field


# raised by graphkit.ghn.encoding


class EncodingError(GraphkitError, ValueError):
    """An architecture the hypernetwork's config cannot encode (a parameter too wide)."""


# raised by graphkit.ghn.checkpoint


class UntrainedOpError(CheckpointError):
    """A model has op kinds the hypernetwork (or, choosing a bundled one, every one that fits)
    never trained on; ``missing`` holds them, so that the zoo report counts refusals by them."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


# raised by graphkit.ghn.grow


class GrowError(GraphkitError, ValueError):
    """A wide model whose narrow twin cannot be built (no whole number of heads fits)."""


# raised by graphkit.ghn.keep_init


class KeepInitError(GraphkitError):
    """A meta-built model has a parameter that no library initialisation fills, so there is no
    initialisation to keep."""


# raised by graphkit.ghn.calibrate


class CalibrationError(GraphkitError):
    """A model whose residual stream cannot be calibrated (not one of graphkit's families, or
    blocks whose branches are not the pre-norm pattern the rule reads)."""


# raised by graphkit.ghn.predict


class PredictError(GraphkitError):
    """The hypernetwork cannot predict this model, or produced unusable parameters."""


# raised by graphkit.ghn.evaluate


class EvalError(GraphkitError, ValueError):
    """An evaluation option out of range (steps, architectures, batch sizes, lr, device)."""

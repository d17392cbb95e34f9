"""What the scikit-learn, XGBoost and LightGBM backends share: one 2-D feature input, and
``label`` + ``probabilities`` outputs for a classifier or ``prediction`` for a regressor.

A framework module reads its file into a ``TabularModel`` (how many features and classes,
two batch functions); this module completes the config from it and runs whole batches.

Tensors (names of the outputs are fixed; the input takes the config's name, default ``input``):

- ``input``: FP32 ``[batch, n_features]`` (a config may declare another numeric type);
- classifier: ``label`` INT64 ``[batch]`` (BYTES for string classes), the predicted class,
  and ``probabilities`` FP32 ``[batch, n_classes]``, one column per class in class order;
- regressor: ``prediction`` FP32 ``[batch]`` (``[batch, n_targets]`` for several targets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import TensorIO, complete
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import datatype_of
from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import ConfigError, InternalError
from inferd.core.types import Tensors

INPUT = "input"
LABEL = "label"
PROBABILITIES = "probabilities"
PREDICTION = "prediction"

Batch = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class TabularModel:
    """A loaded tree or scikit-learn model, seen through its batch functions."""

    n_features: int  # -1 when the file does not say
    predict: Batch  # labels (classifier) or values (regressor), one row per input row
    predict_proba: Batch | None = None  # classifiers: [rows, n_classes]
    n_classes: int = 0  # 0 for a regressor
    label_type: DataType = datatypes.BY_NAME["INT64"]
    n_targets: int = 1  # regressor outputs per row
    label_from_proba: bool = False  # label = argmax of predict_proba (trees): compute once
    classes: np.ndarray | None = None  # with label_from_proba: the label of each column

    @property
    def is_classifier(self) -> bool:
        return self.n_classes > 0


def tensors(model: TabularModel) -> tuple[list[TensorIO], list[TensorIO]]:
    inputs = [TensorIO(INPUT, datatypes.FP32, (-1, model.n_features))]
    if model.is_classifier:
        outputs = [TensorIO(LABEL, model.label_type, (-1,))]
        if model.predict_proba is not None:
            outputs.append(TensorIO(PROBABILITIES, datatypes.FP32, (-1, model.n_classes)))
    else:
        shape = (-1,) if model.n_targets == 1 else (-1, model.n_targets)
        outputs = [TensorIO(PREDICTION, datatypes.FP32, shape)]
    return inputs, outputs


def complete_tabular(
    config: ModelConfig, model: TabularModel, default_max_batch_size: int, backend: str
) -> None:
    """Complete the config; the input may take any name and any numeric datatype."""
    inputs, outputs = tensors(model)
    if len(config.input) > 1:
        raise ConfigError(
            f"a {backend} model takes one input, the config lists {len(config.input)}"
        )
    if config.input:
        declared = config.input[0]
        datatype = inputs[0].datatype
        if declared.data_type:
            datatype = _numeric(declared.data_type, f"input '{declared.name}'")
        inputs = [TensorIO(declared.name, datatype, inputs[0].shape)]
    by_name = {o.name: o for o in outputs}
    for output in config.output:
        found = by_name.get(output.name)
        if found is not None and output.data_type and found.datatype is not datatypes.BYTES:
            datatype = _numeric(output.data_type, f"output '{output.name}'")
            by_name[output.name] = TensorIO(found.name, datatype, found.shape)
    complete(
        config,
        inputs,
        list(by_name.values()),
        default_max_batch_size,
        platform="",
        backend=backend,
    )


def _numeric(enum_value: int, where: str) -> DataType:
    datatype = datatype_of(enum_value, where)
    if datatype.is_bytes or datatype.name == "BF16":
        raise ConfigError(f"{where}: a tabular model needs a numeric datatype, not {datatype.name}")
    return datatype


class TabularRuntime(Runtime):
    """Runs one TabularModel on whole batches (the frameworks release the GIL in C code)."""

    inline = True

    def __init__(self, model: TabularModel, config: ModelConfig, framework: str) -> None:
        self._model = model
        self._framework = framework
        self._input = config.input[0].name
        self._dtypes = {
            o.name: datatype_of(o.data_type, f"output '{o.name}'").numpy for o in config.output
        }

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        x = inputs[self._input]
        if x.ndim != 2:
            x = x.reshape(len(x), -1)
        model = self._model
        try:
            proba = None
            if model.predict_proba is not None and (
                PROBABILITIES in output_names or (model.label_from_proba and LABEL in output_names)
            ):
                proba = model.predict_proba(x)
            outputs: Tensors = {}
            for name in output_names:
                if name == PROBABILITIES and proba is not None:
                    outputs[name] = proba
                elif name == LABEL and model.label_from_proba and proba is not None:
                    labels = labels_from_proba(proba)
                    outputs[name] = labels if model.classes is None else model.classes[labels]
                else:
                    outputs[name] = model.predict(x)
        except Exception as exc:
            raise InternalError(f"{self._framework} prediction failed: {exc}") from None
        for name, array in outputs.items():
            outputs[name] = _as(array, self._dtypes[name])
        return outputs

    def close(self) -> None:
        pass


def _as(array: np.ndarray, dtype: np.dtype[np.generic]) -> np.ndarray:
    array = np.asarray(array)
    if dtype == np.object_:
        if array.dtype == np.object_ and (array.size == 0 or isinstance(array.flat[0], bytes)):
            return array
        # Element by element: fixed-width numpy strings would drop trailing NULs.
        flat = array.reshape(-1).tolist()
        encoded: np.ndarray = np.empty(len(flat), dtype=object)
        encoded[:] = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat]
        return encoded.reshape(array.shape)
    return array.astype(dtype, copy=False)


def labels_from_proba(proba: np.ndarray) -> np.ndarray:
    """Class indices from a [rows, classes] probability matrix (ties: the first class)."""
    labels: np.ndarray = np.argmax(proba, axis=1).astype(np.int64)
    return labels


def binary_proba(positive: np.ndarray) -> np.ndarray:
    """[rows] probabilities of class 1 into [rows, 2] columns for classes 0 and 1."""
    positive = np.asarray(positive, dtype=np.float64).reshape(-1)
    return np.stack([1.0 - positive, positive], axis=1)


class TabularBackend(Backend):
    """The Backend of a framework whose model file reads into a TabularModel; a framework
    module names itself, its default file and its reader
    (``read(version_dir, config, threads)``)."""

    name = ""
    framework = ""  # as error messages spell it
    default_filename = ""
    platforms: tuple[str, ...] = ()
    read: Callable[[Path, ModelConfig, int], TabularModel]

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        complete_tabular(
            config, self.read(version_dir, config, 1), default_max_batch_size, self.name
        )

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> TabularRuntime:
        model = self.read(version_dir, config, placement.cpu_threads())
        return TabularRuntime(model, config, self.framework)

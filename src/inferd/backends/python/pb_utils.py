"""``triton_python_backend_utils``: what a model written for Triton's Python backend imports.

In a worker, ``import triton_python_backend_utils as pb_utils`` gives this module: tensors,
requests and responses, errors, the logger, config helpers, the auto-complete ``ModelConfig``,
and model-to-model calls (``InferenceRequest(...).exec()`` / ``await .async_exec()``) run
through the called model's own scheduler. Written from Triton's documented interface; no custom
metrics, model-loading API or GPU (DLPack device) tensors.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inferd.backends.python.autocomplete import ModelConfig as ModelConfig
from inferd.backends.python.autocomplete import TritonModelException as TritonModelException
from inferd.core.errors import (
    InferdError,
    InternalError,
    InvalidInput,
    NotFound,
    Unavailable,
    Unimplemented,
)

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# Triton's config data types: name, enum value, numpy type (BF16: none without ml_dtypes).
_TYPES: tuple[tuple[str, int, Any], ...] = (
    ("TYPE_BOOL", 1, np.bool_),
    ("TYPE_UINT8", 2, np.uint8),
    ("TYPE_UINT16", 3, np.uint16),
    ("TYPE_UINT32", 4, np.uint32),
    ("TYPE_UINT64", 5, np.uint64),
    ("TYPE_INT8", 6, np.int8),
    ("TYPE_INT16", 7, np.int16),
    ("TYPE_INT32", 8, np.int32),
    ("TYPE_INT64", 9, np.int64),
    ("TYPE_FP16", 10, np.float16),
    ("TYPE_FP32", 11, np.float32),
    ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_),
)
_BY_NAME = {name: numpy for name, _, numpy in _TYPES}
_BY_ENUM = {value: numpy for _, value, numpy in _TYPES}
_LEN = struct.Struct("<I")


def _bfloat16() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a config data type name: ``"TYPE_FP32"`` -> ``np.float32``."""
    if triton_type_string == "TYPE_BF16":
        return _bfloat16()
    return _BY_NAME.get(triton_type_string)


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a config data type enum value (11 -> ``np.float32``)."""
    if data_type == 14:
        return _bfloat16()
    return _BY_ENUM.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The config data type enum value of a numpy type (strings and bytes: TYPE_STRING)."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return 13
    if dtype.name == "bfloat16":
        return 14
    for _, value, numpy in _TYPES:
        if numpy is not np.object_ and np.dtype(numpy) == dtype:
            return value
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """A BYTES tensor in Triton's wire form (4-byte length before each element), as a 0-d
    object array holding one ``bytes``; an empty tensor gives an empty array."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=object)
    parts: list[bytes] = []
    for item in input_tensor.ravel(order="C").tolist():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += (_LEN.pack(len(data)), data)
    return np.array(b"".join(parts), dtype=object)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of a serialized BYTES tensor, as a 1-d object array of ``bytes``."""
    view = memoryview(encoded_tensor)
    items: list[bytes] = []
    offset = 0
    while offset < len(view):
        (size,) = _LEN.unpack_from(view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + size]))
        offset += size
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class TritonError:
    """An error for one response (``InferenceResponse(error=...)``); not an exception."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"

    def as_inferd(self) -> InferdError:
        """The server's error for this one (its class decides the HTTP/gRPC status)."""
        kinds: dict[int, type[InferdError]] = {
            TritonError.INVALID_ARG: InvalidInput,
            TritonError.ALREADY_EXISTS: InvalidInput,
            TritonError.NOT_FOUND: NotFound,
            TritonError.UNAVAILABLE: Unavailable,
            TritonError.CANCELLED: Unavailable,
            TritonError.UNSUPPORTED: Unimplemented,
        }
        return kinds.get(self._code, InternalError)(self._message)

    @classmethod
    def of(cls, error: InferdError) -> TritonError:
        codes: dict[type[InferdError], int] = {
            InvalidInput: cls.INVALID_ARG,
            NotFound: cls.NOT_FOUND,
            Unavailable: cls.UNAVAILABLE,
            Unimplemented: cls.UNSUPPORTED,
        }
        for kind in type(error).__mro__:
            if kind in codes:
                return cls(error.message, codes[kind])
        return cls(error.message, cls.INTERNAL)


class Tensor:
    """A named tensor, backed by a numpy array (BYTES: an object array of ``bytes``)."""

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, data: Any) -> None:
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind in "SU":
            items = array.ravel().tolist()
            converted = np.empty(len(items), dtype=object)
            converted[:] = [i if isinstance(i, bytes) else str(i).encode("utf-8") for i in items]
            array = converted.reshape(array.shape)
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(dlpack))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _parameters_dict(parameters: dict[str, Any] | str | None) -> dict[str, Any]:
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        value = json.loads(parameters)
        if not isinstance(value, dict):
            raise TritonModelException("parameters must be a JSON object")
        return value
    return dict(parameters)


class InferenceResponse:
    """One response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or ())
        self._error = error
        self._parameters = _parameters_dict(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters, default=str)


class InferenceResponseSender:
    """Sends the responses of one request (``request.get_response_sender()``). A model that is
    not decoupled sends exactly one response, with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; a
    decoupled one (``model_transaction_policy { decoupled: true }``) sends any number, the last
    flagged final (``send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`` alone ends it too)."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        request = self._request
        if request._final:
            raise TritonModelException("this request's final response was already sent")
        if request._emit is not None:
            request._emit(response, flags)
        elif response is not None:
            if request._sent is not None:
                raise TritonModelException(
                    "this model is not decoupled: a request gets exactly one response"
                )
            request._sent = response
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            request._final = True

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()


class InferenceRequest:
    """A request given to ``execute``, or one a model builds to call another model (BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or ())
        self._outputs = list(requested_output_names or ())
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = _parameters_dict(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._cancelled: Callable[[], bool] = _never
        self._sent: InferenceResponse | None = None  # via the response sender
        self._final = False  # the final response (flag) was sent
        # Decoupled models: where the sender delivers each response (set by the executor).
        self._emit: Callable[[InferenceResponse | None, int], None] | None = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def parameters(self) -> str:
        """The request's parameters as a JSON object string (``json.loads`` it)."""
        return json.dumps(self._parameters, default=str)

    def timeout(self) -> int:
        return self._timeout

    def trace(self) -> Any:
        return self._trace

    def is_cancelled(self) -> bool:
        """Whether the caller of this request has gone away."""
        return self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        return InferenceResponseSender(self)

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("rescheduling a request needs an iterative sequence batcher")
        self._release_flags = flags

    # ------------------------------------------------------------------ calls to other models

    def _call_arguments(self) -> tuple[str, str, dict[str, np.ndarray], list[str], dict[str, Any]]:
        if not self._model_name:
            raise TritonModelException("InferenceRequest needs a model_name to be executed")
        parameters = dict(self._parameters)
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        if self._timeout:
            parameters["timeout"] = int(self._timeout)
        version = str(self._model_version) if self._model_version >= 0 else ""
        inputs = {t.name(): t.as_numpy() for t in self._inputs}
        return self._model_name, version, inputs, self._outputs, parameters

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: an ``InferenceResponse`` (an iterator of
        one with ``decoupled=True``). A failure is in the response, never raised."""
        host = _host()
        if host is None:
            response = _failed("calls to other models work only in a worker process")
        else:
            model, version, inputs, outputs, parameters = self._call_arguments()
            response = _response(
                host.call(model, version, inputs, outputs, self._request_id, parameters)
            )
        return iter([response]) if decoupled else response

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for ``async def execute``: other calls proceed while this one waits."""
        host = _host()
        if host is None:
            response = _failed("calls to other models work only in a worker process")
        else:
            model, version, inputs, outputs, parameters = self._call_arguments()
            response = _response(
                await host.call_async(model, version, inputs, outputs, self._request_id, parameters)
            )
        return iter([response]) if decoupled else response


def _host() -> Any:
    """This model process's side (None in the server): imported once, then kept."""
    global _current_host
    if _current_host is None:
        from inferd.backends.process import current

        _current_host = current
    return _current_host()


_current_host: Callable[[], Any] | None = None


def _never() -> bool:
    return False


def _failed(message: str) -> InferenceResponse:
    return InferenceResponse(error=TritonError(message, TritonError.UNAVAILABLE))


def _response(result: dict[str, np.ndarray] | InferdError) -> InferenceResponse:
    if isinstance(result, InferdError):
        return InferenceResponse(error=TritonError.of(result))
    return InferenceResponse([Tensor(name, array) for name, array in result.items()])


class PreferredMemory:
    """Where a model would like a call's outputs (CPU only here)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, device_id: int = 0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = device_id


class Logger:
    """The model's log, in the server's log: ``pb_utils.Logger.log_info("...")``."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS = {INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR, VERBOSE: 5}
    _log = logging.getLogger("model")

    @staticmethod
    def log(message: str, level: int = INFO) -> None:
        Logger._log.log(Logger._LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for tensor in model_config.get("input", ()):
        if tensor.get("name") == name:
            found: dict[str, Any] = tensor
            return found
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for tensor in model_config.get("output", ()):
        if tensor.get("name") == name:
            found: dict[str, Any] = tensor
            return found
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))

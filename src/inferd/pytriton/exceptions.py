"""PyTriton's exceptions, by PyTriton's names (``pytriton.exceptions``)."""

from __future__ import annotations


class MessageError(Exception):
    """An error whose ``message`` attribute is its text, as PyTriton's errors have."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class PyTritonError(MessageError):
    """The base of PyTriton's server-side errors."""


class PyTritonValidationError(PyTritonError):
    """A value that fails validation."""


class PyTritonInvalidOperationError(PyTritonError):
    """An operation the object's state does not allow."""


class PyTritonBadParameterError(PyTritonError):
    """A bad parameter."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration that cannot be served."""


class PyTritonUnrecoverableError(PyTritonError):
    """An error the server cannot recover from."""


class PyTritonRuntimeError(PyTritonError):
    """An error while the server runs (in a decorator, say)."""

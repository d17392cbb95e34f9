"""Typed errors raised by the core; only protocol adapters map them to HTTP or gRPC statuses.

The tree:

    InferdError                    code
    ├── InvalidInput               INVALID_ARGUMENT  (bad request: shape, datatype, JSON ...)
    │   ├── PayloadTooLarge        PAYLOAD_TOO_LARGE (body over the configured limit)
    │   └── UnsupportedMediaType   UNSUPPORTED_MEDIA_TYPE (a browser "simple" request type)
    ├── NotFound                   NOT_FOUND         (unknown model, version, label, route)
    ├── Unauthenticated            UNAUTHENTICATED   (no token, or a token the server does not know)
    ├── PermissionDenied           PERMISSION_DENIED (a token without the scope; a refused origin,
    │                                                 host, content type; code the server won't run)
    ├── Unavailable                UNAVAILABLE       (model not ready, queue full, shutting down)
    │   └── Overloaded             UNAVAILABLE       (server-wide in-flight limit reached)
    ├── ClientGone                 CANCELLED         (the client hung up; nobody reads the answer)
    ├── RequestTimeout             REQUEST_TIMEOUT   (the client sent its body too slowly)
    ├── DeadlineExceeded           DEADLINE_EXCEEDED (timed out in the queue)
    ├── Unimplemented              UNIMPLEMENTED     (a feature the server does not offer)
    ├── ModelLoadError             INTERNAL          (a model version failed to load)
    │   └── ConfigError            INTERNAL          (config.pbtxt does not parse or validate)
    └── InternalError              INTERNAL          (a backend failed while executing)
        └── ModelFailed            INTERNAL          (a model's own code failed a request with
                                                      the HTTP status it chose: TorchServe's)

Every message is one line that names the field or object at fault.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    NOT_FOUND = "NOT_FOUND"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    UNAVAILABLE = "UNAVAILABLE"
    CANCELLED = "CANCELLED"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"


class InferdError(Exception):
    """Base of every error the server reports to a client."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(InferdError):
    code = ErrorCode.INVALID_ARGUMENT


class PayloadTooLarge(InvalidInput):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class UnsupportedMediaType(InvalidInput):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class NotFound(InferdError):
    code = ErrorCode.NOT_FOUND


class Unauthenticated(InferdError):
    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(InferdError):
    code = ErrorCode.PERMISSION_DENIED


class Unavailable(InferdError):
    code = ErrorCode.UNAVAILABLE


class Overloaded(Unavailable):
    """The server is at its in-flight limit: answered at once, before reading the body."""


class ClientGone(InferdError):
    """The client hung up; nobody reads the answer."""

    code = ErrorCode.CANCELLED


class RequestTimeout(InferdError):
    code = ErrorCode.REQUEST_TIMEOUT


class DeadlineExceeded(InferdError):
    code = ErrorCode.DEADLINE_EXCEEDED


class Unimplemented(InferdError):
    code = ErrorCode.UNIMPLEMENTED


class ModelLoadError(InferdError):
    code = ErrorCode.INTERNAL


class ConfigError(ModelLoadError):
    pass


class InternalError(InferdError):
    code = ErrorCode.INTERNAL


class ModelFailed(InternalError):
    """A model's own code failed the request and chose the HTTP status to answer with (a
    TorchServe handler's ``PredictionException``; 503 "Prediction failed" for any other
    exception). Frontends that speak the model's own protocol answer ``status``."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status

"""TorchServe's errors: the (code, type, message) its APIs answer, for any inferd error.

TorchServe names each error by the Java exception behind it (``ModelNotFoundException``,
``BadRequestException``, ``InternalServerException``...) and answers HTTP with
``{"code", "type", "message"}`` and gRPC with a status whose message is the error's message,
a new line, then the exception's class. Clients parse both, so the words are TorchServe's.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.backends.work import InstanceFailed
from inferd.core.errors import ErrorCode, InferdError, ModelFailed

NOT_FOUND_MESSAGE = "Requested resource is not found, please refer to API document."
METHOD_MESSAGE = "Requested method is not allowed, please refer to API document."
TOKEN_MESSAGE = (
    "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
)
# The package of TorchServe's exceptions, as its gRPC messages name them.
_PACKAGES = {
    "ModelNotFoundException": "org.pytorch.serve.archive.model",
    "ModelVersionNotFoundException": "org.pytorch.serve.archive.model",
    "ModelException": "org.pytorch.serve.archive.model",
    "InvalidKeyException": "org.pytorch.serve.archive.model",
    "DownloadArchiveException": "org.pytorch.serve.archive",
    "WorkerInitializationException": "org.pytorch.serve.wlm",
}
_CODES = {
    400: ErrorCode.INVALID_ARGUMENT,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.INVALID_ARGUMENT,
    408: ErrorCode.REQUEST_TIMEOUT,
    409: ErrorCode.INVALID_ARGUMENT,
    503: ErrorCode.UNAVAILABLE,
}


class TorchServeError(InferdError):
    """An error in TorchServe's words: its HTTP status, exception type and message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = _CODES.get(status, ErrorCode.INTERNAL)


def model_not_found(name: str) -> TorchServeError:
    return TorchServeError(404, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> TorchServeError:
    return TorchServeError(
        404,
        "ModelVersionNotFoundException",
        f"Model version: {version} does not exist for model: {name}",
    )


def bad_request(message: str) -> TorchServeError:
    return TorchServeError(400, "BadRequestException", message)


def no_worker(name: str, version: str = "") -> TorchServeError:
    which = f'" Version {version}' if version else ""
    return TorchServeError(
        503,
        "ServiceUnavailableException",
        f'Model "{name}{which}" has no worker to serve inference request. Please use scale '
        "workers API to add workers. If this is a sequence inference, please check if it is "
        "closed, or expired; or exceeds maxSequenceJobQueueSize",
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """An error as TorchServe answers it."""

    status: int
    kind: str
    message: str

    def as_json(self) -> dict[str, object]:
        return {"code": self.status, "type": self.kind, "message": self.message}

    def grpc_message(self) -> str:
        """gRPC's status message: the message, then the exception's class."""
        package = _PACKAGES.get(self.kind, "org.pytorch.serve.http")
        return f"{self.message}\n{package}.{self.kind}"


_BY_CODE = {
    ErrorCode.INVALID_ARGUMENT: (400, "BadRequestException"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "BadRequestException"),
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: (415, "BadRequestException"),
    ErrorCode.NOT_FOUND: (404, "ResourceNotFoundException"),
    ErrorCode.UNAUTHENTICATED: (400, "InvalidKeyException"),
    ErrorCode.PERMISSION_DENIED: (403, "PermissionDeniedException"),
    ErrorCode.UNAVAILABLE: (503, "ServiceUnavailableException"),
    ErrorCode.CANCELLED: (499, "InternalServerException"),
    ErrorCode.REQUEST_TIMEOUT: (408, "RequestTimeoutException"),
    ErrorCode.DEADLINE_EXCEEDED: (408, "RequestTimeoutException"),
    ErrorCode.UNIMPLEMENTED: (501, "InternalServerException"),
    ErrorCode.INTERNAL: (500, "InternalServerException"),
}


def answer(error: InferdError) -> Answer:
    """How TorchServe answers ``error``: a handler's own status (413 becomes 507, as in
    TorchServe), an error of its own, else by the error's code."""
    if isinstance(error, TorchServeError):
        return Answer(error.status, error.kind, error.message)
    if isinstance(error, ModelFailed):
        status = 507 if error.status == 413 else error.status
        return Answer(status, "InternalServerException", error.message)
    if isinstance(error, InstanceFailed):  # the worker crashed or outlived responseTimeout
        return Answer(500, "InternalServerException", "Worker died.")
    status, kind = _BY_CODE[error.code]
    if error.code is ErrorCode.UNAUTHENTICATED:
        return Answer(status, kind, TOKEN_MESSAGE)
    if error.code is ErrorCode.NOT_FOUND:
        return Answer(status, kind, NOT_FOUND_MESSAGE)
    return Answer(status, kind, error.message)

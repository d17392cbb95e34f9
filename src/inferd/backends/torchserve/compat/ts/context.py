"""``ts.context``: what a handler learns about its model and each request of a batch.

``Context`` holds the model's name, ``manifest``, ``system_properties`` (``model_dir``,
``gpu_id``, ``batch_size``, ``server_name``, ``server_version``), ``model_yaml_config`` and
``metrics``; per request (by its index in the batch) the request id and headers, and the
response's status, content type and headers the handler sets. Header names are matched
without regard to case (HTTP/2 and most servers send them in lower case).
"""

from __future__ import annotations

import os
from typing import Any


class RequestProcessor:
    """One request's headers, and what the handler sets on its response."""

    def __init__(self, request_header: dict[str, Any]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header

    def get_request_property(self, key: str) -> Any:
        found = self._request_header.get(key)
        if found is None and isinstance(key, str):
            found = self._request_header.get(key.lower())
        return found

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_header


class Context:
    """The ``context`` argument of ``initialize`` and ``handle``."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any] | None,
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: Any = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] | None = None
        self.metrics = metrics
        self.model_yaml_config = model_yaml_config if model_yaml_config is not None else {}
        self.stopping_criteria: Any = None
        # Set by the worker while handle() runs: sends a streaming handler's intermediate
        # answers (ts.handler_utils.utils.send_intermediate_predict_response).
        self._send_intermediate: Any = None
        self.header_key_sequence_id = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
        self.header_key_sequence_start = os.getenv(
            "TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start"
        )
        self.header_key_sequence_end = os.getenv(
            "TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end"
        )

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor] | None) -> None:
        self._request_processor = request_processor

    def _request(self, idx: int) -> RequestProcessor:
        processors = self._request_processor
        if processors is None:
            raise IndexError("no request is being handled")
        return processors[idx]

    def get_request_id(self, idx: int = 0) -> str | None:
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._request(idx).get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self._request(idx).get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        request = self._request(idx)
        return request.get_response_status_code(), request.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """The status of request ``idx``'s response."""
        processors = self._request_processor
        if processors is not None and processors[idx] is not None:
            processors[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for request in self._request_processor or ():
            request.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._request(idx).get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._request(idx).add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> Any:
        return self._request(idx).get_request_property(self.header_key_sequence_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self.__dict__ == other.__dict__

    __hash__ = object.__hash__

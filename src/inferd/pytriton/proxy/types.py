"""``pytriton.proxy.types``: ``Request``, one request as an inference function gets it (inputs
by name, ``parameters``, ``requested_output_names``), and ``Requests``."""

from __future__ import annotations

from inferd.backends.function import FunctionRequest

Request = FunctionRequest
Requests = list[FunctionRequest]

__all__ = ["Request", "Requests"]

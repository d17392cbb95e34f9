"""TF Serving's REST API in the OpenAPI description (``/v1``), and KServe v1's liveness."""

from __future__ import annotations

from inferd.protocols.openapi import INFER_ERRORS, MODEL_ERRORS, merge, model_paths, operation
from inferd.protocols.openapi_schemas import Schema, ref
from inferd.security.access import Access


def tfserving_paths() -> dict[str, Schema]:
    """TF Serving's REST API (``/v1``), with KServe v1's name and ready in a model's status."""
    paths: dict[str, Schema] = {}
    status = operation(
        "TF Serving model status, with KServe v1's name and ready",
        ref("TfModelStatus"),
        errors=MODEL_ERRORS,
    )
    merge(paths, model_paths("/v1/models", "", "get", status))
    metadata = operation("TF Serving metadata", ref("Object"), errors=INFER_ERRORS)
    merge(paths, model_paths("/v1/models", "/metadata", "get", metadata))
    for verb, body, ok in (
        ("predict", "TfPredictRequest", "TfPredictResponse"),
        ("classify", "TfExamplesRequest", "TfResultsResponse"),
        ("regress", "TfExamplesRequest", "TfResultsResponse"),
    ):
        op = operation(
            f"TF Serving {verb}",
            ref(ok),
            body=ref(body),
            body_required=True,
            errors=INFER_ERRORS,
        )
        merge(paths, model_paths("/v1/models", f":{verb}", "post", op))
    return paths


def kserve_v1_live_paths() -> dict[str, Schema]:
    """``GET /``: KServe v1's server liveness."""
    return {"/": {"get": operation("KServe v1 server liveness", ref("Live"), access=Access.HEALTH)}}

"""Property-based fuzzing of a live server from its own OpenAPI description (schemathesis).

Every operation of ``/v2/openapi.json`` gets generated requests, valid and invalid, against a
server in the default layout (a model host and HTTP frontends). Each answer must be below 500,
of a status the operation lists, of a documented content type and valid against the listed
schema; a schema-violating request must be refused with a 4xx, and a schema-valid one accepted
(except where the body must fit what is served: a model's tensors, an archive, a config).
Path parameters are drawn from the served models (and one unknown name) so that the requests
reach the decoders rather than stopping at 404.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from tests.e2e.lifecycle_support import write_version  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

CASES_PER_MODE = 12  # per operation, valid and invalid each: about two minutes in all
MODELS = ["half_plus_two", "strings", "nope"]
STRINGS = """backend: "echo"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_STRING dims: [1] }]
"""
# Where a schema-valid request may still be answered 400: its body must fit what is served (a
# model's inputs, a model archive, a model config, label names and ready versions, an existing
# shared memory key, the trace exporter the server was started with), or 400 is the answer
# itself (KServe v2's model readiness: 200 ready, 400 not).
VALID_MAY_FAIL = re.compile(
    r"POST /v2/models/.*/(infer|generate|generate_stream)$"
    r"|POST /v1/models/.*:(predict|classify|regress)$"
    r"|PUT /v2/repository/models/\{model\}$|POST /v2/repository/models/\{model\}/"
    r"(load|labels|routing)$|GET /v2/models/.*/ready$|POST /v2/.*/register$"
    r"|POST /v2/(models/\{model\}/)?trace/setting$"
)
# Where the documented answer is a 5xx: CUDA shared memory needs a GPU (501, as Triton).
SERVER_ERROR_DOCUMENTED = {"POST /v2/cudasharedmemory/region/{name}/register"}
# Not fuzzed: a log file the request names is opened and written (the fuzzer would scatter
# files, and could turn the log off that the test reads).
NOT_FUZZED = {"POST /v2/logging"}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fuzz") / "models"
    write_version(root / "half_plus_two", 1)
    (root / "strings" / "1").mkdir(parents=True)
    (root / "strings" / "config.pbtxt").write_text(STRINGS)
    server = ServerProcess(
        root,
        extra_args=[
            *("--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "0"),
            *("--http-workers", "3"),
        ],
    ).start()
    yield server
    server.stop()


def _pin_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    """Model, version and label path parameters from what is served (load, unload and upload
    only touch other names, so that the served ones stay ready while the fuzzing runs)."""
    for path, ops in doc["paths"].items():
        changes = path.endswith(("/load", "/unload")) or path == "/v2/repository/models/{model}"
        pinned = {
            "model": ["scratch", "nope"] if changes else MODELS,
            "version": ["1", "2"],
            "label": ["stable", "nope"],
        }
        for op in ops.values():
            for parameter in op.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in pinned:
                    parameter["schema"] = {"type": "string", "enum": pinned[parameter["name"]]}
    return doc


@pytest.fixture(scope="module")
def api_schema(fuzzed: ServerProcess) -> Any:
    doc = httpx.get(f"{fuzzed.http_url}/v2/openapi.json", timeout=60).json()
    schema = schemathesis.openapi.from_dict(_pin_parameters(doc))
    schema.config.update(base_url=fuzzed.http_url)
    return schema


def _fuzz(operation: Any, mode: Any, checks: list[Any], counted: dict[str, int]) -> list[str]:
    """Run ``operation``'s generated cases of ``mode``; the failures found, one line each."""
    failures: list[str] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=CASES_PER_MODE,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        from schemathesis.core.failures import FailureGroup

        label = case.operation.label
        counted[label] = counted.get(label, 0) + 1
        response = case.call(timeout=60)
        try:
            case.validate_response(response, checks=checks)
        except FailureGroup as exc:  # every failure, not only the first
            for failure in exc.exceptions:
                what = " ".join(failure.message.split())[:300]
                failures.append(
                    f"{label} -> {response.status_code}: {failure.title}: {what}"
                    f" [{case.as_curl_command()[:300]}]"
                )

    try:
        run()
    except Unsatisfiable:  # nothing invalid to send (no parameters, no body)
        assert mode.is_negative
    return failures


def test_every_operation_under_generated_requests(api_schema: Any, fuzzed: ServerProcess) -> None:
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi import checks

    every = [
        not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
        checks.negative_data_rejection,
        checks.positive_data_acceptance,
    ]
    counted: dict[str, int] = {}
    failures: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.label in NOT_FUZZED:
            continue
        selected = every
        if VALID_MAY_FAIL.search(operation.label):
            selected = [c for c in selected if c is not checks.positive_data_acceptance]
        if operation.label in SERVER_ERROR_DOCUMENTED:
            selected = [c for c in selected if c is not not_a_server_error]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += _fuzz(operation, mode, selected, counted)
    total = sum(counted.values())
    print(f"\nschemathesis: {total} cases over {len(counted)} operations, {len(failures)} failed")
    assert not failures, "\n".join(sorted(set(failures))[:40])
    doc = httpx.get(f"{fuzzed.http_url}/v2/openapi.json", timeout=60).json()
    assert len(counted) + len(NOT_FUZZED) == sum(len(ops) for ops in doc["paths"].values())
    assert total >= 1000
    assert httpx.get(f"{fuzzed.http_url}/v2/health/ready", timeout=60).status_code == 200
    assert "Traceback" not in Path(fuzzed.log_path or "").read_text()

"""Property-based fuzzing of a live server from its own OpenAPI description (schemathesis).

Every operation of ``/v2/openapi.json`` gets generated requests, valid and invalid; each answer
must be below 500, of a documented status and content type, and valid against the schema. Path
parameters naming a model are drawn from the served models (and one unknown name) so that the
requests reach the decoders rather than stopping at 404. The last test checks the total count.
"""

from __future__ import annotations

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

CASES_PER_OPERATION = 60
MODELS = ["half_plus_two", "strings", "nope"]
STRINGS = """backend: "echo"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_STRING dims: [1] }]
"""


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fuzz") / "models"
    write_version(root / "half_plus_two", 1)
    (root / "strings" / "1").mkdir(parents=True)
    (root / "strings" / "config.pbtxt").write_text(STRINGS)
    server = ServerProcess(
        root,
        extra_args=["--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "0"],
    ).start()
    yield server
    server.stop()


def _pin_models(doc: dict[str, Any]) -> dict[str, Any]:
    """Model path parameters from the served models (load, unload and upload only touch
    other names, so that the served ones stay ready while the fuzzing runs)."""
    for path, ops in doc["paths"].items():
        changes = path.endswith(("/load", "/unload")) or path == "/v2/repository/models/{model}"
        for op in ops.values():
            for parameter in op.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "model":
                    names = ["scratch", "nope"] if changes else MODELS
                    parameter["schema"] = {"type": "string", "enum": names}
    return doc


@pytest.fixture(scope="module")
def api_schema(fuzzed: ServerProcess) -> Any:
    doc = httpx.get(f"{fuzzed.http_url}/v2/openapi.json", timeout=60).json()
    schema = schemathesis.openapi.from_dict(_pin_models(doc))
    schema.config.update(base_url=fuzzed.http_url)
    return schema


def test_every_operation_under_generated_requests(api_schema: Any, fuzzed: ServerProcess) -> None:
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    counted: dict[str, int] = {}
    failures: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=CASES_PER_OPERATION // 2,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            def run(case: Any) -> None:
                label = case.operation.label
                counted[label] = counted.get(label, 0) + 1
                response = case.call(timeout=30)
                if response.status_code >= 500:
                    failures.append(f"{label}: {response.status_code} {response.text}")
                # Every check but "schema-valid data is accepted": no schema says what makes
                # a valid model archive or a tensor that fits a model.
                case.validate_response(response, excluded_checks=[positive_data_acceptance])

            try:
                run()
            except Unsatisfiable:  # nothing invalid to send (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE
    total = sum(counted.values())
    print(f"\nschemathesis: {total} cases over {len(counted)} operations, {len(failures)} >= 500")
    assert not failures, failures[:5]
    doc = httpx.get(f"{fuzzed.http_url}/v2/openapi.json", timeout=60).json()
    assert len(counted) == sum(len(ops) for ops in doc["paths"].values())
    assert total >= 2000
    assert httpx.get(f"{fuzzed.http_url}/v2/health/ready", timeout=60).status_code == 200
    assert "Traceback" not in Path(fuzzed.log_path or "").read_text()

"""TorchServe's config.properties as inferd settings (``--ts-config``)."""

from __future__ import annotations

from pathlib import Path

from inferd.app import flags
from inferd.torchserve import config_properties

PROPERTIES = """
# TorchServe's own file, as its users write it
inference_address=http://127.0.0.1:9080
management_address=http://127.0.0.1:9081
grpc_inference_port=9070
grpc_management_port: 9071
model_store=/srv/model_store
load_models=mnist=mnist.mar,densenet161.mar
default_workers_per_model=2
allowed_urls=https://models\\.example\\.com/.*
enable_model_api=true
install_py_dep_per_model=false
job_queue_size=50
"""


def test_properties_become_settings_where_flags_left_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_text(PROPERTIES)
    given = flags.parse(["--ts-config", str(path), "--default-workers-per-model", "3"], {})
    applied = config_properties.apply(given, str(path))
    assert applied.http_address == "127.0.0.1"
    assert (applied.torchserve_inference_port, applied.torchserve_management_port) == (9080, 9081)
    assert (applied.torchserve_grpc_inference_port, applied.torchserve_grpc_management_port) == (
        9070,
        9071,
    )
    assert applied.model_store == "/srv/model_store"
    assert applied.models == ["mnist=mnist.mar", "densenet161.mar"]
    assert applied.default_workers_per_model == 3  # the flag wins over the file
    assert applied.allowed_urls == ["https://models\\.example\\.com/.*"]
    assert applied.enable_model_api is True


def test_models_take_several_values_after_one_flag() -> None:
    parsed = flags.parse(["--models", "a=a.mar", "b.mar", "--models", "all"], {})
    assert parsed.models == ["a=a.mar", "b.mar", "all"]
    assert config_properties.parse("a = 1\n! note\nb:2\nc\n") == {"a": "1", "b": "2", "c": ""}

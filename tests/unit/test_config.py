"""config.pbtxt parsing, validation, the JSON form, layout and version policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.model_config_pb2 import ModelVersionPolicy
from inferd.config.spec import build_spec
from inferd.config.text import config_to_dict, parse_config_json, parse_config_text
from inferd.core.errors import ConfigError
from inferd.repository import layout
from inferd.repository.config import read_config

TRITON_CONFIG = """
name: "resnet"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 2 } }
input [ { name: "in", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [ 3, 224, 224 ] } ]
output [ { name: "out", data_type: TYPE_FP32, dims: [ 1000 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def test_triton_config_parses_and_builds_spec() -> None:
    config = parse_config_text(TRITON_CONFIG)
    spec = build_spec(config)
    assert spec.max_batch_size == 8
    assert spec.inputs[0].dims == (3, 224, 224)
    assert spec.inputs[0].shape(8) == [-1, 3, 224, 224]
    assert spec.outputs[0].datatype.name == "FP32"
    assert config.instance_group[0].count == 2


def test_config_json_has_numbers_and_enum_names() -> None:
    as_dict = config_to_dict(parse_config_text(TRITON_CONFIG))
    assert as_dict["input"][0]["dims"] == [3, 224, 224]
    assert as_dict["input"][0]["data_type"] == "TYPE_FP32"
    assert as_dict["version_policy"] == {"latest": {"num_versions": 2}}
    assert as_dict["parameters"] == {"intra_op_thread_count": {"string_value": "1"}}


def test_unknown_field_is_named() -> None:
    with pytest.raises(ConfigError, match='no field named "model_repository_agents"'):
        parse_config_text('name: "m"\nmodel_repository_agents { }\n')


def test_a_typo_gets_the_closest_field_or_the_valid_values() -> None:
    cases = {
        "max_batch_sise: 4": '"max_batch_size" has no field named "max_batch_sise"; '
        'did you mean "max_batch_size"?',
        'input [{ nme: "x" }]': 'message "ModelInput" has no field named "nme"; '
        'did you mean "name"?',
        'input [{ name: "x" data_type: TYPE_FLOAT32 dims: [1] }]': "no value named "
        "TYPE_FLOAT32; valid values (did you mean TYPE_FP32?): TYPE_BOOL, TYPE_UINT8,",
        "instance_group [{ kind: KIND_GPUU }]": "no value named KIND_GPUU; valid values "
        "(did you mean KIND_GPU?): KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL",
    }
    for text, wanted in cases.items():
        with pytest.raises(ConfigError) as refused:
            parse_config_text(text)
        assert wanted.split("; ")[-1] in refused.value.message, refused.value.message
    # no field close enough: the message's fields, not a guess
    with pytest.raises(ConfigError) as refused:
        parse_config_text("model_operations { }")
    assert "did you mean" not in refused.value.message
    assert "; its fields: name, platform, backend," in refused.value.message
    with pytest.raises(ConfigError) as refused:
        parse_config_json({"input": [{"data_type": "TYPE_FLOAT32"}]})
    assert "valid values (did you mean TYPE_FP32?): TYPE_BOOL" in refused.value.message


def test_unimplemented_field_is_named() -> None:
    text = 'input [{ name: "a", data_type: TYPE_INT64, dims: [1], is_shape_tensor: true }]'
    with pytest.raises(ConfigError, match="input 'a': config field 'is_shape_tensor'"):
        build_spec(parse_config_text(text + OUT))


OUT = '\noutput [{ name: "b", data_type: TYPE_FP32, dims: [1] }]'


def test_bad_dims_and_reshape() -> None:
    bad = 'input [{ name: "a", data_type: TYPE_FP32, dims: [0] }]' + OUT
    with pytest.raises(ConfigError, match="dims must be positive or -1"):
        build_spec(parse_config_text(bad))
    bad = 'input [{ name: "a", data_type: TYPE_FP32, dims: [4], reshape: { shape: [3] } }]' + OUT
    with pytest.raises(ConfigError, match="different element count"):
        build_spec(parse_config_text(bad))
    missing_type = (
        'input [{ name: "a", dims: [4] }]\noutput [{ name: "b", data_type: TYPE_FP32, dims: [1] }]'
    )
    with pytest.raises(ConfigError, match="data_type is missing"):
        build_spec(parse_config_text(missing_type))


def test_read_config_checks_the_name(tmp_path: Path) -> None:
    model = tmp_path / "mine"
    model.mkdir()
    assert read_config(model).name == "mine"
    (model / "config.pbtxt").write_text('name: "other"')
    with pytest.raises(ConfigError, match="does not match the model folder 'mine'"):
        read_config(model)


def test_layout_and_version_policies(tmp_path: Path) -> None:
    model = tmp_path / "m"
    for v in ("1", "2", "10", "0", "x"):
        (model / v).mkdir(parents=True)
    assert list(layout.version_dirs(model)) == [1, 2, 10]
    policy = ModelVersionPolicy()
    assert layout.select_versions([1, 2, 10], policy) == [10]
    policy.latest.num_versions = 2
    assert layout.select_versions([1, 2, 10], policy) == [2, 10]
    policy.all.SetInParent()
    assert layout.select_versions([1, 2, 10], policy) == [1, 2, 10]
    policy.specific.versions.extend([1, 10])
    assert layout.select_versions([1, 2, 10], policy) == [1, 10]
    policy.specific.versions.append(3)
    with pytest.raises(ConfigError, match=r"version\(s\) \[3\]"):
        layout.select_versions([1, 2, 10], policy)
    assert list(layout.list_models([tmp_path])) == ["m"]

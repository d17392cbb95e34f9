"""The config.pbtxt reference, generated from inferd's ModelConfig message (its descriptor), with
one short description per field kept here. A field without a description, or a description of
a field the message lacks, fails the build (``missing()``), so the page follows the message."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from inferd.config.model_config_pb2 import ModelConfig

# "Message.field": what it does in inferd. Message names are the protobuf's (Triton's).
DESCRIPTIONS: dict[str, str] = {
    "ModelConfig.name": "the model's name; must match its folder (may be left out: the folder "
    "names it)",
    "ModelConfig.platform": "Triton's platform (`onnxruntime_onnx`, `tensorflow_savedmodel`, "
    "`tensorflow_graphdef`, `pytorch_libtorch`, `ensemble`); usually found from the model file",
    "ModelConfig.backend": "the backend by name (`onnxruntime`, `tensorflow`, `pytorch`, "
    "`openvino`, `sklearn`, `xgboost`, `lightgbm`, `python`), or an installed package's "
    "(see Writing a backend)",
    "ModelConfig.version_policy": "which version folders are served; default: the latest",
    "ModelConfig.max_batch_size": "largest batch (first dimension) one execution takes; 0: the "
    "model does not batch and `dims` are the whole shape. Left out, a batchable model gets "
    "`--default-max-batch-size`",
    "ModelConfig.input": "the inputs clients send",
    "ModelConfig.output": "the outputs clients may receive",
    "ModelConfig.dynamic_batching": "gather requests into batches (see Scheduling)",
    "ModelConfig.sequence_batching": "a stateful model's sequences (see Stateful models)",
    "ModelConfig.ensemble_scheduling": 'the steps of an ensemble (`platform: "ensemble"`)',
    "ModelConfig.instance_group": "how many executions of a version run at once, and where",
    "ModelConfig.optimization": "ONNX Runtime's graph level and execution accelerators; pinned "
    "memory flags are accepted",
    "ModelConfig.default_model_filename": "the model file's name in each version folder, when "
    "it is not the backend's default (it must stay inside the folder)",
    "ModelConfig.metric_tags": "parsed and not used: inferd's metrics carry only the `model` "
    "and `version` labels",
    "ModelConfig.parameters": "backend and inferd parameters, each a `string_value` (thread "
    "counts, `version_labels`, `traffic_split`, `shadow`, `process_instances`, "
    "`EXECUTION_ENV_PATH`...)",
    "ModelConfig.model_warmup": "requests run on every instance before a version is READY",
    "ModelConfig.response_cache": "use the server's response cache (`--cache-size`)",
    "ModelConfig.model_transaction_policy": "whether a Python model is decoupled (0..N "
    "responses per request)",
    "ModelVersionPolicy.latest": "the `num_versions` highest versions",
    "ModelVersionPolicy.all": "every version folder",
    "ModelVersionPolicy.specific": "the listed versions (each must have a folder)",
    "Latest.num_versions": "how many of the highest versions (at least 1)",
    "Specific.versions": "version numbers",
    "ModelInput.name": "the tensor's name",
    "ModelInput.data_type": "its datatype",
    "ModelInput.format": "`FORMAT_NHWC` / `FORMAT_NCHW`: accepted as Triton does, the model "
    "decides its layout",
    "ModelInput.dims": "the shape without the batch dimension; `-1` is any size",
    "ModelInput.reshape": "the shape the model itself takes, when it differs from `dims`",
    "ModelInput.is_shape_tensor": "not supported: a config setting it fails to load",
    "ModelInput.allow_ragged_batch": "not supported: a config setting it fails to load",
    "ModelInput.optional": "clients may leave the input out",
    "ModelOutput.name": "the tensor's name",
    "ModelOutput.data_type": "its datatype",
    "ModelOutput.dims": "the shape without the batch dimension",
    "ModelOutput.reshape": "the shape the model itself gives, when it differs from `dims`",
    "ModelOutput.label_filename": "a file beside `config.pbtxt`, one class label a line, for "
    "the classification extension",
    "ModelOutput.is_shape_tensor": "not supported: a config setting it fails to load",
    "ModelTensorReshape.shape": "the model's own shape (without the batch dimension)",
    "ModelDynamicBatching.preferred_batch_size": "batch sizes to send out as soon as they are "
    "reached (the largest one ships a batch at once)",
    "ModelDynamicBatching.max_queue_delay_microseconds": "longest a request waits for others "
    "to join its batch",
    "ModelDynamicBatching.preserve_ordering": "accepted; responses go back to each caller",
    "ModelDynamicBatching.priority_levels": "number of priority levels; 1 is the highest",
    "ModelDynamicBatching.default_priority_level": "the level of requests that name none",
    "ModelDynamicBatching.default_queue_policy": "queue size and timeouts of every level",
    "ModelDynamicBatching.priority_queue_policy": "a level's own queue policy, by level",
    "ModelQueuePolicy.timeout_action": "`REJECT` a request that timed out in the queue, or "
    "`DELAY` it behind those that have not",
    "ModelQueuePolicy.default_timeout_microseconds": "how long a request may wait in the "
    "queue; 0: no limit",
    "ModelQueuePolicy.allow_timeout_override": "requests may set a shorter `timeout` parameter",
    "ModelQueuePolicy.max_queue_size": "queued requests at most; more answer 503 at once; 0: "
    "no limit",
    "ModelSequenceBatching.max_sequence_idle_microseconds": "a sequence idle this long is "
    "released (default 1 s)",
    "ModelSequenceBatching.control_input": "tensors the server feeds from the sequence's flags",
    "ModelSequenceBatching.state": "implicit state kept by the server between requests",
    "ModelSequenceBatching.direct": "each sequence pinned to one instance's batch slot",
    "ModelSequenceBatching.oldest": "the oldest sequences' requests batched on any instance",
    "StrategyDirect.max_queue_delay_microseconds": "longest wait for a batch to fill",
    "StrategyDirect.minimum_slot_utilization": "share of the instance's sequences (0..1) that "
    "must be ready to send a batch",
    "StrategyOldest.max_candidate_sequences": "sequences batched at once; 0: the instances' "
    "batch slots",
    "StrategyOldest.preferred_batch_size": "batch sizes sent as soon as reached",
    "StrategyOldest.max_queue_delay_microseconds": "longest wait for a batch to fill",
    "ControlInput.name": "the model input the server feeds",
    "ControlInput.control": "what it carries",
    "Control.kind": "`CONTROL_SEQUENCE_START`, `_READY`, `_END` or `_CORRID`",
    "Control.int32_false_true": "the INT32 values fed for false and true",
    "Control.fp32_false_true": "the FP32 values fed for false and true",
    "Control.bool_false_true": "the BOOL values fed for false and true",
    "Control.data_type": "CORRID's datatype (`TYPE_STRING` for string ids)",
    "State.input_name": "the model input fed the state",
    "State.output_name": "the model output kept as the next state",
    "State.data_type": "the state's datatype",
    "State.dims": "the state's shape",
    "State.initial_state": "the state at a sequence's start (zeros when none)",
    "InitialState.data_type": "its datatype",
    "InitialState.dims": "its shape",
    "InitialState.zero_data": "zeros",
    "InitialState.name": "a name for it",
    "ModelInstanceGroup.name": "a name for the group",
    "ModelInstanceGroup.kind": "`KIND_CPU`, `KIND_GPU` (the CPU with a warning when there is "
    "no GPU) or `KIND_AUTO`; `KIND_MODEL` is not supported",
    "ModelInstanceGroup.count": "instances of the version (default 1)",
    "ModelInstanceGroup.gpus": "GPU ids for `KIND_GPU`",
    "ModelInstanceGroup.rate_limiter": "resources and priority of the group's instances for "
    "`--rate-limit execution_count` (see Rate limiter); ignored when the limiter is off",
    "ModelRateLimiter.resources": "what one execution of an instance holds; it runs only when "
    "all are free",
    "ModelRateLimiter.priority": "weight among waiting instances: 2 gets half the turns of 1 "
    "(0 counts as 1)",
    "Resource.name": "the resource's name, shared across models",
    "Resource.global": "one pool for the machine instead of one per device (a CPU instance is on "
    "device 0)",
    "Resource.count": "copies one execution holds",
    "ModelOptimizationPolicy.graph": "ONNX Runtime's graph optimization level",
    "ModelOptimizationPolicy.priority": "only `PRIORITY_DEFAULT`: another value fails to load",
    "ModelOptimizationPolicy.execution_accelerators": "ONNX Runtime execution providers",
    "ModelOptimizationPolicy.input_pinned_memory": "accepted (GPU copies are not staged)",
    "ModelOptimizationPolicy.output_pinned_memory": "accepted (GPU copies are not staged)",
    "Graph.level": "-1 basic, 0 all (the default), 1 extended, 2 all",
    "ExecutionAccelerators.gpu_execution_accelerator": "`tensorrt` or `cuda`, for GPU instances",
    "ExecutionAccelerators.cpu_execution_accelerator": "`openvino`",
    "Accelerator.name": "the accelerator",
    "Accelerator.parameters": "its settings (TensorRT: `precision_mode`, "
    "`max_workspace_size_bytes`, `trt_engine_cache_enable`, `trt_engine_cache_path`)",
    "PinnedMemoryBuffer.enable": "accepted",
    "ModelEnsembling.step": "the composing models, in any order (they run as a graph)",
    "Step.model_name": "the composing model",
    "Step.model_version": "its version; -1: its default",
    "Step.input_map": "composing model input -> ensemble tensor",
    "Step.output_map": "composing model output -> ensemble tensor",
    "Step.model_namespace": "not supported: a config setting it fails to load",
    "ModelParameter.string_value": "the parameter's value",
    "ModelWarmup.name": "a name for the warmup request",
    "ModelWarmup.batch_size": "its batch size",
    "ModelWarmup.inputs": "its inputs, by name",
    "ModelWarmup.count": "how many times it runs on each instance",
    "Input.data_type": "the input's datatype",
    "Input.dims": "its shape without the batch dimension",
    "Input.zero_data": "zeros",
    "Input.random_data": "random values",
    "Input.input_data_file": "raw little-endian values for the whole batch, in "
    "`<model>/warmup/<file>`",
    "ModelResponseCache.enable": "look up and store this model's responses",
    "ModelTransactionPolicy.decoupled": "the model sends 0..N responses per request",
}

_TYPES = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_FLOAT: "float",
}


def _messages(root: Any) -> list[Any]:
    """Every message reachable from ``root``, in the order a reader meets them."""
    seen: list[Any] = []
    queue = [root]
    while queue:
        message = queue.pop(0)
        if message in seen or message.GetOptions().map_entry:
            continue
        seen.append(message)
        for field in message.fields:
            target = _value_message(field)
            if target is not None:
                queue.append(target)
    return seen


def _value_message(field: Any) -> Any:
    if field.message_type is None:
        return None
    if field.message_type.GetOptions().map_entry:
        value = field.message_type.fields_by_name["value"]
        return value.message_type
    return field.message_type


def _enum(enum: Any, sep: str = " \\| ") -> str:
    return sep.join(f"`{v.name}`" for v in enum.values)


def _type(field: Any) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields
        return f"map of {_type(key)} to {_type(value)}"
    if field.message_type is not None:
        name = f"[{field.message_type.name}](#{field.message_type.name.lower()})"
    elif field.enum_type is not None:
        name = _enum(field.enum_type) if len(field.enum_type.values) <= 6 else "`TYPE_*`"
    else:
        name = _TYPES[field.type]
    return f"repeated {name}" if field.is_repeated else name


def missing() -> list[str]:
    """Fields without a description and descriptions of no field (both must be empty)."""
    keys = {f"{m.name}.{f.name}" for m in _messages(ModelConfig.DESCRIPTOR) for f in m.fields}
    return sorted(keys - set(DESCRIPTIONS)) + sorted(set(DESCRIPTIONS) - keys)


def reference() -> str:
    problems = missing()
    if problems:
        raise ValueError(f"config reference out of date: {', '.join(problems)}")
    descriptor: Any = ModelConfig.DESCRIPTOR
    data_type = descriptor.fields_by_name["input"].message_type.fields_by_name["data_type"]
    lines = [
        "# config.pbtxt",
        "",
        "Every field of `config.pbtxt`, generated from inferd's `ModelConfig` message",
        "(`src/inferd/config/model_config.proto`, a subset of Triton's with the same names and",
        "numbers) each time the site is built. A field Triton has and this list lacks does not",
        "parse: the model fails to load with a message naming the field.",
        "",
        f"Datatypes (`TYPE_*`): {_enum(data_type.enum_type, ', ')}.",
        "",
    ]
    for message in _messages(ModelConfig.DESCRIPTOR):
        lines += [f"## {message.name}", ""]
        oneofs = [o for o in message.oneofs if len(o.fields) > 1]
        for oneof in oneofs:
            names = ", ".join(f"`{f.name}`" for f in oneof.fields)
            lines += [f"At most one of {names}.", ""]
        lines += ["| field | type | meaning |", "|---|---|---|"]
        for field in message.fields:
            text = DESCRIPTIONS[f"{message.name}.{field.name}"]
            lines.append(f"| `{field.name}` | {_type(field)} | {text} |")
        lines.append("")
    return "\n".join(lines)

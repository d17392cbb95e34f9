"""The ``resnet`` demo pipeline: a Triton ensemble of a Python step that decodes and normalizes
JPEG bytes, the demo ``resnet50`` ONNX model, and a Python step returning the top classes.

Each part is written as files of one model folder (``demo.models`` writes them). The Python
steps are Triton Python-backend models (``model.py`` + ``config.pbtxt``); PIL decodes images.
"""

from __future__ import annotations

PREPROCESS = "resnet_preprocess"
POSTPROCESS = "resnet_postprocess"
PIPELINE = "resnet"
CLASSIFIER = "resnet50"  # the ONNX step (the demo resnet50: seeded random weights)
TOP_K = 5
CLASSES = 1000
MAX_BATCH_SIZE = 8

PREPROCESS_CONFIG = f"""name: "{PREPROCESS}"
backend: "python"
max_batch_size: {MAX_BATCH_SIZE}
input [ {{ name: "image_bytes" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "image" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
instance_group [ {{ count: 2 }} ]
"""

PREPROCESS_MODEL = '''"""Decodes encoded images (JPEG, PNG...) into FP32 [3, 224, 224]."""

import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, UnidentifiedImageError

SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)


def decode(raw):
    with Image.open(io.BytesIO(raw)) as image:
        rgb = image.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
    chw = np.asarray(rgb, np.float32).transpose(2, 0, 1) / 255.0
    return (chw - MEAN) / STD


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "image_bytes").as_numpy()
            try:
                batch = np.stack([decode(bytes(raw)) for raw in images.reshape(-1)])
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                error = pb_utils.TritonError(
                    f"input 'image_bytes' is not an image PIL can decode: {exc}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            image = pb_utils.Tensor("image", batch.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[image]))
        return responses
'''

POSTPROCESS_CONFIG = f"""name: "{POSTPROCESS}"
backend: "python"
max_batch_size: {MAX_BATCH_SIZE}
input [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {CLASSES} ] }} ]
output [
  {{ name: "classes" data_type: TYPE_INT64 dims: [ {TOP_K} ] }},
  {{ name: "probabilities" data_type: TYPE_FP32 dims: [ {TOP_K} ] }},
  {{ name: "labels" data_type: TYPE_STRING dims: [ {TOP_K} ] }}
]
"""

POSTPROCESS_MODEL = f'''"""The top {TOP_K} classes per row of logits: index, probability, label."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

TOP_K = {TOP_K}


class TritonPythonModel:
    def initialize(self, args):
        # Triton's model_repository argument is this model's own folder.
        with open(os.path.join(args["model_repository"], "labels.txt"), encoding="utf-8") as f:
            self.labels = np.array([line.strip().encode() for line in f], dtype=object)

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
            top = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP_K]
            outputs = [
                pb_utils.Tensor("classes", top.astype(np.int64)),
                pb_utils.Tensor(
                    "probabilities", np.take_along_axis(probabilities, top, axis=1)
                ),
                pb_utils.Tensor("labels", self.labels[top]),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    lines = "\n      ".join(maps)
    return f'    {{ model_name: "{model}" model_version: -1\n      {lines} }}'


def pipeline_config(classifier: str = CLASSIFIER, classifier_input: str = "input") -> str:
    """The ensemble: image bytes -> preprocess -> classifier -> top classes."""
    steps = ",\n".join(
        [
            _step(PREPROCESS, {"image_bytes": "image_bytes"}, {"image": "image"}),
            _step(classifier, {classifier_input: "image"}, {"output": "logits"}),
            _step(
                POSTPROCESS,
                {"logits": "logits"},
                {"classes": "classes", "probabilities": "probabilities", "labels": "labels"},
            ),
        ]
    )
    return f"""name: "{PIPELINE}"
platform: "ensemble"
max_batch_size: {MAX_BATCH_SIZE}
input [ {{ name: "image_bytes" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "classes" data_type: TYPE_INT64 dims: [ {TOP_K} ] }},
  {{ name: "probabilities" data_type: TYPE_FP32 dims: [ {TOP_K} ] }},
  {{ name: "labels" data_type: TYPE_STRING dims: [ {TOP_K} ] }}
]
ensemble_scheduling {{
  step [
{steps}
  ]
}}
"""


def labels_text() -> str:
    """Placeholder names, one per class: the demo classifier's weights are random, so
    ImageNet's names would promise what it cannot do."""
    return "".join(f"class {i}\n" for i in range(CLASSES))


def preprocess_files() -> dict[str, bytes]:
    return {"config.pbtxt": PREPROCESS_CONFIG.encode(), "1/model.py": PREPROCESS_MODEL.encode()}


def postprocess_files() -> dict[str, bytes]:
    return {
        "config.pbtxt": POSTPROCESS_CONFIG.encode(),
        "labels.txt": labels_text().encode(),
        "1/model.py": POSTPROCESS_MODEL.encode(),
    }


def pipeline_files() -> dict[str, bytes]:
    """The ensemble's folder: its config (its version folder holds only the demo stamp)."""
    return {"config.pbtxt": pipeline_config().encode()}

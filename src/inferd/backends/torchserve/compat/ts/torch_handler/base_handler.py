"""``ts.torch_handler.base_handler``: the handler custom handlers subclass.

``initialize`` loads the archive's model: an eager model (``modelFile`` with one
``torch.nn.Module`` class, and ``serializedFile`` its state dict), a TorchScript file
(``.pt``), or an ONNX file (when onnxruntime is installed); ``index_to_name.json`` becomes
``self.mapping``. ``handle`` runs ``preprocess``, ``inference`` and ``postprocess`` (or
``explain_handle`` for ``/explanations``, ``describe_handle`` for a customized describe) and
records ``HandlerTime``. ``model-config.yaml``'s ``pt2: {compile: {enable: true, ...}}`` wraps
the model in ``torch.compile``.
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import time
from typing import Any

import torch

from ..handler_utils.timer import timed
from ..utils.util import list_classes_from_module, load_label_mapping

logger = logging.getLogger(__name__)


class BaseHandler(abc.ABC):  # noqa: B024 - TorchServe's handlers subclass it as an ABC
    """Loads a TorchScript or eager model and serves it through preprocess, inference and
    postprocess."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: Any = None
        self.initialized = False
        self.context: Any = None
        self.model_pt_path: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.explain = False
        self.target = 0
        self.profiler_args: dict[str, Any] = {}
        self.model_yaml_config: dict[str, Any] = {}

    def initialize(self, context: Any) -> None:
        """Load the model named by the manifest onto the worker's device."""
        self.model_yaml_config = getattr(context, "model_yaml_config", None) or {}
        properties = context.system_properties
        gpu_id = properties.get("gpu_id")
        if gpu_id is not None and torch.cuda.is_available():
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu_id}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.manifest = context.manifest
        model_dir = properties.get("model_dir")
        model = (self.manifest or {}).get("model", {})
        serialized = model.get("serializedFile")
        self.model_pt_path = os.path.join(model_dir, serialized) if serialized else None
        model_file = model.get("modelFile", "")
        if model_file:
            logger.debug("Loading eager model")
            self.model = self._load_pickled_model(model_dir, model_file, self.model_pt_path)
            self.model.to(self.device)
            self.model.eval()
        elif self.model_pt_path and self.model_pt_path.endswith(".pt"):
            self.model = self._load_torchscript_model(self.model_pt_path)
            self.model.eval()
        elif self.model_pt_path and self.model_pt_path.endswith(".onnx"):
            self.model = self._load_onnx_model(self.model_pt_path)
        else:
            raise RuntimeError("No model weights could be loaded")
        self._compile()
        logger.debug("Model file %s loaded successfully", self.model_pt_path)
        self.mapping = load_label_mapping(os.path.join(model_dir, "index_to_name.json"))
        self.initialized = True

    def _compile(self) -> None:
        pt2 = self.model_yaml_config.get("pt2")
        if not isinstance(pt2, dict):
            return
        options = pt2.get("compile")
        if not isinstance(options, dict) or options.get("enable") is not True:
            return
        kwargs = {k: v for k, v in options.items() if k != "enable"}
        try:
            self.model = torch.compile(self.model, **kwargs)
            logger.info("Compiled model with %s", kwargs)
        except Exception as exc:
            logger.warning(
                "Compiling the model with %s failed, proceeding without: %s", kwargs, exc
            )

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        return torch.jit.load(model_pt_path, map_location=self.device)

    def _load_onnx_model(self, model_path: str) -> Any:
        try:
            import onnxruntime as ort
        except ImportError:
            raise RuntimeError(f"{model_path} is an ONNX model: install onnxruntime") from None
        return ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> Any:
        """The one model class of ``model_file``, with the state dict ``model_pt_path``."""
        model_def_path = os.path.join(model_dir, model_file)
        if not os.path.isfile(model_def_path):
            raise RuntimeError("Missing the model.py file")
        module = importlib.import_module(model_file.split(".")[0])
        classes = list_classes_from_module(module)
        if len(classes) != 1:
            raise ValueError(f"Expected only one class as model definition. {classes}")
        model = classes[0]()
        if model_pt_path:
            state_dict = torch.load(model_pt_path, map_location=self.device)
            model.load_state_dict(state_dict)
        return model

    @timed
    def preprocess(self, data: Any) -> Any:
        """The request data as a tensor on the model's device."""
        return torch.as_tensor(data, device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            return self.model(data.to(self.device), *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> Any:
        return data.tolist()

    def handle(self, data: list[Any], context: Any) -> Any:
        """preprocess, inference, postprocess (or explain / describe); one answer per request."""
        start_time = time.time()
        self.context = context
        if self._is_describe():
            output = [self.describe_handle()]
        else:
            data_preprocess = self.preprocess(data)
            if not self._is_explain():
                output = self.postprocess(self.inference(data_preprocess))
            else:
                output = self.explain_handle(data_preprocess, data)
        stop_time = time.time()
        context.metrics.add_time(
            "HandlerTime", round((stop_time - start_time) * 1000, 2), None, "ms"
        )
        return output

    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> Any:
        """Explanations (Captum's): ``get_insights(data, inputs, target)`` of a subclass."""
        inputs = None
        target = 0
        row = raw_data[0]
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            target = row.get("target") or 0
        get_insights = getattr(self, "get_insights", None)
        if get_insights is None:
            raise NotImplementedError(f"{type(self).__name__} has no get_insights()")
        return get_insights(data_preprocess, inputs, target)

    def _is_explain(self) -> bool:
        if self.context and self.context.get_request_header(0, "explain") == "True":
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return bool(self.context and self.context.get_request_header(0, "describe") == "True")

    def describe_handle(self) -> Any:
        """A customized describe's metadata (None: none)."""
        return None

    def get_device(self) -> Any:
        return self.device

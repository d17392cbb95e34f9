"""``pb_utils.ModelConfig``: the config a Triton model's ``auto_complete_config`` completes."""

from __future__ import annotations

import json
from typing import Any


class TritonModelException(Exception):
    """Raised by a model to fail every request of the batch (``execute``) or its loading."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ModelConfig:
    """The config given to ``auto_complete_config``: read it with ``as_dict``, complete it
    with ``set_max_batch_size``, ``add_input``, ``add_output``, ``set_dynamic_batching``."""

    _TENSOR_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config: dict[str, Any] = dict(config)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size") or 0)
        if configured and max_batch_size == 0:
            raise TritonModelException(
                f"the config sets max_batch_size {configured} but the model does not batch "
                "(auto_complete_config sets 0)"
            )
        if configured > max_batch_size:
            raise TritonModelException(
                f"the config's max_batch_size {configured} exceeds the model's {max_batch_size}"
            )
        if not configured:
            self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        missing = [k for k in self._TENSOR_KEYS if k not in tensor]
        if missing:
            raise TritonModelException(f"{kind} {tensor!r} lacks {', '.join(missing)}")
        for existing in self._config[kind]:
            if existing.get("name") != tensor["name"]:
                continue
            for key in ("data_type", "dims"):
                have, wanted = existing.get(key), tensor[key]
                if have in (None, [], "TYPE_INVALID"):
                    existing[key] = wanted
                    continue
                same = list(have) == list(wanted) if key == "dims" else have == wanted
                if not same:
                    raise TritonModelException(
                        f"{kind} '{tensor['name']}': the config has {key} {have}, "
                        f"the model {wanted}"
                    )
            return
        self._config[kind].append(dict(tensor))

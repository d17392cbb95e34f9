"""The gRPC ``TraceSetting`` and ``LogSettings`` RPCs of Triton's service: the same settings as
``/v2/trace/setting`` and ``/v2/logging``, in Triton's messages (an empty request reads)."""

from __future__ import annotations

from typing import Any

from inferd.core.errors import InvalidInput
from inferd.observability.log_settings import LogSettings
from inferd.observability.trace_settings import TraceSettings
from inferd.protocols import grpc_service_pb2 as pb


class SettingsGrpc:
    def __init__(self, trace: TraceSettings, logs: LogSettings) -> None:
        self.trace = trace
        self.logs = logs

    async def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        # An empty value list clears the key (Triton: back to the global or startup value).
        changes = {key: list(v.value) or None for key, v in request.settings.items()}
        model = request.model_name
        if changes:
            settings = await self.trace.update_everywhere(changes, model)
        else:
            settings = self.trace.get(model)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        changes: dict[str, Any] = {}
        for key, v in request.settings.items():
            which = v.WhichOneof("parameter_choice")
            if which is None:
                raise InvalidInput(f"log setting '{key}' has no value")
            changes[key] = getattr(v, which)
        settings = await self.logs.update_everywhere(changes) if changes else self.logs.get()
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = value
        return response

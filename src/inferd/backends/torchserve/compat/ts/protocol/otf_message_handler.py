"""``ts.protocol.otf_message_handler``: the older home of
``send_intermediate_predict_response`` (``ts.handler_utils.utils`` has it now)."""

from __future__ import annotations

from ..handler_utils.utils import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]

"""PyTriton's API on inferd: a PyTriton script runs here when its imports say ``inferd.pytriton``
instead of ``pytriton``. ``triton`` (Triton, TritonConfig), ``model_config``, ``decorators`` and
``client`` (ModelClient, AsyncioModelClient, over tritonclient)."""

from __future__ import annotations

from inferd.pytriton import decorators, model_config, triton

__all__ = ["decorators", "model_config", "triton"]

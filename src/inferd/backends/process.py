"""What a backend sees of a model process: the recipe that builds its executor there, and
the process's side of its connection while the executor runs (``current``).

A model process (``inferd.scheduling.model_process``) is a separate Python that runs one
execution instance of a model whose code must not share the server's interpreter (Python
models, TorchServe handlers, any model with ``process_instances``). The server sends it a
``ProcessRecipe``; the process builds its executor from it and, while it runs, offers itself
through ``current`` so the model's code can call other models and send responses and metrics.
The model process registers itself (``attach``): this module imports nothing above backends.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from inferd.backends.work import Executor, Result
    from inferd.core.types import Parameters, Tensors


@dataclass(frozen=True, slots=True)
class ProcessRecipe:
    """What a model process calls to build its executor, and with which Python."""

    factory: str  # "package.module:function"
    args: tuple[Any, ...]  # plain, picklable values
    interpreter: str = ""  # the Python that runs the model process; "" is the server's own

    def build(self) -> Executor:
        module, _, name = self.factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        executor: Executor = factory(*self.args)
        return executor


class ProcessSide(Protocol):
    """The running model process's side of its connection to the server, as a model's code
    uses it (the job running now, calls to other models)."""

    label: str
    handovers: int  # messages from the server that brought jobs (one may bring several)

    def send_response(self, index: int, result: Result, final: bool) -> None:
        """One response of request ``index`` of the job running now (decoupled models)."""
        ...

    def send_metrics(self, model: str, records: list[Any]) -> None:
        """Metrics the model's own code recorded, for the server's ``/metrics``."""
        ...

    def is_cancelled(self) -> bool:
        """Whether the server cancelled the job running now (its caller left)."""
        ...

    def call(
        self,
        model: str,
        version: str,
        inputs: Tensors,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> Result:
        """Infer with another model of the server, through its scheduler; waits."""
        ...

    async def call_async(
        self,
        model: str,
        version: str,
        inputs: Tensors,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> Result:
        """``call`` from a coroutine: other coroutines run (and call) while it waits."""
        ...


_SIDE: ProcessSide | None = None


def attach(side: ProcessSide) -> None:
    """Called once by the model process, before it builds its executor."""
    global _SIDE
    _SIDE = side


def current() -> ProcessSide | None:
    """The model process this code runs in (None in the server itself)."""
    return _SIDE

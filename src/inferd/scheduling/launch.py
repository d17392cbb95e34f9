"""One model process as the server starts, reaps and stops it (``scheduling.processes``
keeps the instances; this is the life of one process)."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys

from inferd.backends.process import ProcessRecipe
from inferd.backends.spawn import ProcessHandle, describe_exit, start_python
from inferd.core.errors import ModelLoadError, Unavailable
from inferd.scheduling.channel import Channel, socket_pair
from inferd.scheduling.wire import Encoder, encode_result
from inferd.scheduling.zygote import fork_model_process

log = logging.getLogger("inferd.scheduling")

CLOSE_TIMEOUT_S = 30.0  # for finalize, after which the worker is killed
REAP_TIMEOUT_S = 5.0


def start_model_process(interpreter: str, worker_fd: int) -> ProcessHandle:
    """A model process serving the connection ``worker_fd``: forked by the zygote for the
    server's own Python (fast), else started with the model's interpreter."""
    if not interpreter or interpreter == sys.executable:
        try:
            return fork_model_process(worker_fd)
        except OSError as exc:
            log.warning("the worker zygote failed (%s); starting the worker directly", exc)
    env = {"INFERD_WORKER_FD": str(worker_fd)}
    return start_python(interpreter, "inferd.scheduling.model_process", (worker_fd,), env)


def launch(label: str, index: int, recipe: ProcessRecipe) -> tuple[ProcessHandle, Channel]:
    """Start a worker and wait until its executor is built (ModelLoadError if it fails)."""
    server_end, worker_end = socket_pair()
    try:
        proc = start_model_process(recipe.interpreter, worker_end.fileno())
    except OSError as exc:
        server_end.close()
        raise ModelLoadError(f"cannot start a model process for model '{label}': {exc}") from None
    finally:
        worker_end.close()
    channel = Channel(server_end, trusting=False)
    try:
        channel.send("start", (recipe.factory, recipe.args, label, index))
        while True:
            message = channel.recv()
            assert message is not None
            kind, payload = message
            if kind == "ready":
                log.info("model '%s': instance %d is model process %d", label, index, proc.pid)
                return proc, channel
            if kind == "failed":
                raise ModelLoadError(f"model '{label}' instance {index} failed to start: {payload}")
    except EOFError:
        how = describe_exit(reap(proc))
        channel.close()
        raise ModelLoadError(
            f"the model process of model '{label}' (instance {index}) {how} while starting"
        ) from None
    except BaseException:
        reap(proc)
        channel.close()
        raise


def reap(proc: ProcessHandle, timeout_s: float = REAP_TIMEOUT_S) -> int | None:
    """Wait for a worker to end (killing it after ``timeout_s``); its return code."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def stop_model_process(label: str, proc: ProcessHandle, channel: Channel) -> None:
    """Ask a worker to close its executor, wait (killing it after CLOSE_TIMEOUT_S)."""
    try:
        channel.send("close")
        channel.sock.settimeout(CLOSE_TIMEOUT_S)
        while True:
            message = channel.recv()
            if message is None:
                continue
            kind, payload = message
            if kind == "closed":
                if payload:
                    log.error("model '%s': closing worker %d failed: %s", label, proc.pid, payload)
                break
            if kind == "call":
                refuse_call(channel, payload[0], "the model is unloading")
    except (EOFError, OSError):
        pass
    reap(proc, CLOSE_TIMEOUT_S)
    channel.close()


def refuse_call(channel: Channel, call_id: int, why: str) -> None:
    encoded = encode_result(Encoder(channel), Unavailable(f"calls to other models: {why}"))
    with contextlib.suppress(OSError):
        channel.send("called", (call_id, encoded))

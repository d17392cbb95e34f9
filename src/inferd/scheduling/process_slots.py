"""The server's view of one model process of ``ProcessInstances``: its state, and the jobs it
holds or will be sent (``scheduling.processes`` drives them)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferd.backends.process import ProcessRecipe
from inferd.backends.spawn import ProcessHandle, describe_exit
from inferd.backends.work import CANCELLED, Executed, InstanceFailed, Work
from inferd.scheduling.channel import Channel
from inferd.scheduling.launch import launch, reap, refuse_call, stop_model_process
from inferd.scheduling.wire import decode_error, decode_executed, encode_works

RESTART_BACKOFF_FIRST_S = 0.5
STARTING, UP, DOWN, BROKEN, CLOSED = "starting", "up", "down", "broken", "closed"


@dataclass(eq=False, slots=True)
class Job:
    id: int
    batch: list[Work]
    future: asyncio.Future[Executed]
    works: list[Work] = field(default_factory=list)  # what was sent: the batch less cancelled


@dataclass(eq=False, slots=True)
class Slot:
    """One instance: its process, its connection and its jobs, as the server sees them."""

    index: int
    recipe: ProcessRecipe
    proc: ProcessHandle | None = None
    channel: Channel | None = None
    state: str = STARTING
    queue: deque[Job] = field(default_factory=deque)  # not sent yet
    sent: dict[int, Job] = field(default_factory=dict)  # sent, not answered
    reason: str = ""  # why it is broken
    backoff_s: float = RESTART_BACKOFF_FIRST_S
    flush_armed: bool = False
    copying: Job | None = None  # being copied into shared memory on a thread, next to send

    @property
    def load(self) -> int:
        return len(self.queue) + len(self.sent) + (self.copying is not None)


def run_now(
    name: str, slot: Slot, job_id: int, batch: list[Work], restarted: Callable[[], None]
) -> Executed:
    """Execute ``batch`` on ``slot``'s running worker now, from the calling thread, before the
    instances serve (warmup). A worker that dies is started again (``restarted`` counts it)
    and InstanceFailed says how it ended."""
    channel, proc = slot.channel, slot.proc
    assert channel is not None and proc is not None
    try:
        channel.send("job", (job_id, encode_works(channel, batch)))
        while True:
            message = channel.recv()
            assert message is not None
            kind, payload = message
            if kind == "call":
                refuse_call(channel, payload[0], "not during warmup")
            elif kind == "done" and payload[0] == job_id:
                break
    except (EOFError, OSError):
        how = describe_exit(reap(proc))
        channel.close()
        restarted()
        slot.proc, slot.channel = launch(name, slot.index, slot.recipe)
        raise InstanceFailed(
            f"model '{name}': the model process of instance {slot.index} {how}"
        ) from None
    _, status, data = payload
    if status == "ok":
        return decode_executed(channel, data)
    if status == "cancelled":
        return Executed([CANCELLED] * len(batch))
    raise decode_error(*data)


def stop_running(name: str, slots: Sequence[Slot]) -> None:
    """Stop every running model process of ``slots`` at once (each one's ``finalize`` runs)."""
    running = [slot for slot in slots if slot.state is UP]
    for slot in running:
        slot.state = CLOSED
    threads = [
        threading.Thread(target=stop_model_process, args=(name, slot.proc, slot.channel))
        for slot in running
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

"""BodyDeadlines: a read past its deadline answers RequestTimeout, others are untouched, and
the one sweep stops when no read is in progress."""

from __future__ import annotations

import asyncio

import pytest

from inferd.core.errors import RequestTimeout
from inferd.protocols.transport.deadlines import BodyDeadlines


def test_reads_that_finish_stalls_that_time_out_and_other_cancellations() -> None:
    async def run() -> None:
        deadlines = BodyDeadlines(0.08)
        loop = asyncio.get_running_loop()

        async def arrives(after_s: float, body: bytes) -> bytes:
            future: asyncio.Future[bytes] = loop.create_future()
            loop.call_later(after_s, future.set_result, body)
            return await deadlines.read(future)

        async def stalls() -> bytes:
            return await deadlines.read(loop.create_future())

        fast = asyncio.ensure_future(arrives(0.01, b"fast"))
        stalled = asyncio.ensure_future(stalls())
        hung_up = asyncio.ensure_future(stalls())
        await asyncio.sleep(0.02)
        hung_up.cancel()  # the client went away: a cancellation, not a timeout
        assert await fast == b"fast"
        with pytest.raises(RequestTimeout, match="--http-body-timeout-s"):
            await stalled
        with pytest.raises(asyncio.CancelledError):
            await hung_up
        assert stalled.cancelling() == 0  # the sweep's cancel was taken back
        assert await arrives(0.0, b"after") == b"after"  # the sweep goes on serving reads
        await asyncio.sleep(0.1)
        assert deadlines._due == {} and deadlines._expired == set()
        assert deadlines._sweeping is None  # idle: no timer left armed

    asyncio.run(run())

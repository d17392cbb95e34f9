"""The rate limiter: resources counted and validated, grants in Triton's order, and model
instances (threads) behind it with a fake workload that records what ran at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from inferd.backends import echo
from inferd.backends.work import Executed, Work
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError
from inferd.plane.model import ModelVersion
from inferd.repository.loader import LoadOptions, load_version, plan
from inferd.scheduling.instances import ThreadInstances
from inferd.scheduling.limited import LimitedInstances
from inferd.scheduling.rate_limiter import (
    GLOBAL,
    Ask,
    ExplicitResource,
    RateLimiter,
    Slot,
    asks_of,
    limiter_from,
    parse_resource,
)
from tests.echo_support import request


def _ask(priority: int = 1, **resources: int) -> Ask:
    return Ask(tuple(sorted(((0, name), n) for name, n in resources.items())), priority)


def test_resource_flags_parse_as_triton_writes_them() -> None:
    assert parse_resource("R1:10") == ExplicitResource("R1", 10, None)
    assert parse_resource("R2:5:1") == ExplicitResource("R2", 5, 1)
    for bad in ("R1", "R1:x", ":3", "R1:1:2:3", "R1:-1"):
        with pytest.raises(ConfigError, match="--rate-limit-resource"):
            parse_resource(bad)
    assert limiter_from("off", ["R1:4"]) is None
    limiter = limiter_from("execution_count", ["R1:4"])
    assert limiter is not None and limiter.explicit == [ExplicitResource("R1", 4)]
    with pytest.raises(ConfigError, match="--rate-limit takes off or execution_count"):
        limiter_from("sometimes", [])


def test_asks_come_from_each_instance_group_and_device() -> None:
    config = parse_config_text(
        'instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R1" '
        'count: 4 }, { name: "R2" global: true count: 2 } ] priority: 2 } }, { count: 1 } ]'
    )
    groups = list(config.instance_group)
    asks = asks_of([(groups[0], [0, 0]), (groups[1], [0])])
    assert asks == [
        Ask((((GLOBAL, "R2"), 2), ((0, "R1"), 4)), 2),
        Ask((((GLOBAL, "R2"), 2), ((0, "R1"), 4)), 2),
        Ask((), 1),
    ]
    plain = parse_config_text("instance_group [ { count: 2 } ]").instance_group[0]
    assert asks_of([(plain, [0, 0])]) is None  # no rate_limiter: not limited at all


def test_a_resource_counts_what_the_largest_ask_needs_unless_given() -> None:
    limiter = RateLimiter()
    limiter.register("a/1", [_ask(R1=4, R2=1)], lambda _: None)
    limiter.register("b/1", [_ask(R1=2, R3=7)], lambda _: None)
    assert limiter.limits == {(0, "R1"): 4, (0, "R2"): 1, (0, "R3"): 7}
    given = RateLimiter([ExplicitResource("R1", 10), ExplicitResource("R3", 9, 0)])
    given.register("a/1", [_ask(R1=4, R3=2)], lambda _: None)
    assert given.limits == {(0, "R1"): 10, (0, "R3"): 9}


def test_an_ask_beyond_what_exists_fails_naming_the_resource() -> None:
    limiter = RateLimiter([ExplicitResource("R1", 1)])
    with pytest.raises(ConfigError, match=r'resource "R1" \(device 0\) is limited to 1.*is 4'):
        limiter.check("a/1", [_ask(R1=4)])
    with pytest.raises(ConfigError, match='"R1"'):
        limiter.register("a/1", [_ask(R1=4)], lambda _: None)
    assert limiter.limits == {}  # nothing registered
    glob = RateLimiter([ExplicitResource("G", 3, 1)])  # a global resource ignores the device
    glob.register("g/1", [Ask((((GLOBAL, "G"), 3),))], lambda _: None)
    assert glob.limits == {(GLOBAL, "G"): 3}
    mixed = RateLimiter()
    mixed.register("g/1", [Ask((((GLOBAL, "G"), 1),))], lambda _: None)
    with pytest.raises(ConfigError, match='"G" is both global and per device'):
        mixed.register("d/1", [_ask(G=1)], lambda _: None)


def test_unloading_a_model_lowers_the_default_counts() -> None:
    limiter = RateLimiter()
    a = limiter.register("a/1", [_ask(R1=2)], lambda _: None)
    b = limiter.register("b/1", [_ask(R1=5)], lambda _: None)
    assert limiter.limits == {(0, "R1"): 5}
    limiter.unregister(b)
    assert limiter.limits == {(0, "R1"): 2}
    limiter.unregister(a)
    assert limiter.limits == {}


def test_grants_follow_executions_times_priority() -> None:
    """Two instances always waiting for one resource: priority 2 gets half the turns."""
    limiter = RateLimiter()
    turns: list[str] = []
    running: list[Slot] = []

    def grant(name: str) -> object:
        def granted(slot: Slot) -> None:
            turns.append(name)
            running.append(slot)

        return granted

    (one,) = limiter.register("one/1", [_ask(1, R1=4)], grant("one"))  # type: ignore[arg-type]
    (two,) = limiter.register("two/1", [_ask(2, R1=4)], grant("two"))  # type: ignore[arg-type]
    limiter.stage(one)
    limiter.stage(two)
    for _ in range(29):  # each execution ends, and its instance has work again at once
        slot = running.pop()
        limiter.release(slot, then=[slot])
    assert len(turns) == 30
    assert turns.count("one") == 20 and turns.count("two") == 10
    assert limiter.allocated == {(0, "R1"): 4}


def test_a_head_that_does_not_fit_is_not_overtaken() -> None:
    limiter = RateLimiter([ExplicitResource("R1", 4)])
    order: list[str] = []
    small = limiter.register("small/1", [_ask(R1=2), _ask(R1=2)], lambda s: order.append("s"))
    (big,) = limiter.register("big/1", [_ask(R1=4)], lambda s: order.append("big"))
    limiter.stage(small[0])  # holds 2 of 4
    limiter.stage(big)  # needs 4: waits
    limiter.stage(small[1])  # would fit, but big is ahead
    assert order == ["s"]
    limiter.release(small[0])
    assert order == ["s", "big"]
    limiter.release(big)
    assert order == ["s", "big", "s"]


class _Recorder:
    """A fake workload: each execution sleeps a little and records how many ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.turns: list[str] = []


class _Executor:
    inline = False

    def __init__(self, name: str, recorder: _Recorder) -> None:
        self.name = name
        self.recorder = recorder

    def execute(self, batch: Sequence[Work]) -> Executed:
        rec = self.recorder
        with rec.lock:
            rec.running += 1
            rec.most = max(rec.most, rec.running)
            rec.turns.append(self.name)
        time.sleep(0.005)
        with rec.lock:
            rec.running -= 1
        return Executed([{"y": w.inputs["x"]} for w in batch])

    def close(self) -> None:
        pass


def _work() -> Work:
    return Work({"x": np.ones(1, np.float32)}, 0, ("y",))


def _threads(name: str, count: int, recorder: _Recorder) -> ThreadInstances:
    return ThreadInstances(name, [_Executor(name, recorder) for _ in range(count)])


def test_instances_sharing_a_resource_never_execute_at_once() -> None:
    recorder = _Recorder()

    async def run() -> None:
        limiter = RateLimiter()
        a = LimitedInstances(limiter, _threads("a/1", 2, recorder), [_ask(R1=4)] * 2)
        b = LimitedInstances(limiter, _threads("b/1", 2, recorder), [_ask(R1=4)] * 2)
        futures = [pool.submit([_work()]) for _ in range(10) for pool in (a, b)]
        futures += [a.submit([_work()], 1), b.submit([_work()], 0)]
        done = await asyncio.gather(*futures)
        assert all(e.results[0]["y"].tolist() == [1.0] for e in done)  # type: ignore[index]
        assert limiter.allocated == {(0, "R1"): 0}
        assert limiter.waits["a/1"].count == 11 and limiter.waits["b/1"].count == 11
        await a.close()
        await b.close()
        assert limiter.limits == {} and limiter.waits == {}

    asyncio.run(run())
    assert recorder.most == 1
    assert sorted(recorder.turns) == ["a/1"] * 11 + ["b/1"] * 11


def test_instances_with_room_for_both_execute_at_once() -> None:
    recorder = _Recorder()

    async def run() -> None:
        limiter = RateLimiter([ExplicitResource("R1", 8)])
        a = LimitedInstances(limiter, _threads("a/1", 1, recorder), [_ask(R1=4)])
        b = LimitedInstances(limiter, _threads("b/1", 1, recorder), [_ask(R1=4)])
        for _ in range(20):  # until both ran at once (each execution takes 5 ms)
            await asyncio.gather(a.submit([_work()]), b.submit([_work()]))
            if recorder.most == 2:
                break
        await a.close()
        await b.close()

    asyncio.run(run())
    assert recorder.most == 2


def test_priorities_weight_the_turns_of_busy_instances() -> None:
    recorder = _Recorder()

    async def run() -> None:
        limiter = RateLimiter()
        one = LimitedInstances(limiter, _threads("one/1", 1, recorder), [_ask(1, R1=1)])
        two = LimitedInstances(limiter, _threads("two/1", 1, recorder), [_ask(2, R1=1)])
        futures = [pool.submit([_work()]) for _ in range(40) for pool in (one, two)]
        await asyncio.gather(*futures)
        await one.close()
        await two.close()

    asyncio.run(run())
    first = recorder.turns[:45]  # both always had work waiting here
    assert first.count("one/1") == 30 and first.count("two/1") == 15


def test_work_whose_caller_left_while_waiting_never_runs() -> None:
    recorder = _Recorder()

    async def run() -> None:
        limiter = RateLimiter()
        a = LimitedInstances(limiter, _threads("a/1", 1, recorder), [_ask(R1=1)])
        first = a.submit([_work()])
        gone = a.submit([_work()])
        gone.cancel()
        await first
        await a.close()
        assert limiter.allocated == {(0, "R1"): 0}

    asyncio.run(run())
    assert recorder.turns == ["a/1"]


def _load(root: Path, name: str, config: str, limiter: RateLimiter) -> ModelVersion:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    echo.reset(name)
    return load_version(name, 1, plan(name, folder), LoadOptions(rate_limiter=limiter))


ECHO = (
    'backend: "echo"\nmax_batch_size: 8\n'
    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]\n'
    'parameters { key: "request_level" value: { string_value: "true" } }\n'
    'instance_group [{ count: 2 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 1 }] '
    "} }]\n"
)


def test_batchers_and_sequences_run_through_the_limiter(tmp_path: Path) -> None:
    limiter = RateLimiter()
    batched = _load(tmp_path, "batched", ECHO + "dynamic_batching { }\n", limiter)
    pinned = _load(tmp_path, "pinned", ECHO + "sequence_batching { direct { } }\n", limiter)
    assert limiter.limits == {(0, "R"): 1}

    async def run() -> None:
        answers = await asyncio.gather(
            *(batched.infer(request(batched, float(i), id=f"b{i}")) for i in range(6)),
            *(
                pinned.infer(
                    request(pinned, float(c), id=f"{c}-1", sequence_id=c, sequence_start=True)
                )
                for c in (1, 2)
            ),
        )
        got = [a.outputs["OUTPUT0"][0, 0] for a in answers]
        assert got == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 2.0]
        await batched.scheduler.close()
        await pinned.scheduler.close()

    asyncio.run(run())
    ran = sorted(r for e in echo.LOG["batched"] for r in e.request_ids)
    assert ran == [f"b{i}" for i in range(6)]
    assert {e.instance for e in echo.LOG["pinned"]} == {0, 1}  # a sequence per instance
    assert limiter.limits == {} and limiter.allocated == {(0, "R"): 0}

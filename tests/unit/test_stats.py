"""ModelStats: logged request-path figures add up to what direct updates give."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from bisect import bisect_left

from inferd.core.stats import _BOUNDS_NS, FLUSH_AT, ModelStats


def _direct(stats: ModelStats, rows: int, queue_ns: int, parts: tuple[int, int, int]) -> None:
    stats.queue.add(queue_ns)
    stats.record_execution(rows or 1, 1, *parts)


def test_logged_figures_equal_direct_updates() -> None:
    logged, direct = ModelStats(), ModelStats()
    for i in range(FLUSH_AT + 37):  # past one automatic flush
        rows, queue_ns, parts = i % 3, 1_000 * i, (10 * i, 200_000 + i, 30)
        logged.log_execution(rows, queue_ns, *parts, time.perf_counter_ns())
        logged.log_success(50_000 * (i % 7))
        _direct(direct, rows, queue_ns, parts)
        direct.success.add(50_000 * (i % 7))
    assert logged.snapshot("m", "1").inference_stats == direct.snapshot("m", "1").inference_stats
    assert logged.snapshot("m", "1").batch_stats == direct.snapshot("m", "1").batch_stats
    assert logged.execution_count == direct.execution_count == FLUSH_AT + 37
    assert logged.inference_count == direct.inference_count
    for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(logged, name).buckets == getattr(direct, name).buckets, name
    assert abs(logged.last_inference_ms - time.time_ns() // 1_000_000) < 5_000


def test_reads_from_another_thread_lose_nothing() -> None:
    stats = ModelStats()
    done = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not done.is_set():
            seen.append(stats.success.count)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(20_000):
        stats.log_success(1_000)
        stats.log_execution(1, 10, 1, 2, 3, time.perf_counter_ns())
    done.set()
    thread.join()
    assert stats.success.count == 20_000 and stats.success.ns == 20_000_000
    assert stats.queue.count == 20_000 and stats.compute_infer.ns == 40_000
    assert seen == sorted(seen)  # counts only grow


def test_adding_up_the_log_imports_nothing_on_the_request_path() -> None:
    """The first flush runs on the event loop: it must not import a module (np.unique's
    first call imported numpy.ma, a 16 ms stall)."""
    script = (
        "import sys, time\n"
        "from inferd.core.stats import FLUSH_AT, ModelStats\n"
        "stats = ModelStats()\n"
        "before = set(sys.modules)\n"
        "for i in range(FLUSH_AT):\n"
        "    stats.log_execution(1 + i % 4, 10, 1, 2, 3, time.perf_counter_ns())\n"
        "print(sorted(set(sys.modules) - before))\n"
        "print(sorted(b.batch_size for b in stats.snapshot('m', '1').batch_stats))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "[1, 2, 3, 4]"]


def test_a_batchs_queue_times_are_logged_at_once_and_added_up_on_read() -> None:
    stats = ModelStats()
    stats.log_queue([1_000, 2_000_000, 3_000])
    queue = stats.queue  # reading adds up the log
    assert (queue.count, queue.ns) == (3, 2_004_000)
    assert sum(queue.buckets) == 3
    assert queue.buckets[bisect_left(_BOUNDS_NS, 2_000_000)] == 1
    stats.log_queue([5_000])
    assert stats.queue.count == 4

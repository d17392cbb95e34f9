"""The serving process tree's resident memory, read from /proc: a child's memory counts."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from inferd.repository.memory import LoadCosts, tree_rss_bytes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

HOLD = """
import sys, time
block = bytearray(64 << 20)
block[::4096] = b"x" * len(block[::4096])  # touched: resident
print("ready", flush=True)
time.sleep(30)
"""


def test_a_child_process_counts_in_the_tree() -> None:
    alone = tree_rss_bytes()
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with_child = tree_rss_bytes()
        assert tree_rss_bytes(child.pid) >= 64 << 20
        assert with_child - alone >= 64 << 20
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 10
    while tree_rss_bytes() - alone >= 64 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tree_rss_bytes() - alone < 64 << 20
    assert tree_rss_bytes(child.pid) == 0  # gone


FREED = """
from inferd.repository.memory import return_freed, tree_rss_bytes
assert return_freed()  # glibc
before = tree_rss_bytes()
weights = [bytearray(1 << 20) for _ in range(32)]  # 1 MiB tensors, as a model's weights
for w in weights:
    w[::4096] = b"x" * len(w[::4096])
grown = tree_rss_bytes() - before
del weights
print(grown >> 20, (tree_rss_bytes() - before) >> 20)
"""


def test_freed_weights_go_back_to_the_system() -> None:
    """In a fresh process (a long-lived one may reuse memory freed before it fixed the
    thresholds): 32 blocks of 1 MiB are resident while held, and gone once freed."""
    done = subprocess.run(
        [sys.executable, "-c", FREED], capture_output=True, text=True, timeout=60, check=True
    )
    grown_mib, left_mib = (int(n) for n in done.stdout.split())
    assert grown_mib >= 32
    assert left_mib < 4


MIB = 1 << 20


def test_a_model_is_counted_its_files_and_what_loaded_models_take_beyond_theirs() -> None:
    costs = LoadCosts()
    assert costs.least(2 * MIB) == 2 * MIB  # nothing observed yet: its files
    costs.baseline = 100 * MIB
    costs.runtime_in("onnxruntime", 40 * MIB, budget_bytes=80 * MIB)
    assert costs.runtime_bytes() == 40 * MIB
    # Two models of 2 MiB of files, the tree 46 MiB above where it was before the runtime.
    costs.observe(146 * MIB, [2 * MIB, 2 * MIB])
    assert costs.beyond_files() == MIB
    assert costs.least(2 * MIB) == 3 * MIB
    # A declared model's bytes are its own; the median of the observations is what counts.
    costs.observe(156 * MIB, [2 * MIB, 2 * MIB], declared=10 * MIB)
    costs.observe(400 * MIB, [2 * MIB, 2 * MIB])  # a passing spike
    assert costs.beyond_files() == MIB


def test_a_tree_smaller_than_the_files_counts_nothing_beyond_them() -> None:
    costs = LoadCosts()
    costs.observe(50 * MIB, [MIB])  # no baseline: not observed
    costs.baseline = 100 * MIB
    costs.observe(101 * MIB, [2 * MIB])
    assert costs.beyond_files() == 0 and costs.least(2 * MIB) == 2 * MIB


BURST = """
import gc, time
from inferd.repository.memory import AfterBursts, _rss
after_bursts = AfterBursts(grown_bytes=16 << 20, idle_s=0.05, idle_share=0.5)
time.sleep(0.1)
print(after_bursts())  # not grown
gc.disable()
cycle = [bytearray(b"x" * (48 << 20))]
cycle.append(cycle)
grown = _rss("self")
del cycle
# Idle long enough that filling 48 MiB above is a small share of it; a window a loaded host
# made look busy is followed by the next one.
time.sleep(0.5)
collected, windows = after_bursts(), 1
while not collected and windows < 60:
    time.sleep(0.5)
    collected, windows = after_bursts(), windows + 1
print(collected, (grown - _rss("self")) >> 20)
"""


def test_what_a_burst_left_in_cycles_goes_back_once_it_is_over() -> None:
    """Garbage in reference cycles (a refused request's traceback and frames) holding 48 MiB:
    once the process has grown and sits idle, ``AfterBursts`` collects it and the resident
    set comes back; it does nothing while the process has not grown. In a fresh process: a
    test process's other threads (earlier tests', client libraries') would make it look busy."""
    done = subprocess.run(
        [sys.executable, "-c", BURST], capture_output=True, text=True, timeout=60, check=True
    )
    before, after = done.stdout.splitlines()
    assert before == "False"  # not grown: nothing done
    collected, freed_mib = after.split()
    assert collected == "True"
    assert int(freed_mib) >= 32

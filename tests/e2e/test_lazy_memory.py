"""What lazy serving's budget counts is what the serving process tree takes, small models
included: ONNX Runtime itself (brought in with the first model) and each model's session beside
its weights, so that the tree's growth stays within the budget an operator sets from a pod's
memory limit."""

from __future__ import annotations

from pathlib import Path

from inferd.repository.memory import tree_rss_bytes
from tests.e2e.many_models_support import metric, residency, table_row, write_table
from tests.support import ServerProcess

BUDGET_MIB = 56
MODELS = [f"s{i:02d}" for i in range(24)]  # 1 MiB of weights each: 24 MiB in all


def test_small_models_are_counted_what_they_cost(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for i, name in enumerate(MODELS):
        write_table(root, name, 1, float(i))
    files = {name: (root / name / "1" / "model.onnx").stat().st_size for name in MODELS}
    server = ServerProcess(root, extra_args=["--model-memory-budget", f"{BUDGET_MIB}Mi"])
    server.start()
    try:
        assert server.proc is not None
        idle = tree_rss_bytes(server.proc.pid)
        grown = []
        for _ in range(2):  # the second pass loads again what the first evicted
            for i, name in enumerate(MODELS):
                answer = table_row(server.http_url, name)
                assert answer.status_code == 200, answer.text
                assert answer.json()["outputs"][0]["data"][0] == float(i)
                grown.append(tree_rss_bytes(server.proc.pid) - idle)
        runtime = metric(server, "inferd_residency_runtime_bytes")
        assert runtime >= 4 << 20  # ONNX Runtime, in memory since the first model
        views = residency(server)
        loaded = {name: v["memory_bytes"] for name, v in views.items() if v["state"] == "loaded"}
        assert loaded and all(loaded[name] >= files[name] for name in loaded)
        assert any(loaded[name] > files[name] for name in loaded)  # a session beside weights
        counted = sum(loaded.values())
        assert metric(server, "inferd_residency_bytes") == counted
        assert counted + runtime <= BUDGET_MIB << 20
        assert len(loaded) < len(MODELS)  # all 24 would fit if only their files counted
        assert max(grown) <= 1.2 * (BUDGET_MIB << 20), [g >> 20 for g in grown]
    finally:
        server.stop()

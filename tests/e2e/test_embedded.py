"""inferd.Server in this process: every call, blocking and awaited, on ONNX models, a Python
model, an ensemble and a decoupled model; errors as inferd's exceptions; no copies of the
tensors on the way."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import inferd
from inferd.core.errors import ConfigError, InvalidInput, NotFound, Unavailable
from tests.e2e.embedded_support import write_repository

X = np.array([[1.0], [2.0], [5.0]], np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("embedded") / "models")


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[inferd.Server]:
    everything = ["half_plus_two", "digits", "scale", "chain", "countdown", "mirror"]
    with inferd.Server(model_repository=repo, load_model=everything) as server:
        yield server


def _digits() -> np.ndarray:
    return np.random.default_rng(0).uniform(0, 16, (8, 64)).astype(np.float32)


def test_onnx_models_answer_numpy_arrays(server: inferd.Server) -> None:
    out = server.infer("half_plus_two", {"x": X})
    assert isinstance(out, inferd.Outputs) and list(out) == ["y"]
    assert out["y"].tolist() == [[2.5], [3.0], [4.5]]
    assert (out.model_name, out.model_version) == ("half_plus_two", "1")
    digits = server.infer("digits", {"input": _digits()}, outputs=["label", "probabilities"])
    assert digits["probabilities"].shape == (8, 10) and digits["label"].shape == (8, 1)
    assert digits["label"][:, 0].tolist() == digits["probabilities"].argmax(axis=1).tolist()
    only = server.infer("digits", {"input": _digits()[:2]}, outputs=["label"], version=1)
    assert list(only) == ["label"]


def test_a_python_model_an_ensemble_and_a_decoupled_model(server: inferd.Server) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert server.infer("scale", {"X": x})["Y"].tolist() == (x * 3).tolist()
    chain = server.infer("chain", {"IN": X}, request_id="c1")
    assert chain["OUT"].tolist() == [[3.25], [3.5], [4.25]] and chain.id == "c1"
    count = {"COUNT": np.array([4], np.int32)}
    streamed = list(server.infer_stream("countdown", count))
    assert [r["OUT"].tolist() for r in streamed] == [[3], [2], [1], [0]]
    assert [r.parameters["triton_final_response"] for r in streamed] == [False] * 4
    # Any model streams: one response.
    assert [r["y"].tolist() for r in server.infer_stream("half_plus_two", {"x": X[:1]})] == [
        [[2.5]]
    ]


def test_leaving_a_stream_early_cancels_nothing_else(server: inferd.Server) -> None:
    stream = server.infer_stream("countdown", {"COUNT": np.array([50], np.int32)})
    first = next(iter(stream))
    assert first["OUT"].tolist() == [49]
    stream.close()  # type: ignore[attr-defined]
    assert server.infer("half_plus_two", {"x": X})["y"].shape == (3, 1)


def test_the_index_metadata_readiness_and_statistics(server: inferd.Server) -> None:
    index = {(e.name, e.version): e.state for e in server.models()}
    assert index[("half_plus_two", "1")] == "READY" and index[("countdown", "1")] == "READY"
    assert index[("shared", "")] == "UNAVAILABLE"  # in the repository, not loaded
    assert {e.name for e in server.models(ready_only=True)} >= {"digits", "scale", "chain"}
    meta = server.model_metadata("digits")
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("input", "FP32", (-1, 64))]
    assert server.model_config("scale").max_batch_size == 16
    assert server.model_ready("chain") and server.ready
    assert server.metadata().name == "inferd"
    server.infer("mirror", {"INPUT0": np.ones((3, 2), np.float32)})
    (stats,) = server.statistics("mirror")
    assert stats.inference_count >= 3 and stats.execution_count >= 1


def test_errors_are_inferds_exceptions(server: inferd.Server) -> None:
    with pytest.raises(NotFound, match="nosuch"):
        server.infer("nosuch", {"x": X})
    with pytest.raises(InvalidInput, match="datatype FP64"):
        server.infer("half_plus_two", {"x": X.astype(np.float64)})
    with pytest.raises(InvalidInput, match="missing input 'x'"):
        server.infer("half_plus_two", {})
    with pytest.raises(InvalidInput, match="is decoupled"):
        server.infer("countdown", {"COUNT": np.array([1], np.int32)})
    with pytest.raises(InvalidInput, match="control mode is 'none'"):
        server.load("shared")
    with pytest.raises(inferd.InferdError):
        server.infer("half_plus_two", {"x": X}, outputs=["nope"])
    with pytest.raises(ConfigError, match="did you mean 'max_upload_bytes'"):
        inferd.Server(model_repository=".", max_upload_byte=1)


def test_no_copies_on_the_way_in_or_out(server: inferd.Server) -> None:
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = server.infer("mirror", {"INPUT0": rows})
    assert out["OUTPUT0"] is rows  # the model's output is the caller's array, untouched
    view = np.arange(16, dtype=np.float32).reshape(8, 2)[::2]  # not contiguous: still no copy
    assert np.shares_memory(server.infer("mirror", {"INPUT0": view})["OUTPUT0"], view)


def test_calls_from_many_threads_at_once(server: inferd.Server) -> None:
    answers: dict[int, list[float]] = {}

    def call(i: int) -> None:
        x = np.full((1, 1), i, np.float32)
        answers[i] = server.infer("half_plus_two", {"x": x})["y"][0].tolist()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {i: [0.5 * i + 2] for i in range(16)}


def test_load_and_unload_in_explicit_mode(repo: Path) -> None:
    with inferd.Server(
        model_repository=str(repo), model_control_mode="explicit", server_name="local"
    ) as server:
        assert server.models(ready_only=True) == []
        server.load("half_plus_two")
        assert server.infer("half_plus_two", {"x": X})["y"][0].tolist() == [2.5]
        server.load("chain")  # loads what it needs first
        assert server.model_ready("chain")
        assert server.unload("half_plus_two", unload_dependents=True) == ["chain", "half_plus_two"]
        with pytest.raises(Unavailable, match="unloaded"):
            server.infer("half_plus_two", {"x": X})
        config = {"backend": "echo", "max_batch_size": 4, "input": [
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}
        ]}  # fmt: skip
        server.load("inline", config, files={"1/.keep": b""})
        ints = np.array([[7]], np.int32)
        assert server.infer("inline", {"INPUT0": ints})["OUTPUT0"].tolist() == [[7]]
        assert server.metadata().name == "local"
    with pytest.raises(Unavailable, match="not running"):
        server.infer("half_plus_two", {"x": X})


def test_the_awaited_form(repo: Path) -> None:
    async def run() -> None:
        async with inferd.Server(
            model_repository=repo, model_control_mode="explicit", load_model=["half_plus_two"]
        ) as server:
            out = await server.async_infer("half_plus_two", {"x": X})
            assert out["y"].tolist() == [[2.5], [3.0], [4.5]]
            answers = await asyncio.gather(
                *(server.async_infer("half_plus_two", {"x": X * i}) for i in range(8))
            )
            assert [a["y"][2, 0] for a in answers] == [0.5 * 5 * i + 2 for i in range(8)]
            await server.async_load("scale")
            await server.async_load("countdown")
            await server.async_load("chain")
            x = np.ones((1, 3), np.float32)
            assert (await server.async_infer("scale", {"X": x}))["Y"].tolist() == [[3, 3, 3]]
            chain = await server.async_infer("chain", {"IN": X})
            assert chain["OUT"][0].tolist() == [3.25]
            count = {"COUNT": np.array([3], np.int32)}
            got = [r["OUT"][0] async for r in server.async_infer_stream("countdown", count)]
            assert got == [2, 1, 0]
            index = {e.name: e.state for e in await server.async_models(ready_only=True)}
            assert index == dict.fromkeys(["chain", "countdown", "half_plus_two", "scale"], "READY")
            assert (await server.async_model_metadata("scale")).inputs[0].shape == (-1, 3)
            assert server.model_ready("scale")  # plain: at once, on the loop
            with pytest.raises(RuntimeError, match="await the async_ form"):
                server.infer("half_plus_two", {"x": X})
            # A thread may still make blocking calls into the awaited server.
            y = await asyncio.to_thread(server.infer, "half_plus_two", {"x": X})
            assert y["y"].shape == (3, 1)
            assert await server.async_unload("scale") == ["scale"]
            with pytest.raises(Unavailable):
                await server.async_infer("scale", {"X": x})

    asyncio.run(run())


def test_start_without_waiting_then_stop(repo: Path) -> None:
    async def run() -> None:
        server = await inferd.Server(model_repository=repo, load_model=["digits"]).start(
            wait_for_models=False
        )
        while not server.ready:
            await asyncio.sleep(0.01)
        out = await server.async_infer("digits", {"input": _digits()})
        assert out["label"].shape == (8, 1)
        await server.stop()
        await server.stop()  # again: nothing to do
        with pytest.raises(Unavailable, match="not running"):
            await server.async_infer("digits", {"input": _digits()})
        with pytest.raises(RuntimeError, match="starts once"):
            await server.start()

    asyncio.run(run())

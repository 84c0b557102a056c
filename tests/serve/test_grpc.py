"""``flowrt serve`` over gRPC: KServe v2's GRPCInferenceService, driven by Triton's own
``tritonclient.grpc``, beside HTTP on the same models and queues."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import trio

from flowrt.serve.server import serve

tg = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("hypercorn")

from servemodels import _input, _reference, _repository  # noqa: E402

_BATCHED = "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n"


class _Grpc:
    """A server started in the test's trio loop with gRPC on a free port; the client's calls
    run in threads."""

    def __init__(self, server) -> None:
        self.server = server
        assert server.grpc_address is not None
        self.client = tg.InferenceServerClient(server.grpc_address)

    async def call(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def infer(self, model: str, x: np.ndarray, **kwargs) -> np.ndarray:
        tensor = tg.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = await self.call(self.client.infer, model, [tensor], **kwargs)
        return result.as_numpy("y")

    async def error(self, fn, *args, **kwargs) -> tuple[str, str]:
        """(status, message) of a call that must fail."""
        with pytest.raises(tg.InferenceServerException) as caught:
            await self.call(fn, *args, **kwargs)
        return caught.value.status(), caught.value.message()


async def _serving(nursery, repository, **kwargs) -> _Grpc:
    server, _ = await nursery.start(
        lambda task_status: serve(repository, http_port=0, grpc_port=0, task_status=task_status, **kwargs)
    )
    return _Grpc(server)


async def test_health_metadata_and_inference_over_grpc_match_cpuref(tmp_path):
    repository = _repository(tmp_path, {"plain": None, "batched": _BATCHED})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        client = served.client
        assert await served.call(client.is_server_live) and await served.call(client.is_server_ready)
        assert await served.call(client.is_model_ready, "plain")
        assert not await served.call(client.is_model_ready, "absent")
        meta = await served.call(client.get_server_metadata, as_json=True)
        assert meta["name"] == "flowrt" and "binary_tensor_data" in meta["extensions"]
        model = await served.call(client.get_model_metadata, "batched", as_json=True)
        assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "3", "16", "16"]}]
        config = await served.call(client.get_model_config, "batched", as_json=True)
        assert config["config"]["max_batch_size"] == 4
        x = _input()
        np.testing.assert_allclose(await served.infer("plain", x), await _reference(x), rtol=1e-4, atol=1e-5)
        x3 = _input(3, seed=2)
        np.testing.assert_allclose(
            await served.infer("batched", x3, priority=1), await _reference(x3), rtol=1e-4, atol=1e-5
        )
        # clients at once, over gRPC: each its own result, and they share batches
        results: dict[int, np.ndarray] = {}

        async def one(seed: int) -> None:
            results[seed] = await served.infer("batched", _input(seed=seed))

        async with trio.open_nursery() as clients:
            for seed in range(6):
                clients.start_soon(one, seed)
        for seed, got in results.items():
            np.testing.assert_allclose(got, await _reference(_input(seed=seed)), rtol=1e-4, atol=1e-5)
        sizes = served.server.models["batched"].batch_counts()
        assert sum(k * n for k, n in sizes.items()) == 9 and max(sizes) > 1
        shutdown.set()


async def test_grpc_errors_carry_the_status_and_the_problem_and_the_server_goes_on(tmp_path):
    repository = _repository(tmp_path, {"m": "max_batch_size: 2\n"})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown, max_body_bytes=1 << 20)
        x = _input()

        def request(shape=(1, 3, 16, 16), datatype="FP32", name="x", data=None):
            tensor = tg.InferInput(name, list(shape), datatype)
            tensor.set_data_from_numpy(
                data if data is not None else np.zeros(shape, tg.triton_to_np_dtype(datatype))
            )
            return [tensor]

        cases = [
            (("absent", request()), {}, "StatusCode.NOT_FOUND", "unknown model 'absent'"),
            (("m", request(datatype="FP64")), {}, "StatusCode.INVALID_ARGUMENT", "expected 'FP32'"),
            (("m", request(name="z")), {}, "StatusCode.INVALID_ARGUMENT", "unknown input 'z'"),
            (("m", request(shape=(3, 3, 16, 16))), {}, "StatusCode.INVALID_ARGUMENT", "max_batch_size"),
            (
                ("m", request()),
                {"outputs": [tg.InferRequestedOutput("nope")]},
                "StatusCode.INVALID_ARGUMENT",
                "unknown output 'nope'",
            ),
            (("m", request()), {"timeout": 5}, "StatusCode.INVALID_ARGUMENT", "timeout"),
            (("m", request(shape=(1, 3, 320, 320))), {}, "StatusCode.RESOURCE_EXHAUSTED", "larger than max"),
        ]
        for args, kwargs, status, words in cases:
            got, message = await served.error(served.client.infer, *args, **kwargs)
            assert got == status and words in message, (args, kwargs, got, message)
        assert served.server.metrics.requests.labels("m", "failure")._value.get() == 5
        np.testing.assert_allclose(await served.infer("m", x), await _reference(x), rtol=1e-4, atol=1e-5)
        shutdown.set()


async def test_a_stream_runs_its_requests_together_and_answers_each_its_errors_among_them(tmp_path):
    repository = _repository(tmp_path, {"m": _BATCHED})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        answers: queue.Queue = queue.Queue()

        def stream() -> None:
            client = served.client
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for seed in range(4):
                tensor = tg.InferInput("x", [1, 3, 16, 16], "FP32")
                tensor.set_data_from_numpy(_input(seed=seed))
                client.async_stream_infer("m", [tensor], request_id=str(seed))
            wrong = tg.InferInput("x", [1, 3, 8, 8], "FP32")
            wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
            client.async_stream_infer("m", [wrong], request_id="bad")
            client.stop_stream()  # returns once every request is answered

        await trio.to_thread.run_sync(stream)
        got = [answers.get_nowait() for _ in range(answers.qsize())]
        assert len(got) == 5
        results = {result.get_response().id: result for result, error in got if error is None}
        errors = [error for result, error in got if error is not None]
        assert sorted(results) == ["0", "1", "2", "3"] and len(errors) == 1
        assert "x" in errors[0].message() and "shape" in errors[0].message()
        for seed in range(4):
            want = await _reference(_input(seed=seed))
            np.testing.assert_allclose(results[str(seed)].as_numpy("y"), want, rtol=1e-4, atol=1e-5)
        # the stream's requests ran beside each other: they shared the dynamic batcher's batches
        assert max(served.server.models["m"].batch_counts()) > 1
        shutdown.set()


async def test_unload_and_load_over_grpc_and_the_index_follows(tmp_path):
    repository = _repository(tmp_path, {"good": None})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        client = served.client
        await served.call(client.unload_model, "good")
        assert not await served.call(client.is_model_ready, "good")
        index = await served.call(client.get_model_repository_index, as_json=True)
        assert index["models"][0]["name"] == "good" and index["models"][0]["state"] == "UNAVAILABLE"
        status, message = await served.error(client.unload_model, "good")
        assert status == "StatusCode.NOT_FOUND" and "not loaded" in message
        await served.call(client.load_model, "good")
        x = _input()
        np.testing.assert_allclose(await served.infer("good", x), await _reference(x), rtol=1e-4, atol=1e-5)
        shutdown.set()

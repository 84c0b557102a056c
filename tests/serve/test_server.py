"""``flowrt serve``: a model repository served over KServe v2, driven by Triton's own client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import trio

from flowrt.errors import InputError
from flowrt.serve.server import serve

th = pytest.importorskip("tritonclient.http")
pytest.importorskip("hypercorn")

from servemodels import _input, _net, _reference, _repository  # noqa: E402


class _Served:
    """A server started in the test's trio loop; the client calls run in threads."""

    def __init__(self, server, address: str) -> None:
        self.server, self.url = server, address.removeprefix("http://")

    def client(self):
        return th.InferenceServerClient(self.url)

    async def call(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args)

    async def infer(self, model: str, x: np.ndarray, binary: bool = True) -> np.ndarray:
        def go():
            tensor = th.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = [th.InferRequestedOutput("y", binary_data=binary)]
            return self.client().infer(model, [tensor], outputs=wanted).as_numpy("y")

        return await self.call(go)

    async def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
        return await self.call(self._post, path, body, headers)

    def _post(self, path: str, body: bytes, headers: dict | None) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://{self.url}{path}", data=body, headers=headers or {}, method="POST"
        )
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


async def _index(served: _Served) -> dict[str, dict]:
    """The repository index, by model name."""
    return {e["name"]: e for e in (await served.post("/v2/repository/index", b""))[1]}


async def _serving(nursery, repository: Path, **kwargs) -> _Served:
    server, address = await nursery.start(
        lambda task_status: serve(repository, http_port=0, task_status=task_status, **kwargs)
    )
    return _Served(server, address)


async def test_metadata_health_and_inference_match_cpuref(tmp_path):
    repository = _repository(
        tmp_path,
        {
            "plain": None,
            "batched": "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n",
        },
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        client = served.client()
        assert await served.call(client.is_server_live) and await served.call(client.is_server_ready)
        assert await served.call(client.is_model_ready, "plain")
        metadata = await served.call(client.get_model_metadata, "batched")
        assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
        plain = await served.call(client.get_model_metadata, "plain")
        assert plain["inputs"][0]["shape"] == [1, 3, 16, 16]
        # no instance_group: a pool per CPU worker, as rt.load gives
        assert served.server.models["plain"].model.pools.count == served.server.runtime.cpu_workers
        x = _input()
        want = await _reference(x)
        for binary in (True, False):
            np.testing.assert_allclose(await served.infer("plain", x, binary), want, rtol=1e-4, atol=1e-5)
        # a request of three rows on a model that batches: three rows back, each its own
        x3 = _input(3, seed=2)
        np.testing.assert_allclose(
            await served.infer("batched", x3), await _reference(x3), rtol=1e-4, atol=1e-5
        )
        # clients at once: each gets its own result
        results: dict[int, np.ndarray] = {}

        async def one(seed: int) -> None:
            results[seed] = await served.infer("batched", _input(seed=seed))

        async with trio.open_nursery() as clients:
            for seed in range(6):
                clients.start_soon(one, seed)
        for seed, got in results.items():
            np.testing.assert_allclose(got, await _reference(_input(seed=seed)), rtol=1e-4, atol=1e-5)
        index = await _index(served)
        assert {name: e["state"] for name, e in index.items()} == {"plain": "READY", "batched": "READY"}
        metrics = (
            await served.call(lambda: urllib.request.urlopen(f"http://{served.url}/metrics").read())
        ).decode()
        assert 'flowrt_requests_total{model="batched",outcome="success"} 7.0' in metrics
        assert "flowrt_queue_seconds_bucket" in metrics
        # the batches the stream formed hold every row once: 3 of one request, 6 clients at once
        sizes = served.server.models["batched"].batch_counts()
        assert sum(k * n for k, n in sizes.items()) == 9 and max(sizes) > 1
        assert f'flowrt_batch_size_count{{model="batched"}} {float(sum(sizes.values()))}' in metrics
        shutdown.set()


async def test_bad_requests_answer_4xx_naming_the_problem_and_the_server_goes_on(tmp_path):
    repository = _repository(tmp_path, {"m": "max_batch_size: 2\n"})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown, max_body_bytes=1 << 20)

        def request(inputs: list, **extra) -> bytes:
            return json.dumps({"inputs": inputs, **extra}).encode()

        good = {"name": "x", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.5] * 768}
        cases = [
            ("/v2/models/m/infer", b"{not json", 400, "does not parse"),
            ("/v2/models/m/infer", request([{**good, "shape": [1, 3, 8, 8]}]), 400, "values for shape"),
            ("/v2/models/m/infer", request([{**good, "shape": [1, 3, 8, 8], "data": [0.5] * 192}]), 400, "x"),
            ("/v2/models/m/infer", request([{**good, "datatype": "INT64"}]), 400, "expected 'FP32'"),
            ("/v2/models/m/infer", request([{**good, "name": "z"}]), 400, "unknown input 'z'"),
            ("/v2/models/m/infer", request([]), 400, "missing"),
            (
                "/v2/models/m/infer",
                request([{**good, "shape": [3, 3, 16, 16], "data": [0.5] * 2304}]),
                400,
                "max_batch_size",
            ),
            ("/v2/models/m/infer", request([good], outputs=[{"name": "nope"}]), 400, "unknown output 'nope'"),
            ("/v2/models/absent/infer", request([good]), 404, "unknown model 'absent'"),
            ("/v2/models/m/infer", b"x" * (48 << 20), 413, "limit"),
            ("/v2/nowhere", b"", 404, "no route"),
        ]
        for path, body, status, words in cases:
            got, payload = await served.post(path, body)
            assert got == status, (path, body[:80], payload)
            assert words in payload["error"], payload
        # binary data that does not match what the JSON announces
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1, 3, 16, 16],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 3072},
                    }
                ]
            }
        ).encode()
        got, payload = await served.post(
            "/v2/models/m/infer", head + b"\0" * 100, {"Inference-Header-Content-Length": str(len(head))}
        )
        assert got == 400 and "bytes of binary data announced" in payload["error"]
        x = _input()
        np.testing.assert_allclose(await served.infer("m", x), await _reference(x), rtol=1e-4, atol=1e-5)
        shutdown.set()


async def test_a_full_queue_answers_503_and_a_request_past_its_timeout_is_not_run(tmp_path):
    big = _net(size=96, channels=32)  # a run long enough for requests to queue behind it
    repository = _repository(
        tmp_path,
        {
            "bounded": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n",
            "hurried": "dynamic_batching { default_queue_policy { default_timeout_microseconds: 1 } }\n",
        },
        net=big,
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        x = _input(size=96)
        body = json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
                ]
            }
        ).encode()
        for name, words in (("bounded", "max_queue_size"), ("hurried", "without starting")):
            answers: list[tuple[int, dict]] = []

            async def one(path: str, into: list) -> None:
                into.append(await served.post(path, body))

            async with trio.open_nursery() as clients:
                for _ in range(8):
                    clients.start_soon(one, f"/v2/models/{name}/infer", answers)
            statuses = sorted(status for status, _ in answers)
            assert statuses[0] == 200 and statuses[-1] == 503, answers
            assert all(words in payload["error"] for status, payload in answers if status == 503)
            model = served.server.models[name]
            assert model.waiting == 0 and model._admitted.value == model.capacity
        want = await _reference(x, big)
        np.testing.assert_allclose(await served.infer("bounded", x), want, rtol=1e-4, atol=1e-4)
        shutdown.set()


async def test_a_bounded_load_with_bad_requests_leaves_every_pool_free(tmp_path):
    config = "max_batch_size: 4\ninstance_group [ { count: 2 } ]\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    repository = _repository(tmp_path, {"m": config})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        x = _input()
        want = await _reference(x)
        good = json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x.ravel().tolist()}
                ]
            }
        )
        bad = good.replace('"FP32"', '"FP64"')
        statuses: list[int] = []

        async def client(index: int) -> None:
            for i in range(10):
                wrong = (index * 10 + i) % 10 == 0  # one request in ten is bad
                status, payload = await served.post("/v2/models/m/infer", (bad if wrong else good).encode())
                statuses.append(status)
                if status == 200:
                    np.testing.assert_allclose(
                        np.reshape(payload["outputs"][0]["data"], want.shape), want, rtol=1e-4, atol=1e-5
                    )

        with trio.fail_after(120):
            async with trio.open_nursery() as clients:
                for index in range(8):
                    clients.start_soon(client, index)
        assert statuses.count(400) == 8 and statuses.count(200) == 72
        model = served.server.models["m"]
        assert model.model.pools.count == 2  # instance_group's count
        assert model._admitted.value == model.capacity and model.waiting == 0
        for loaded in (model.model, *model.model.batched_models.values()):
            assert loaded.pools.free_count == loaded.pools.count
        metrics = (
            await served.call(lambda: urllib.request.urlopen(f"http://{served.url}/metrics").read())
        ).decode()
        held = sum(m.pools.count for m in (model.model, *model.model.batched_models.values()))
        assert f'flowrt_pools{{model="m"}} {float(held)}' in metrics
        assert f'flowrt_pools_free{{model="m"}} {float(held)}' in metrics
        assert 'flowrt_requests_waiting{model="m"} 0.0' in metrics
        shutdown.set()


async def test_a_config_flowrt_does_not_take_leaves_that_model_out_and_the_others_served(tmp_path):
    repository = _repository(tmp_path, {"good": None, "odd": "sequence_batching { }\n"})
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        index = await _index(served)
        assert index["good"]["state"] == "READY"
        assert index["odd"]["state"] == "UNAVAILABLE" and "sequence_batching" in index["odd"]["reason"]
        assert not await served.call(served.client().is_model_ready, "odd")
        # unloaded and loaded again through the repository API
        assert (await served.post("/v2/repository/models/good/unload", b""))[0] == 200
        assert not await served.call(served.client().is_model_ready, "good")
        assert (await served.post("/v2/repository/models/good/load", b""))[0] == 200
        x = _input()
        np.testing.assert_allclose(await served.infer("good", x), await _reference(x), rtol=1e-4, atol=1e-5)
        shutdown.set()


_ENSEMBLE = """
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1, 3, 16, 16 ] } ]
output [ { name: "FIRST" data_type: TYPE_FP32 dims: [ 1, 8, 1, 1 ] }, { name: "SECOND" data_type: TYPE_FP32 dims: [ 1, 8, 1, 1 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "FIRST" } },
  { model_name: "b" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "SECOND" } }
] }
"""


async def test_an_ensemble_runs_its_steps_models_and_an_ensemble_that_does_not_hold_together_is_refused(
    tmp_path,
):
    repository = _repository(tmp_path, {"a": None, "b": "max_batch_size: 2\ndynamic_batching { }\n"})
    (repository / "pair" / "1").mkdir(parents=True)
    (repository / "pair" / "config.pbtxt").write_text(_ENSEMBLE)
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "config.pbtxt").write_text(
        _ENSEMBLE.replace('value: "SECOND"', 'value: "OTHER"')
    )
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        served = await _serving(nursery, repository, shutdown=shutdown)
        index = await _index(served)
        assert index["pair"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE" and "SECOND" in index["broken"]["reason"]
        metadata = await served.call(served.client().get_model_metadata, "pair")
        assert [t["name"] for t in metadata["inputs"]] == ["IN"]
        x = _input()

        def go():
            tensor = th.InferInput("IN", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = served.client().infer("pair", [tensor])
            return result.as_numpy("FIRST"), result.as_numpy("SECOND")

        first, second = await served.call(go)
        want = await _reference(x)
        np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(second, want, rtol=1e-4, atol=1e-5)
        # a member unloaded: the ensemble's requests fail naming it, and the server goes on
        assert (await served.post("/v2/repository/models/b/unload", b""))[0] == 200
        body = json.dumps(
            {
                "inputs": [
                    {"name": "IN", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x.ravel().tolist()}
                ]
            }
        ).encode()
        status, payload = await served.post("/v2/models/pair/infer", body)
        assert status == 503 and "unknown model 'b'" in payload["error"]
        shutdown.set()


async def test_a_repository_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(InputError, match="not a directory"):
        await serve(tmp_path / "absent", http_port=0)


def test_the_command_serves_until_sigterm_and_exits_0(tmp_path):
    repository = _repository(tmp_path, {"m": None})
    process = subprocess.Popen(
        [sys.executable, "-m", "flowrt", "serve", str(repository), "--http-port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "1 model(s) (m) at http://127.0.0.1:" in line and ", gRPC at 127.0.0.1:" in line, line
        url, grpc_address = line.split(" at http://", 1)[1].strip().split(", gRPC at ")
        client = th.InferenceServerClient(url)
        deadline = time.monotonic() + 30
        while not client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        x = _input()
        tensor = th.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer("m", [tensor]).as_numpy("y")
        want = trio.run(_reference, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        tg = pytest.importorskip("tritonclient.grpc")
        over_grpc = tg.InferInput("x", list(x.shape), "FP32")
        over_grpc.set_data_from_numpy(x)
        got = tg.InferenceServerClient(grpc_address).infer("m", [over_grpc]).as_numpy("y")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("which", ["--http-port", "--grpc-port"])
def test_a_port_in_use_is_a_clear_error_not_a_trace(tmp_path, which):
    import socket

    repository = _repository(tmp_path, {"m": None})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--http-port": "0", "--grpc-port": "0", which: port}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowrt",
                "serve",
                str(repository),
                *[x for kv in ports.items() for x in kv],
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr[-2000:]
    protocol = "HTTP" if which == "--http-port" else "gRPC"
    assert f"cannot listen for {protocol} on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
